"""The party's local Paillier pool starts at its first task, not at Join (xclp/workers.py).

A hostile coordinator made an agent join 20 runs at once, each starting its process pool at Join
(23 processes of 0.5-1 GB). A pool now costs nothing until a Paillier task is submitted."""

from __future__ import annotations

import contextlib
import operator
import threading
import time

import pytest

from xclp.workers import LocalPool, WorkerSpec, make_executor, worker_count


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


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_pool_stopped_while_its_first_task_starts_its_workers_ends_every_worker_now() -> None:
    """An agent stopped (SIGTERM, `docker stop`) just as a run's first Paillier task starts the pool:
    the stop came between the pool's creation and the launch of its processes, so the processes
    launched after it were never ended, and the agent's exit waited for their task to finish
    (minutes at 2048 bits; docker's grace is 10 s: exit 137). Every worker ends at once now."""
    for _ in range(3):
        pool = LocalPool(2)
        def submit(pool: LocalPool = pool) -> None:
            with contextlib.suppress(RuntimeError):  # "shut down": the stop came first
                for _ in range(4):
                    pool.submit(spin, 120.0)

        submitting = threading.Thread(target=submit)
        submitting.start()
        try:
            pool.shutdown(wait=False, cancel_futures=True)  # from another thread, as the agent does
        finally:
            submitting.join(30)
        pending = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon
                   and t is not submitting]
        for t in pending:  # the pool's manager thread, which the interpreter joins at exit
            t.join(30)
        assert not any(t.is_alive() for t in pending), "a worker went on with its 120 s task after the stop"


def test_abandoned_work_ends_now_and_the_next_task_gets_a_new_pool() -> None:
    """A later attempt began while this party's tasks ran (LocalPool.abandon): they fail at once,
    their workers are gone, and the pool serves the next attempt's tasks with new ones."""
    from concurrent.futures import CancelledError
    from concurrent.futures.process import BrokenProcessPool

    pool = LocalPool(2)
    try:
        assert not pool.abandon()  # nothing in flight: nothing ended
        busy = [pool.submit(spin, 60) for _ in range(3)]  # two running, one queued
        time.sleep(1.0)
        old = list(pool._pool._processes.values())  # type: ignore[union-attr]
        started = time.monotonic()
        assert pool.abandon()
        for future in busy:
            with pytest.raises((BrokenProcessPool, CancelledError)):
                future.result(timeout=30)
        assert time.monotonic() - started < 30  # not the 60 s the tasks would take
        for process in old:
            process.join(10)
        assert not any(p.is_alive() for p in old)
        assert pool.submit(operator.pow, 3, 3).result(timeout=60) == 27
        assert not pool.abandon()  # done: nothing in flight
    finally:
        pool.shutdown(cancel_futures=True)


def _interrupted() -> int:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in the party's terminal sends every process of it
    return 7


def test_ctrl_c_is_the_partys_to_handle_not_its_workers(capfd) -> None:
    """A worker that gets SIGINT goes on (the party ends it): before, each worker died with a bare
    "Process ForkServerProcess-1:" traceback on the terminal, and the pool broke."""
    pool = make_executor(WorkerSpec(processes=1))
    try:
        try:
            assert pool.submit(_interrupted).result(timeout=60) == 7
        except KeyboardInterrupt:  # the worker's own, sent back as the task's error
            pytest.fail("the pool worker took the Ctrl-C meant for the party")
    finally:
        pool.shutdown(wait=True)
    assert "ForkServerProcess" not in capfd.readouterr().err
