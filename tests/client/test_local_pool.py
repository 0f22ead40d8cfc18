"""The party's local Paillier pool starts at its first task, not at Join (issue 45, client/workers.py).

A hostile coordinator made an agent join 20 runs at once, each starting its process pool at Join
(23 processes of 0.5-1 GB). A pool now costs nothing until a Paillier task is submitted."""

from __future__ import annotations

import operator

import pytest

from xclp.client.workers import LocalPool, WorkerSpec, make_executor, worker_count


def test_the_pool_starts_no_process_until_its_first_task_and_none_after_shutdown() -> None:
    pool = make_executor(WorkerSpec(processes=2))
    assert isinstance(pool, LocalPool) and not pool.started and worker_count(pool) == 2
    assert pool.submit(operator.pow, 2, 10).result(timeout=60) == 1024
    assert pool.started
    processes = list(pool._pool._processes.values())  # type: ignore[union-attr]
    pool.shutdown(wait=True)
    assert processes and not any(p.is_alive() for p in processes)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(operator.pow, 2, 2)


def test_a_pool_never_used_shuts_down_without_starting() -> None:
    pool = make_executor(WorkerSpec(processes=3))
    assert isinstance(pool, LocalPool)
    pool.shutdown(cancel_futures=True)
    assert not pool.started
