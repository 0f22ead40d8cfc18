"""No differencing across runs (DESIGN §2.8): a job run twice on the same data, the second time
without one party, would give a coordinator that party's exact sums as the difference."""

from __future__ import annotations

import json

import pytest

from tests.harness import Recorder, allow_list, coordinator, job, party_data, run_parties
from xclp.client.policy import PartyPolicy
from xclp.client.releases import ReleaseLog, release_key
from xclp.client.session import JobResult
from xclp.errors import ConfigError, ProtocolError

PARTIES4 = ("a", "b", "c", "d")
FLYNN = {"n_classes": 3, "m": 64, "s": 3, "rho": 8, "standardise": True}


def run_once(keys, tmp_path, parties, *, allow_rerun=False, join_seconds=30.0):
    """One run of the same standardising FlyNN job of a, b, c, d (min 3) with `parties` joining."""
    datas = {p: party_data(100 + i) for i, p in enumerate(PARTIES4) if p in parties}
    logs = {p: {"releases": ReleaseLog(tmp_path / p / "releases.json", allow_rerun=allow_rerun)} for p in parties}
    rec = Recorder()
    config = job("std", "flynn", FLYNN, parties=PARTIES4, min_parties=3, join_seconds=join_seconds)
    with coordinator(allow_list(keys), [config], observer=rec) as (_, address):
        results = run_parties(address, "std", keys, datas, policy=PartyPolicy(min_parties=3), overrides=logs)
    return results, rec


def test_a_rerun_without_one_party_is_refused_before_any_exact_sum(keys, tmp_path) -> None:
    """Attack: run 1 among a, b, c, d; run 2 of the same job, d "did not join", among a, b, c.
    The two pooled moments (and counts) would difference to d's. The parties remember run 1's set."""
    first, _ = run_once(keys, tmp_path, PARTIES4)
    assert all(isinstance(r, JobResult) for r in first.values()), first
    logged = json.loads((tmp_path / "a" / "releases.json").read_text())
    assert sorted(map(tuple, logged.values())) == [PARTIES4, PARTIES4]  # the moments and the counts
    second, rec = run_once(keys, tmp_path, ("a", "b", "c"), join_seconds=1.0)
    for p in "abc":
        assert isinstance(second[p], ProtocolError), (p, second[p])
        assert "released the 'moments' sum of this job on this data among a, b, c, d" in str(second[p])
    assert not [k for k in rec.seen if k[1] in ("moments", "sum")]  # nothing masked, so nothing to open


def test_the_same_set_may_run_again_and_allow_rerun_lifts_the_refusal(keys, tmp_path) -> None:
    run_once(keys, tmp_path, PARTIES4)
    again, _ = run_once(keys, tmp_path, PARTIES4)
    assert all(isinstance(r, JobResult) for r in again.values()), again
    fewer, _ = run_once(keys, tmp_path, ("a", "b", "c"), allow_rerun=True, join_seconds=1.0)
    assert all(isinstance(r, JobResult) for r in fewer.values()), fewer


def test_the_release_log_keeps_digests_only_and_refuses_a_broken_file(tmp_path) -> None:
    log = ReleaseLog(tmp_path / "releases.json")
    key = release_key(b"j" * 32, "sum")
    log.check(key, ["a", "b"], "the 'sum' sum")  # nothing logged yet
    log.record(key, ["b", "a"])
    log.check(key, ["a", "b"], "the 'sum' sum")
    with pytest.raises(ProtocolError, match="among a, b; a run among a, c would let"):
        log.check(key, ["a", "c"], "the 'sum' sum")
    assert json.loads((tmp_path / "releases.json").read_text()) == {key.hex(): ["a", "b"]}
    assert (tmp_path / "releases.json").stat().st_mode & 0o777 == 0o600
    (tmp_path / "releases.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is unreadable"):
        log.check(key, ["a", "b"], "the 'sum' sum")
