"""The operator's Admin API and the agents' Offers, attacked as a caller would: forged, replayed,
re-targeted and stale signed calls; and runs queued, opened and cancelled at runtime."""

from __future__ import annotations

import grpc
import pytest

from tests.harness import PARTIES, allow_list, coordinator, party_data, run_parties
from xclp import errors
from xclp.crypto import identity
from xclp.server.admin import build_admin_server
from xclp.server.store import StateStore
from xclp.v1 import calls
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc

FLYNN_TOML = ('job_id = "{id}"\ntype = "flynn"\nexpected_parties = {parties}\nmin_parties = 2\ndataset = "demo"\n'
              '[deadlines]\njoin_seconds = {join}\n[params]\nn_classes = 3\nm = 128\ns = 2\nrho = 8\n')


def flynn(job_id: str, parties=PARTIES, join: float = 30) -> str:
    return FLYNN_TOML.format(id=job_id, parties=list(parties), join=join).replace("'", '"')


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def verifier(keys, clock=None, store=None):
    store = store or StateStore()
    return calls.CallVerifier({"alice": identity.public_bytes(keys["a"])}, store.remember_nonce,
                              clock=clock or Clock(), who="operator")


def test_a_signed_call_opens_once_for_its_method_within_the_window(keys):
    clock = Clock()
    check = verifier(keys, clock)
    signed = calls.sign_call(keys["a"], "alice", calls.ADMIN_SHOW, pb.ShowRequest(run_id="7"), clock=clock)
    body = pb.ShowRequest()
    assert check.open(signed, calls.ADMIN_SHOW, body) == "alice" and body.run_id == "7"
    with pytest.raises(errors.ReplayRefused, match="nonce was used before"):
        check.open(signed, calls.ADMIN_SHOW, pb.ShowRequest())
    # a List the operator signed cannot be replayed as a Cancel
    listed = calls.sign_call(keys["a"], "alice", calls.ADMIN_LIST, pb.ListRequest(), clock=clock)
    with pytest.raises(errors.InvalidSignature, match="signed for '/xclp.v1.Admin/List'"):
        check.open(listed, calls.ADMIN_CANCEL, pb.CancelRequest())
    for skew in (-301, 301):  # recorded long ago, or dated ahead to outlive the nonce memory
        stale = calls.sign_call(keys["a"], "alice", calls.ADMIN_SHOW, pb.ShowRequest(),
                                clock=lambda skew=skew: clock.now + skew)
        with pytest.raises(errors.ReplayRefused, match="from the coordinator's clock"):
            check.open(stale, calls.ADMIN_SHOW, pb.ShowRequest())


def test_forged_tampered_and_unknown_signers_are_refused(keys):
    check = verifier(keys)
    clock = check.clock
    forged = calls.sign_call(keys["mallory"], "alice", calls.ADMIN_SUBMIT, pb.SubmitRequest(), clock=clock)
    with pytest.raises(errors.InvalidSignature, match="known to this coordinator for operator 'alice'"):
        check.open(forged, calls.ADMIN_SUBMIT, pb.SubmitRequest())
    good = calls.sign_call(keys["a"], "alice", calls.ADMIN_CANCEL, pb.CancelRequest(run_id="1"), clock=clock)
    call = pb.Call.FromString(good.call)
    call.body = pb.CancelRequest(run_id="2").SerializeToString()  # another run, same signature
    tampered = pb.SignedCall(signer="alice", call=call.SerializeToString(), signature=good.signature)
    with pytest.raises(errors.InvalidSignature):
        check.open(tampered, calls.ADMIN_CANCEL, pb.CancelRequest())
    unknown = calls.sign_call(keys["mallory"], "mallory", calls.ADMIN_LIST, pb.ListRequest(), clock=clock)
    with pytest.raises(errors.InvalidSignature, match=r"for operator 'mallory' \(an unknown operator, or another key"):
        check.open(unknown, calls.ADMIN_LIST, pb.ListRequest())


def test_nonces_outlive_a_restart(tmp_path, keys):
    clock = Clock()
    signed = calls.sign_call(keys["a"], "alice", calls.ADMIN_LIST, pb.ListRequest(), clock=clock)
    assert verifier(keys, clock, StateStore(tmp_path / "s.db")).open(signed, calls.ADMIN_LIST, pb.ListRequest())
    with pytest.raises(errors.ReplayRefused):
        verifier(keys, clock, StateStore(tmp_path / "s.db")).open(signed, calls.ADMIN_LIST, pb.ListRequest())


def test_runs_submitted_at_runtime_queue_behind_the_one_in_flight_and_each_has_its_own_nonce(keys):
    with coordinator(allow_list(keys), []) as (coord, address):
        assert not coord.all_finished()  # --exit-when-done waits for a first run
        first = coord.submit(flynn("f"), "f.toml", "alice")
        second = coord.submit(flynn("f"), "f.toml", "alice")
        assert [coord.store.run(r).state for r in (first, second)] == ["joining", "queued"]
        nonce = coord.jobs["f"].run_nonce
        with pytest.raises(errors.InvalidInput, match="already defined with other settings"):
            coord.submit(flynn("f").replace("m = 128", "m = 256"), "f2.toml", "alice")
        datas = {p: party_data(i) for i, p in enumerate(PARTIES)}
        assert all(not isinstance(r, BaseException) for r in run_parties(address, "f", keys, datas).values())
        assert coord.store.run(first).state == "done"
        assert coord.store.run(second).state == "joining" and coord.jobs["f"].run_id == second
        assert coord.jobs["f"].run_nonce != nonce
        assert coord.jobs["f"].challenge("a").run_id == second
        results = run_parties(address, "f", keys, datas)
        assert all(not isinstance(r, BaseException) for r in results.values()), results
        assert [r.state for r in coord.store.runs(job_id="f")] == ["done", "done"]
        assert coord.all_finished()
        with pytest.raises(errors.ProtocolError, match="no run open for joining .* the operator starts one"):
            coord.challenge("a", pb.ChallengeRequest(job_id="f"))


def test_a_cancelled_run_ends_for_its_parties_with_the_operators_reason(keys):
    with coordinator(allow_list(keys), []) as (coord, address):
        run = coord.submit(flynn("c", parties=("a", "b", "c", "d"), join=600), "c.toml", "alice")
        queued = coord.submit(flynn("c", parties=("a", "b", "c", "d"), join=600), "c.toml", "alice")
        coord.cancel(queued, "alice", "not today")
        assert coord.store.run(queued).state == "cancelled"

        def cancel_when_joined():
            while len(coord.jobs["c"].parties) < 3:
                coord.jobs["c"].done_event.wait(0.01)
            coord.cancel(run, "alice", "wrong data set")

        import threading
        threading.Thread(target=cancel_when_joined, daemon=True).start()
        results = run_parties(address, "c", keys, {p: party_data(i) for i, p in enumerate(PARTIES)})
        for party in PARTIES:
            assert isinstance(results[party], errors.RunCancelled), results[party]
            assert "the run was cancelled: wrong data set" in str(results[party])
        assert coord.runs[run].done_event.wait(10)  # set once the store has the outcome
        record = coord.store.run(run)
        assert (record.state, record.reason, record.cancelled_by) == ("cancelled", "wrong data set", "alice")
        with pytest.raises(errors.InvalidInput, match="already cancelled"):
            coord.cancel(run, "alice")


def test_offers_name_only_the_signing_party_and_refuse_another_partys_key(keys):
    with coordinator(allow_list(keys), []) as (coord, address):
        coord.submit(flynn("ab", parties=("a", "b")), "ab.toml", "alice")
        coord.submit(flynn("bc", parties=("b", "c")), "bc.toml", "alice")
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.CoordinatorStub(channel)

            def offers(signer: str, key) -> list[str]:
                signed = calls.sign_call(key, signer, calls.OFFERS, pb.OffersRequest())
                return [o.spec.job_id for o in stub.Offers(signed, timeout=10).offers]

            assert offers("a", keys["a"]) == ["ab"]
            assert sorted(offers("b", keys["b"])) == ["ab", "bc"]
            assert offers("d", keys["d"]) == []
            with pytest.raises(grpc.RpcError) as refused:
                offers("b", keys["a"])  # a asking what b is offered
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        spec = coord.offers("a")[0].spec
        assert dict(spec.datasets) == {"a": "demo"}  # its own data set's name only, never b's


def test_the_admin_server_stays_on_loopback_unless_tls(keys):
    with coordinator(allow_list(keys), []) as (coord, _):
        with pytest.raises(errors.ConfigError, match="not a loopback address"):
            build_admin_server(coord, {"alice": identity.public_bytes(keys["a"])}, "0.0.0.0:0", tls=None)
        with pytest.raises(errors.ConfigError, match="at least one operator key"):
            build_admin_server(coord, {}, "127.0.0.1:0", tls=None)


def test_job_show_tells_how_far_secure_hamming_and_the_influence_solve_have_got_without_waiting(keys, monkeypatch):
    """`xclp-server job show` during an XCLP run of four parties: the current step, its pieces
    folded or columns solved so far, with an ETA. The operator's call is answered on another thread
    while the run holds its lock (it folds a piece, it solves an influence block): it must not wait
    for that. The run also shows the streaming bounds of docs/design.md §10: a party A of two pairs sends
    its slices to one B at a time, and the next influence block is solved while the last one is sent
    and queued only once that one has left the coordinator's mailboxes (no backlog allowed here):
    never more than two blocks wait, the receiver's and the last of the receiver before it."""
    import threading

    import xclp.server.jobs.xclp as coordinator_xclp
    import xclp.v1.secure_hamming_wire as shw
    from tests.harness import job
    from xclp.client.policy import PartyPolicy
    from xclp.crypto.paillier import PaillierKeypair
    from xclp.graph import InfluenceSolver
    from xclp.server.admin_cli import format_run
    from xclp.server.steps.xclp import NeighbourGraph

    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128)  # pieces of two ciphertexts: many per pair
    monkeypatch.setattr(coordinator_xclp, "solve_columns", lambda n: 2)  # influence in blocks of two columns
    monkeypatch.setattr(coordinator_xclp.steps, "INFLUENCE_BACKLOG_BYTES", 0)
    shown: dict[str, list[str | None]] = {"hamming": [], "influence": []}
    waiting: list[int] = []  # influence bytes in the mailboxes as each block is solved

    def show(what: str) -> None:
        if len(shown[what]) >= 2:
            return
        out: list[str] = []
        asks = threading.Thread(target=lambda: out.append(format_run(coord.run_info(coord.jobs["x"].run_id))),
                                daemon=True)
        asks.start()
        asks.join(10)
        shown[what].append(out[0] if out else None)

    real_fold, real_solve = NeighbourGraph.fold_piece, InfluenceSolver.solve
    monkeypatch.setattr(NeighbourGraph, "fold_piece", lambda self, *a: (show("hamming"), real_fold(self, *a))[1])
    def solve(self, cols):
        waiting.append(sum(p.mailbox.queued_bytes for p in coord.jobs["x"].parties.values()))
        show("influence")
        return real_solve(self, cols)

    monkeypatch.setattr(InfluenceSolver, "solve", solve)
    params = {"n_classes": 3, "k": 4, "lsh_bits": 64, "key_bits": 512, "insecure_test_keys": True}
    parties = (*PARTIES, "d")
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in parties}
    with coordinator(allow_list(keys), [job("x", "xclp", params, parties=parties)]) as (coord, address):
        results = run_parties(address, "x", keys, {p: party_data(60 + i, n=20) for i, p in enumerate(parties)},
                              paillier=paillier, policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    block = 80 * 2 * 8  # 80 rows x 2 columns
    assert len(waiting) > 10 and 0 < max(waiting) <= 2 * block < len(waiting) * block / 4
    assert None not in shown["hamming"] + shown["influence"], shown  # answered while the run was busy
    first, second = shown["hamming"]
    assert ", running, step secure_hamming round 0\n" in first
    assert "  progress:  1/60 pieces folded (1%), " in first and "left" in first  # an ETA from the first piece
    assert "  progress:  2/60 pieces folded (3%), " in second
    first, second = shown["influence"]
    assert ", running, step influence round 0\n" in first and "  progress:  0/" in first
    assert "  progress:  2/" in second and "columns solved" in second


def test_the_admin_commands_help_loads_neither_the_coordinator_nor_the_numerics() -> None:
    """`xclp-server job list --help` took 2 s: the parser imported the coordinator, the job types'
    registry and with it scipy and numba. It now imports what it names (server/defaults.py,
    xclp/v1/exits.py); the exit codes it uses are xclp.v1.status's."""
    import subprocess
    import sys

    from xclp.server import cli
    from xclp.v1 import status

    probe = ("import sys\nfrom xclp.server.cli import main\n"
             "try:\n    main(['job', 'list', '--help'])\nexcept SystemExit:\n    pass\n"
             "print(' '.join(sorted(m for m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(done.stdout.split())
    assert "--operator-key" in done.stdout  # the help was printed
    heavy = {"scipy", "numba", "grpc", "xclp.server.coordinator", "xclp.v1.registry", "xclp.flynn"} & loaded
    assert heavy == set()
    assert (cli.EXIT_OK, cli.EXIT_UNEXPECTED) == (status.EXIT_OK, status.EXIT_UNEXPECTED)


def test_after_a_restart_a_lost_token_hears_its_run_was_interrupted_and_the_submitted_job_runs_again(keys, tmp_path):
    """A submitted run interrupted by the coordinator's stop: the next process on the same state
    answers the old run's token with RunInterrupted (a party then joins the next run), and
    queues the job again, as its operator's, as a job file given at start runs again. Before, the
    parties' rejoin found "no run open for joining" until the operator submitted it again. After a
    crash (nothing marked), the same; a job whose last run was cancelled does not run again, and a
    Challenge for it says what became of that run."""
    from xclp.server.coordinator import Coordinator
    from xclp.server.events import Stage

    store = StateStore(tmp_path / "state.db")
    first = Coordinator(allow_list(keys), store=store)
    run_id = first.submit(flynn("f"), "f.toml", "alice")
    first.stop()
    assert store.run(run_id).state == "interrupted"
    again = Coordinator(allow_list(keys), store=store)
    with pytest.raises(errors.RunInterrupted, match=f"run {run_id} of job 'f' was interrupted: the coordinator "
                                                    "stopped while it was in flight, and restarted"):
        again.authenticate(b"x" * 32, "f")
    with pytest.raises(errors.InvalidSignature, match="not valid for job 'g'"):
        again.authenticate(b"x" * 32, "g")
    rerun = again.job("f")
    assert rerun.run_id != run_id and rerun.stage is Stage.JOINING
    assert (store.run(rerun.run_id).state, store.run(rerun.run_id).submitted_by) == ("joining", "alice")
    # crashed: the run left joining is interrupted by the next start, and runs again once
    third = Coordinator(allow_list(keys), store=store)
    assert store.run(rerun.run_id).state == "interrupted"
    [queued] = [r for r in store.runs(job_id="f") if r.state == "joining"]
    assert third.job("f").run_id == queued.run_id and queued.submitted_by == "alice"
    third.cancel(queued.run_id, "alice", "not now")
    fourth = Coordinator(allow_list(keys), store=store)
    with pytest.raises(errors.ProtocolError, match=f"its last run, {queued.run_id}, is cancelled: not now"):
        fourth.job("f")


def test_a_challenge_racing_a_runs_end_hears_how_it_ended_before_the_store_does(keys, tmp_path):
    """The run fails under its lock and is stored just after; a Challenge in between used to say
    "its last run, 1, is joining" (a loaded CI run saw it): it says how the run ended."""
    from xclp.server.coordinator import Coordinator
    from xclp.server.events import Stage

    coord = Coordinator(allow_list(keys), store=StateStore(tmp_path / "state.db"))
    run_id = coord.submit(flynn("f"), "f.toml", "alice")
    run = coord.jobs["f"]
    run.stage, run.outcome_reason = Stage.FAILED, "at most 1 of the 2 required parties can join"
    with pytest.raises(errors.ProtocolError, match=f"its last run, {run_id}, is failed: at most 1 of the 2 required"):
        coord.job("f")
