"""A party retrying an unreachable coordinator backs off exponentially with jitter, says so once
per change of state, and gives up after its connect timeout with exit code 5 (it used to retry
every 0.5 s, saying so each time)."""

from __future__ import annotations

import random

import grpc
import pytest

from xclp.client.connection import Backoff, Connection, ConnectionConfig
from xclp.crypto import identity
from xclp.errors import DeadlineExceeded
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.status import EXIT_DROPPED, exit_code


def test_backoff_doubles_to_its_cap_with_jitter_in_the_upper_half_and_resets() -> None:
    backoff = Backoff(first=0.5, cap=30.0, rng=random.Random(1))
    delays = [backoff.next() for _ in range(12)]
    ceilings = [min(30.0, 0.5 * 2**k) for k in range(12)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings))
    assert ceilings[-1] == 30.0 and len(set(delays)) == 12  # jittered: no two alike
    other = Backoff(first=0.5, cap=30.0, rng=random.Random(2))
    assert [other.next() for _ in range(12)] != delays  # two parties do not retry in step
    backoff.reset()
    assert 0.25 <= backoff.next() <= 0.5


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_an_unreachable_coordinator_is_retried_with_back_off_said_once_and_given_up_after_the_timeout() -> None:
    conn = Connection(ConnectionConfig("127.0.0.1:9", insecure=True), "j")  # nothing listens on port 9
    clock, said = FakeClock(), []
    # tried again at the timeout, so the seconds said are the timeout's (it gave up at 49 s, "connect timeout 60 s")
    with pytest.raises(DeadlineExceeded, match=r"127.0.0.1:9 was not reachable for 60 s \(connect timeout 60 s\)"):
        conn.challenge(identity.generate_identity(), "a", wait_seconds=60, say=said.append, clock=clock,
                       sleep=clock.sleep, backoff=Backoff(rng=random.Random(0)))
    conn.close()
    assert len(said) == 1 and "is not reachable" in said[0] and "retrying with back-off for up to 60 s" in said[0]
    assert 5 <= len(clock.slept) <= 10  # the old loop tried 120 times in 60 s
    assert sum(clock.slept) <= 60 + 1e-9
    assert all(min(30, 0.5 * 2**k) / 2 <= d <= min(30, 0.5 * 2**k) for k, d in enumerate(clock.slept[:-1]))
    assert sum(clock.slept) == pytest.approx(60)
    assert exit_code(DeadlineExceeded("x")) == EXIT_DROPPED


class Unavailable(grpc.RpcError):
    def __init__(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


class FlakyStub:
    """Unreachable for the first answers given, then it answers."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures

    def Challenge(self, call: object, timeout: float) -> pb.ChallengeResponse:  # gRPC's method name
        if self.failures:
            raise Unavailable(self.failures.pop(0))
        return pb.ChallengeResponse(run_nonce=b"n" * 16)


def test_each_change_of_state_is_said_once_and_reaching_the_coordinator_is_said() -> None:
    conn = Connection(ConnectionConfig("coord:1", insecure=True), "j")
    conn.stub = FlakyStub(["connection refused"] * 3 + ["DNS resolution failed"] * 2)  # type: ignore[assignment]
    clock, said = FakeClock(), []
    answer = conn.challenge(identity.generate_identity(), "a", wait_seconds=60, say=said.append, clock=clock,
                            sleep=clock.sleep)
    conn.close()
    assert answer.run_nonce == b"n" * 16 and len(clock.slept) == 5
    assert [line.split("(")[1].split(")")[0] for line in said[:2]] == ["connection refused", "DNS resolution failed"]
    assert len(said) == 3 and said[2].startswith("reached the coordinator after")


def test_the_cli_gives_up_after_its_connect_timeout_with_exit_code_5(tmp_path, capsys, keys) -> None:
    import numpy as np

    from tests.helpers import save_identity, write_table
    from xclp.client.cli import main

    write_table(tmp_path / "t.csv", np.ones((3, 2)), np.array([0, 1, -1]), ["r0", "r1", "r2"])
    save_identity(keys["a"], tmp_path / "a.key")
    (tmp_path / "allow.toml").write_text(f'[parties]\na = "{identity.public_key_text(keys["a"])}"\n')
    code = main(["run", "--job", "j", "--party", "a", "--identity", str(tmp_path / "a.key"), "--coordinator",
                 "127.0.0.1:9", "--data", str(tmp_path / "t.csv"), "--peers", str(tmp_path / "allow.toml"),
                 "--out", str(tmp_path / "m.npz"), "--insecure", "--connect-timeout", "1", "--state",
                 str(tmp_path / "releases.json")])
    said = capsys.readouterr().err
    assert code == EXIT_DROPPED and "was not reachable for" in said and "(connect timeout 1 s)" in said
    assert said.count("is not reachable") == 1


def test_a_party_leaving_on_an_error_tells_xclp_s_own_message_and_only_the_type_of_any_other() -> None:
    from xclp.errors import ProtocolError, why_leaving

    assert why_leaving(ProtocolError("the roster names an unknown key")) == \
        "ProtocolError: the roster names an unknown key"
    assert why_leaving(ValueError("could not convert '38.2 mmol/L' in /data/patients.csv")) == "ValueError"


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED])
def test_a_push_refused_unavailable_is_sent_again_only_within_the_reconnect_window(code) -> None:
    """reconnect_seconds = 0 (a coordinator of a version before resumes sends no window): the first
    UNAVAILABLE is the error, no retry; with a window, the same frames go again and the second try
    is taken. CANCELLED too: a coordinator that stops cancels the calls in flight (a party cut so
    in a stop that kept its run failed, where it should have reconnected to the restarted one)."""
    class PushStub:
        def __init__(self, failures: int) -> None:
            self.failures, self.calls = failures, []

        def Push(self, frames, metadata, timeout):  # gRPC's method name
            self.calls.append([f.message_id for f in frames])
            if self.failures:
                self.failures -= 1
                raise Aborted(code, "Socket closed")
            return pb.PushAck(frames=len(self.calls[-1]), bytes=3)

    conn = Connection(ConnectionConfig("127.0.0.1:1", insecure=True), "j")
    conn._token = b"t"
    conn.stub = PushStub(1)  # type: ignore[assignment]
    with pytest.raises(Exception, match="Socket closed"):
        conn.push(b"abc", sender="a", step="s", round=0)
    assert len(conn.stub.calls) == 1  # type: ignore[attr-defined]
    conn.reconnect_seconds = 30.0
    conn.stub = PushStub(1)  # type: ignore[assignment]
    assert conn.push(b"abc", sender="a", step="s", round=0) == 3
    first, again = conn.stub.calls  # type: ignore[attr-defined]
    assert first == again  # the same message ids: the coordinator takes the message once
    conn.close()


class Aborted(grpc.RpcError):
    """A failed call as gRPC raises it, with the trailing metadata the coordinator sent."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple = ()) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailing


def test_an_interrupted_run_comes_back_as_itself_and_a_named_class_never_widens_the_status_code() -> None:
    """The coordinator names RunInterrupted in the trailing metadata (a party rejoins only on it);
    ABORTED alone is any dropped run, and a name that does not fit the code, or is unknown, is not
    taken: the party never raises a class the code does not allow."""
    from xclp.errors import InvalidInput, PeerDropped, RunInterrupted
    from xclp.v1.status import error_from_rpc, trailing_metadata

    named = trailing_metadata(RunInterrupted("run 1 of job 'f' was interrupted"))
    got = error_from_rpc(Aborted(grpc.StatusCode.ABORTED, "run 1 of job 'f' was interrupted", named))
    assert type(got) is RunInterrupted and str(got) == "run 1 of job 'f' was interrupted"
    assert exit_code(got) == EXIT_DROPPED
    assert type(error_from_rpc(Aborted(grpc.StatusCode.ABORTED, "dropped"))) is PeerDropped
    assert type(error_from_rpc(Aborted(grpc.StatusCode.INVALID_ARGUMENT, "bad", named))) is InvalidInput
    assert type(error_from_rpc(Aborted(grpc.StatusCode.ABORTED, "x", (("xclp-error", "SystemExit"),)))) is PeerDropped
    assert trailing_metadata(PeerDropped("x")) == () and trailing_metadata(InvalidInput("x")) == ()


def test_each_early_job_end_is_its_own_error_and_an_interrupted_run_is_the_one_a_party_rejoins_after() -> None:
    from xclp.errors import InvalidInput, PeerDropped, RunCancelled, RunInterrupted
    from xclp.v1.status import ended_early

    def end(outcome) -> Exception:
        return ended_early(pb.JobEnd(outcome=outcome, reason="why"), "a")

    assert type(end(pb.JobEnd.INTERRUPTED)) is RunInterrupted and str(end(pb.JobEnd.INTERRUPTED)) == "why"
    assert type(end(pb.JobEnd.CANCELLED)) is RunCancelled
    assert type(end(pb.JobEnd.REFUSED)) is InvalidInput
    dropped = end(pb.JobEnd.DROPPED)
    assert type(dropped) is PeerDropped and dropped.dropped == frozenset({"a"})  # type: ignore[attr-defined]
    assert type(end(pb.JobEnd.FAILED)) is PeerDropped
