"""A party's Paillier work on the institution's own Dask cluster (docs/design.md §10.4, xclp/workers.py):
a real `dask scheduler` and two `dask worker` processes over mutual TLS, with certificates from a
CA of the test's own (an institution's). An in-process coordinator and three party sessions run
XCLP (512-bit test keys) where party a sends its Paillier tasks to the cluster: its scores equal
the plaintext reference's (what the process-pool run gives: tests/service), with a worker killed
mid-SecureHamming too; a scheduler that does not answer, or does not speak TLS, refuses the job
before Join."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import CancelledError

import numpy as np
import pytest

from tests.dask_cluster import Cluster, cluster
from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from tests.oracles.party_view import party_view
from xclp import workers as workers_module
from xclp.client.policy import PartyPolicy
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.pool import SHARED_BYTES, run_tasks
from xclp.errors import ConfigError
from xclp.graph import GraphParams
from xclp.reference import xclp_reference
from xclp.workers import DaskWorkers, WorkersLost, WorkerSpec

dask = pytest.importorskip("dask")
pytest.importorskip("distributed")

L, C = 64, 3
PARAMS = {"n_classes": C, "lsh_bits": L, "k": 5, "key_bits": 512, "insecure_test_keys": True}
def xclp_run(keys, workers: WorkerSpec, progress: dict[str, list[str]] | None = None, *, only_a: bool = False):
    """XCLP among a, b and c (or a alone, to see it refuse), a's Paillier work on `workers`; the
    data, each party's JobResult or exception, and the parties the coordinator saw join."""
    datas = {p: party_data(90 + i, n=80) for i, p in enumerate("a" if only_a else PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in datas}
    with coordinator(allow_list(keys), [job("x", "xclp", PARAMS)]) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier, progress=progress,
                              overrides={"a": {"workers": workers}},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        joined = set(coord.jobs["x"].parties)
    return datas, results, joined


def assert_reference(datas, results) -> None:
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in PARTIES], results["a"].seed, C, L, GraphParams(k=5))
    for j, p in enumerate(PARTIES):
        labels, _, scores = party_view(ref.scores[ref.party_rows(j)], datas[p].y, C)
        np.testing.assert_allclose(results[p].aggregate, scores, rtol=0, atol=1e-6)
        assert np.array_equal(results[p].aggregate.argmax(axis=1), labels)


def paillier_tasks(address: str) -> set[str]:
    """The kinds of task the scheduler has seen (their functions' names)."""
    with DaskWorkers.connect(address) as w:
        return set(w.client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes)))


def kill_at_third_task(monkeypatch, victim: subprocess.Popen) -> list[int]:
    """Party a's cluster kills `victim` (SIGKILL to its process group) as a submits its third
    Paillier task, with tasks queued and running; the list gets the victim's exit status."""
    killed: list[int] = []

    class Killing(DaskWorkers):
        submitted = 0

        def submit(self, fn, /, *args, **kwargs):
            future = super().submit(fn, *args, **kwargs)
            Killing.submitted += 1
            if Killing.submitted == 3:
                os.killpg(victim.pid, signal.SIGKILL)
                killed.append(victim.wait(30))
            return future

    monkeypatch.setattr(workers_module, "DaskWorkers", Killing)
    return killed


def test_a_party_on_its_own_dask_cluster_over_tls_gets_the_reference_scores(keys, tmp_path) -> None:
    progress: dict[str, list[str]] = {}
    with cluster(tmp_path) as running:
        datas, results, _ = xclp_run(keys, WorkerSpec(scheduler=running.address), progress)
        seen = paillier_tasks(running.address)
    assert_reference(datas, results)
    # a's own work ran there, as A (encrypt, decrypt) or B (evaluate) of its pairs; Dask names tasks
    # by their function, less the leading underscore
    assert {"encrypt_batch", "decrypt_chunk"} <= seen or "evaluate_batch" in seen, seen
    said = [line for line in progress["a"] if "Dask scheduler" in line]
    assert said == [f"Paillier work on the Dask scheduler {running.address}: 2 workers, 2 threads"]
    # the before-work estimate counts the cluster's threads (docs/design.md §10.5)
    assert any(line.startswith("estimated Paillier work: ") and " on 2 workers " in line for line in progress["a"])


def test_a_worker_killed_mid_secure_hamming_is_survived_by_daskss_retry(keys, tmp_path, monkeypatch) -> None:
    """The third Paillier task party a submits kills one of the two workers (SIGKILL, no nanny to
    restart it), while tasks are queued and running on it: Dask reschedules them on the other."""
    with cluster(tmp_path) as running:
        killed = kill_at_third_task(monkeypatch, running.workers[0])
        datas, results, _ = xclp_run(keys, WorkerSpec(scheduler=running.address))
        with DaskWorkers.connect(running.address) as w:
            left = len(w.client.nthreads())
    assert killed == [-signal.SIGKILL] and left == 1
    assert_reference(datas, results)


def test_a_lost_scheduler_fails_the_partys_step_and_the_others_finish_without_it(keys, tmp_path, monkeypatch) -> None:
    """The scheduler is killed at party a's third Paillier task: a's step fails with WorkersLost
    naming the scheduler (within the client's reconnect timeout), the coordinator drops a, and b
    and c finish SecureHamming among themselves (docs/design.md §5's dropout rules)."""
    monkeypatch.setattr(workers_module, "CONNECT_SECONDS", 3.0)
    with cluster(tmp_path) as running:
        kill_at_third_task(monkeypatch, running.procs[0])  # the scheduler
        datas, results, _ = xclp_run(keys, WorkerSpec(scheduler=running.address))
    assert isinstance(results["a"], WorkersLost), results["a"]
    assert f"on the Dask scheduler {running.address} failed" in str(results["a"])
    assert all(not isinstance(results[p], BaseException) for p in "bc"), results
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in "bc"], results["b"].seed, C, L, GraphParams(k=5))
    for j, p in enumerate("bc"):
        _, _, scores = party_view(ref.scores[ref.party_rows(j)], datas[p].y, C)
        np.testing.assert_allclose(results[p].aggregate, scores, rtol=0, atol=1e-6)


def test_a_large_argument_several_tasks_take_goes_to_the_cluster_once(tmp_path) -> None:
    big, small = b"x" * SHARED_BYTES, b"y" * (SHARED_BYTES - 1)
    with cluster(tmp_path, workers=1) as running, DaskWorkers.connect(running.address) as w:
        assert run_tasks(len, [(big,), (big,), (small,), (small,), (b"z" * SHARED_BYTES,)], w) == \
            [SHARED_BYTES, SHARED_BYTES, SHARED_BYTES - 1, SHARED_BYTES - 1, SHARED_BYTES]
        held = w.client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.task_prefixes["hold"].states)
    assert sum(held.values()) == 1  # big only: small is under the size, the last is taken once


def test_abandoned_work_fails_at_once_and_the_cluster_drops_it(tmp_path) -> None:
    """A later SecureHamming attempt began (client/phases/secure_hamming.py `superseded`): as the
    local pool does, the cluster's tasks for the dead attempt are abandoned. Each fails here at once
    with CancelledError (what the party takes for "work of a dead attempt"), the scheduler forgets
    them (a task a worker runs cannot be interrupted and finishes unread), and the next task is
    served. Before, a party on a cluster waited for every task of the dead attempt to finish."""
    with cluster(tmp_path, workers=1) as running, DaskWorkers.connect(running.address) as w:
        futures = [w.submit(time.sleep, 15) for _ in range(w.threads() + 3)]  # some run, the rest wait
        began = time.monotonic()
        assert w.abandon()
        for future in futures:
            with pytest.raises(CancelledError, match="a later attempt began"):
                future.result(timeout=5)
        assert time.monotonic() - began < 5 and not w.abandon()  # nothing left to abandon

        def sleeping() -> int:
            return int(w.client.run_on_scheduler(
                lambda dask_scheduler: sum(1 for key in dask_scheduler.tasks if str(key).startswith("sleep"))))

        # the sleeps a worker runs may stay known until they end (15 s); the queued ones, not dropped,
        # would run one after another for 15 s each, past this deadline
        # (the scheduler may forget the running sleep at the cancel and hear of it again from its worker,
        # so the count must stay at 0 for a second, not touch it once)
        deadline, zero_since = began + 25, None
        while time.monotonic() < deadline:
            if sleeping():
                zero_since = None
            elif zero_since is None:
                zero_since = time.monotonic()
            elif time.monotonic() - zero_since > 1.0:
                break
            time.sleep(0.1)
        assert sleeping() == 0
        assert w.submit(abs, -3).result(timeout=40) == 3


def test_a_scheduler_that_does_not_answer_refuses_the_job_before_join(keys, tmp_path, monkeypatch) -> None:
    import socket

    monkeypatch.setattr(workers_module, "CONNECT_SECONDS", 3.0)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tls://127.0.0.1:{port}"
    with dask.config.set(Cluster(tmp_path).client_config()):
        _, results, joined = xclp_run(keys, WorkerSpec(scheduler=address), only_a=True)
    assert isinstance(results["a"], ConfigError), results["a"]
    assert f"--workers {address}: the Dask scheduler did not answer within 3 s" in str(results["a"])
    assert joined == set()  # refused before Join


def test_a_scheduler_that_does_not_speak_tls_is_refused_before_join(keys, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(workers_module, "CONNECT_SECONDS", 3.0)
    with cluster(tmp_path, workers=0, protocol="tcp") as plain:
        address = plain.address.replace("tcp://", "tls://")
        _, results, joined = xclp_run(keys, WorkerSpec(scheduler=address), only_a=True)
    assert isinstance(results["a"], ConfigError), results["a"]
    assert f"--workers {address}: the Dask scheduler did not answer within 3 s" in str(results["a"])
    assert "does it speak tls" in str(results["a"])
    assert joined == set()


def test_workers_are_a_number_or_a_tls_scheduler_and_tcp_only_when_told() -> None:
    assert WorkerSpec.parse(None) == WorkerSpec() and WorkerSpec.parse("3") == WorkerSpec(processes=3)
    assert WorkerSpec.parse(0) == WorkerSpec(processes=0)
    assert WorkerSpec.parse("tls://dask.internal:8786").scheduler == "tls://dask.internal:8786"
    with pytest.raises(ConfigError, match="tcp:// sends them in the clear; use tls://"):
        WorkerSpec.parse("tcp://dask.internal:8786")
    assert WorkerSpec.parse("tcp://dask.internal:8786", insecure=True).scheduler == "tcp://dask.internal:8786"
    for bad in ("-1", "many", "http://dask:8786", "tls://", "dask.internal:8786"):
        with pytest.raises(ConfigError, match="a number of local processes or a Dask scheduler address"):
            WorkerSpec.parse(bad)


def test_tls_without_the_dask_configuration_is_refused_with_what_to_set(monkeypatch) -> None:
    with dask.config.set({"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None,
                          "distributed.comm.tls.client.key": None}), \
            pytest.raises(ConfigError, match="DASK_DISTRIBUTED__COMM__TLS__CA_FILE"):
        DaskWorkers.connect("tls://127.0.0.1:1")
