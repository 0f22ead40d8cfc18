"""A party that cannot run says so at once (client/before_join.py `decline`): the others and the
operator hear which party and why within seconds, not at the join deadline; the run starts
among the rest, or fails at once with the reason."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tests.harness import allow_list, coordinator, job, party_data, run_parties
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.errors import InvalidInput, PolicyRefused
from xclp.server.admin_cli import format_run

FLYNN = {"n_classes": 3, "m": 64, "s": 2, "rho": 8}
PARTIES4 = ("a", "b", "c", "d")
BAD_DATA = "declined: its data does not fit the job (the party's own output says where)"
POLICY = "declined: the job is outside its policy (the party's own output says which rule)"


@pytest.mark.parametrize("why", ["data", "policy"])
@pytest.mark.parametrize("min_parties", [3, 4])
def test_a_party_refused_by_its_own_checks_declines_and_the_run_does_not_wait_for_it(keys, why: str,
                                                                                    min_parties: int) -> None:
    """d's table has a label out of the job's range ("data"), or d's policy asks for DP the job
    has not ("policy"). Before, d left without a word and the others waited out the join deadline
    (60 s here, 10 min by default). Now d declines with its reason: with min_parties = 3 the run
    starts among a, b, c at once; with 4 it fails at once, naming d and why."""
    datas = {p: party_data(500 + i) for i, p in enumerate(PARTIES4)}
    if why == "data":
        y = datas["d"].y.copy()
        y[7] = 5  # a 3-class job
        datas["d"] = dataclasses.replace(datas["d"], y=y)
    policies = {p: {"policy": PartyPolicy(min_parties=3, require_dp=1.0 if (p == "d" and why == "policy") else None)}
                for p in PARTIES4}
    config = job("f", "flynn", FLYNN, parties=PARTIES4, min_parties=min_parties, join_seconds=60.0)
    began = time.monotonic()
    with coordinator(allow_list(keys), [config]) as (coord, address):
        results = run_parties(address, "f", keys, datas, overrides=policies)
        info = coord.run_info(coord.store.runs(job_id="f", limit=1)[0].run_id)
    assert time.monotonic() - began < 30  # seconds, not the join deadline
    reason = BAD_DATA if why == "data" else POLICY
    assert isinstance(results["d"], PolicyRefused if why == "policy" else InvalidInput), results["d"]
    if why == "data":
        assert "label 5 at row 7 is out of range for a 3-class job" in str(results["d"])  # said to d's user only
    parties = {p.party_id: p for p in info.parties}
    assert (parties["d"].state, parties["d"].reason) == ("declined", reason)
    line = next(x for x in format_run(info).splitlines() if x.strip().startswith("d "))
    assert "declined" in line and "row 7" not in line
    if min_parties == 3:
        assert all(isinstance(results[p], JobResult) for p in "abc"), results
        assert info.state == "done" and info.started_at < info.created_at + 30
    else:
        assert info.state == "failed" and info.reason == f"d ({reason}): at most 3 of the 4 required parties can join"
        for p in "abc":
            assert reason in str(results[p]), results[p]
