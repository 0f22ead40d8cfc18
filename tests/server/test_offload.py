"""The coordinator's influence solve on the operator's Dask cluster (server/offload.py, docs/design.md
§10.8): a real `dask scheduler` and two `dask worker` processes (plain tcp on 127.0.0.1; the TLS
handshake is xclp/workers.py's, tested in tests/client/test_dask_workers.py). Each block of
columns comes back bit for bit as the coordinator's own solver gives it, for the push, the sparse
LU and conjugate gradients; blocks for a receiver that is gone are skipped; a cluster lost
mid-solve costs no block (the coordinator solves the rest); a block that fails for its own reason
fails as it would on the coordinator; the workers drop the run's solver when it ends."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from tests.dask_cluster import cluster
from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from tests.helpers import knn_graph
from tests.oracles.party_view import party_view
from xclp import workers as workers_module
from xclp.client.policy import PartyPolicy
from xclp.crypto.paillier import PaillierKeypair
from xclp.errors import InvalidInput
from xclp.graph import GraphParams
from xclp.reference import xclp_reference
from xclp.server import offload
from xclp.server.offload import ClusterSolver, InfluenceProblem
from xclp.workers import DaskWorkers

dask = pytest.importorskip("dask")
pytest.importorskip("distributed")

ALPHA = 0.99


def blocks(columns: np.ndarray, size: int) -> list[np.ndarray]:
    return [columns[at : at + size] for at in range(0, columns.size, size)]


def same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("indptr", "indices", "values", "dropped"))


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    with cluster(tmp_path_factory.mktemp("dask"), workers=2, protocol="tcp") as running, \
            DaskWorkers.connect(running.address, work="the XCLP influence solve") as connected:
        yield running, connected


@pytest.mark.parametrize("problem", [
    InfluenceProblem(knn_graph(600), ALPHA, tolerance=1e-4),
    InfluenceProblem(knn_graph(600), ALPHA, "sparse"),
    InfluenceProblem(knn_graph(600), ALPHA, "cg"),
], ids=["push", "sparse-lu", "cg"])
def test_the_cluster_solves_every_block_bit_for_bit_as_the_coordinator(workers, problem) -> None:
    _, connected = workers
    planned = blocks(np.random.default_rng(1).choice(600, 70, replace=False), 16)
    here = problem.solver()
    solver = ClusterSolver(connected, problem, planned, ahead=2)
    try:
        for columns in planned:
            assert same(solver.solve(columns), here.solve(columns))
    finally:
        solver.close()
    stats = solver.stats
    assert (stats.method, stats.columns, stats.blocks, stats.nonzeros) == \
        (here.stats.method, 70, len(planned), here.stats.nonzeros)
    assert stats.dropped_max == here.stats.dropped_max and stats.max_residual == pytest.approx(
        here.stats.max_residual, rel=0, abs=1e-15)


def test_blocks_of_a_receiver_that_is_gone_are_skipped_in_order(workers) -> None:
    _, connected = workers
    problem = InfluenceProblem(knn_graph(400), ALPHA, tolerance=1e-3)
    planned = blocks(np.arange(0, 120, 3), 8)  # 5 blocks
    solver = ClusterSolver(connected, problem, planned, ahead=3)
    try:
        assert same(solver.solve(planned[0]), problem.solver().solve(planned[0]))
        assert same(solver.solve(planned[3]), problem.solver().solve(planned[3]))  # 1 and 2: a receiver gone
        with pytest.raises(ValueError, match="not planned"):
            solver.solve(planned[1])
    finally:
        solver.close()


def test_a_block_that_fails_for_its_own_reason_fails_as_on_the_coordinator(workers) -> None:
    _, connected = workers
    problem = InfluenceProblem(knn_graph(300), 1.0, "sparse")  # no α of 1: (I − 𝒲) is singular
    with pytest.raises(InvalidInput, match="alpha must be strictly between 0 and 1"):
        problem.solver()
    solver = ClusterSolver(connected, problem, [np.arange(4)])
    with pytest.raises(InvalidInput, match="alpha must be strictly between 0 and 1"):
        solver.solve(np.arange(4))


def test_the_solve_stops_waiting_when_the_run_is_over(workers) -> None:
    _, connected = workers
    problem = InfluenceProblem(knn_graph(300), ALPHA, tolerance=1e-3)
    solver = ClusterSolver(connected, problem, [np.arange(4)], live=lambda: False)
    assert solver.solve(np.arange(4)) is None


def test_the_workers_drop_the_runs_solver_when_it_ends(workers) -> None:
    _, connected = workers
    problem = InfluenceProblem(knn_graph(300), ALPHA, tolerance=1e-3)
    solver = ClusterSolver(connected, problem, [np.arange(4)])

    def kept(key: str) -> dict[str, bool]:
        return connected.client.run(lambda: key in offload._built)

    solver.solve(np.arange(4))
    assert any(kept(solver.key).values())
    solver.close()
    assert not any(kept(solver.key).values())


@pytest.mark.parametrize("lost", ["every worker", "the scheduler", "the scheduler before the solve"])
def test_a_cluster_lost_mid_solve_costs_no_block(tmp_path, monkeypatch, caplog, lost) -> None:
    monkeypatch.setattr(offload, "WORKERLESS_SECONDS", 0.5)
    monkeypatch.setattr(workers_module, "THREADS_SECONDS", 0.0)  # the solver asks the scheduler itself
    problem = InfluenceProblem(knn_graph(600), ALPHA, "cg")
    planned = blocks(np.arange(0, 600, 7), 10)
    here = problem.solver()
    # the client tries to reach a lost scheduler again for as long as it waited to connect (20 s)
    with cluster(tmp_path, workers=1, protocol="tcp") as running, \
            DaskWorkers.connect(running.address, timeout=2.0) as connected:

        def kill() -> None:  # with every worker gone, Dask would hold the next blocks for good
            for proc in running.workers if lost == "every worker" else running.procs[:1]:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)

        if lost == "the scheduler before the solve":
            kill()
        solver = ClusterSolver(connected, problem, planned, ahead=None if "before" in lost else 1)
        assert same(solver.solve(planned[0]), here.solve(planned[0]))
        if "before" not in lost:
            kill()
        for columns in planned[1:]:
            assert same(solver.solve(columns), here.solve(columns))
        solver.close()
    assert solver.stats.columns == sum(c.size for c in planned)
    assert "the influence solve's Dask cluster is lost" in caplog.text
    assert solver.describe().endswith("then on the coordinator (the cluster was lost)")


def blocks_solved(connected: DaskWorkers) -> int:
    """How many `solve_block` tasks the scheduler has seen finish."""
    def count(dask_scheduler) -> int:
        prefix = dask_scheduler.task_prefixes.get("solve_block")
        return 0 if prefix is None else int(prefix.state_counts["memory"])  # transitions into memory
    return connected.client.run_on_scheduler(count)


@pytest.mark.parametrize("tolerance", [0.0, 1e-3], ids=["exact", "push"])
def test_through_the_service_every_partys_scores_equal_the_reference(workers, keys, caplog, tolerance) -> None:
    _, connected = workers
    C, L = 3, 64
    params = {"n_classes": C, "lsh_bits": L, "k": 5, "key_bits": 512, "insecure_test_keys": True,
              "influence_tolerance": tolerance}
    datas = {p: party_data(70 + i, n=60) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    before = blocks_solved(connected)
    with caplog.at_level("INFO", logger="xclp.server"), \
            coordinator(allow_list(keys), [job("x", "xclp", params)], offload=connected) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
        summary = coord.jobs["x"].job.summary()["influence"]
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    assert blocks_solved(connected) - before == summary["blocks"] > 0
    assert f"on the Dask scheduler {connected.address}" in caplog.text
    assert summary["columns"] == sum(int((datas[p].y >= 0).sum()) for p in PARTIES)
    ref = xclp_reference([(datas[p].X, datas[p].y) for p in PARTIES], results["a"].seed, C, L, GraphParams(k=5),
                         influence_tolerance=tolerance)
    for j, p in enumerate(PARTIES):
        labels, _, scores = party_view(ref.scores[ref.party_rows(j)], datas[p].y, C)
        np.testing.assert_allclose(results[p].aggregate, scores, rtol=0, atol=1e-6)
        assert np.array_equal(results[p].aggregate.argmax(axis=1), labels)


@pytest.mark.parametrize("flags, says", [
    (["--workers", "4"], "--workers 4: give a Dask scheduler address, tls://host:port; the coordinator's own solve "
                         "already uses this machine's cores"),
    (["--workers", "tcp://127.0.0.1:1"], "--workers tcp://127.0.0.1:1: the influence solve's tasks carry the graph "
                                         "the coordinator learned, and tcp:// sends them in the clear"),
    (["--workers", "tls://127.0.0.1:1"], "--workers tls://127.0.0.1:1: mutual TLS needs Dask's "
                                         "distributed.comm.tls.ca-file"),
    (["--workers", "tcp://127.0.0.1:1", "--insecure-workers"], "--workers tcp://127.0.0.1:1: the Dask scheduler did "
                                                              "not answer within 1 s"),
])
def test_serve_refuses_a_cluster_it_cannot_use_before_it_listens(tmp_path, monkeypatch, capsys, flags, says) -> None:
    from xclp.server.cli import main

    monkeypatch.setattr(workers_module, "CONNECT_SECONDS", 1.0)
    port_file = tmp_path / "port"
    with dask.config.set(dict.fromkeys(workers_module.TLS_KEYS)):  # no certificate settings in this process
        code = main(["serve", "--allow-list", str(tmp_path / "allow.toml"), "--insecure", "--listen", "127.0.0.1:0",
                     "--port-file", str(port_file), *flags])
    assert code == 2 and says in capsys.readouterr().err
    assert not port_file.exists()
