"""Candidate pairs' centres release no row (docs/design.md §10.3), as the coordinator sees it.

Federated k-means opened the centres' exact counts and sums every round; consecutive rounds'
sums differed by the rows that changed centre, so a single row that moved was read exactly (10 of
2 000 rows with the defaults), and a forged seed relay could make centres "qualify" in one party's
view only (tests/threat_model/test_attempts.py). The centres now come from the common seed.
"""

from __future__ import annotations

import numpy as np

from tests.harness import PARTIES, DiesAt, Recorder, allow_list, coordinator, job, party_data, run_parties
from tests.service.test_candidate_pairs import PARAMS
from xclp import candidates as cd
from xclp.client.policy import PartyPolicy
from xclp.crypto.paillier import PaillierKeypair
from xclp.server.phases.masked_sum import MaskedSum


def test_over_a_whole_job_the_coordinator_opens_one_value_about_the_centres_the_probe_table(keys,
                                                                                            monkeypatch) -> None:
    """As the coordinator sees it: federated k-means opened the centres' exact sums every
    round, and consecutive rounds differed by the rows that moved (a single row, read exactly). Now
    the centres come from the common seed, and the only value about them the coordinator opens in a
    whole job, with a party lost while masking it, is one probe table: a count per centre, no
    feature of any row, and the very table of the probes each party then sends it. No two opened
    values exist to difference."""
    class Dies(DiesAt):
        at = "probe_table"

    opened: list[tuple[str, tuple[str, ...]]] = []
    real_init = MaskedSum.__init__

    def init(self, scope, name, **kwargs) -> None:
        real_init(self, scope, name, **kwargs)
        combine = self.combine

        def record(values, participants):
            total = combine(values, participants)
            opened.append((name, tuple(participants)))
            tables[name] = total
            return total

        self.combine = record

    tables: dict[str, np.ndarray] = {}
    monkeypatch.setattr(MaskedSum, "__init__", init)
    rec = Recorder()
    datas = {p: party_data(60 + i, n=300) for i, p in enumerate(PARTIES)}
    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES}
    with coordinator(allow_list(keys), [job("x", "xclp", PARAMS)], observer=rec) as (coord, addr):
        results = run_parties(addr, "x", keys, datas, paillier=paillier, sessions={"c": Dies},
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert all(not isinstance(results[p], BaseException) for p in "ab"), results
    assert [name for name, _ in opened] == ["probe_table", "rowsums"]  # nothing else opened in the job
    assert opened[0][1] == ("a", "b")  # c lost while masking it: attempt 1 among a and b, the only one opened
    probes = {p: np.asarray(rec.seen[("x", "probes", 0, p)]).astype(np.int64) for p in "ab"}
    assert np.array_equal(tables["probe_table"], sum(cd.probe_table(probes[p], 4) for p in "ab"))
