"""Attacks across the attempts of one masked sum (an attempt a party has left is dead to
it), and on the seeds a verifiable sum relays.

The real coordinator with its masked-sum transitions replaced, as an attacker would replace them,
against the real parties of a FlyNN job on their default policy (`--min-parties 3`): a sum opened
twice, once among P0 and once among P1 ⊂ P0, differences into the exact sum of P0 \\ P1.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from tests.harness import PARTIES, Recorder, allow_list, coordinator, job, party_data, run_parties
from tests.threat_model.hostile import hostile
from tests.threat_model.test_masked_sums import REAL_COMPLETE, pushed
from xclp.client.jobs.allreduce import flynn_counts
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult
from xclp.crypto import identity
from xclp.crypto.masking import ring_sum
from xclp.crypto.paillier import PaillierKeypair
from xclp.errors import ProtocolError
from xclp.server.phases.base import Step
from xclp.server.phases.masked_sum import MaskedSum
from xclp.v1.double_masking import self_mask, unpack_reveal
from xclp.v1.registry import parse_params

FLYNN = {"n_classes": 3, "m": 64, "s": 3, "rho": 8, "share_threshold": 2}
DEFAULT_POLICY = PartyPolicy(insecure_test_keys=True)  # every party on its defaults: --min-parties 3
FIVE = ("a", "b", "c", "d", "e")


def opened(step: Step, seeds: dict[str, bytes]) -> np.ndarray:
    """What a coordinator holding every seed of `step` opens: the ring sum of its contributions."""
    return ring_sum(np.asarray(step.received[p]) - self_mask(seeds[p], np.asarray(step.received[p]).shape,
                                                             np.asarray(step.received[p]).dtype)
                    for p in step.participants)


def test_a_late_confirmation_of_an_abandoned_attempt_opens_nothing(keys, monkeypatch) -> None:
    """Attack (two openings of one sum): attempt 0 runs among a..e; the coordinator says d and e
    dropped before the confirm step and runs attempt 1 among a, b, c, which opens. It has every
    member confirm the abandoned attempt 0 as well, so d and e (for whom attempt 0 is the latest)
    reveal their seeds of it and give their shares of a's, b's and c's (t = 2, accepted by the
    default policy). Attempt 0 minus attempt 1 would be d's and e's exact counts, a sum of two
    parties below every party's --min-parties 3. A party confirms only the latest attempt it masked:
    a, b and c refuse the late confirmation, and attempt 0 never opens."""
    keys = {**keys, "e": identity.generate_identity()}
    stolen: dict[str, object] = {}

    def attack(self: MaskedSum, step: Step) -> None:
        if step.name == self.name and step.attempt == 0:
            stolen["step0"] = step
            self.scope.start_step(self.name, ["a", "b", "c"], 1)  # "d and e dropped"
        elif step.name == self.name and step.attempt == 1:
            stolen["step1"] = step
            self.scope.start_step(self.confirm, list(FIVE), 0)  # confirm the abandoned attempt, late
        elif step.name == self.confirm and step.attempt == 0:
            relayed = b"".join(step.received[p] for p in step.participants)  # type: ignore[misc]
            for p in step.participants:
                self.scope.send(p, self.confirm, 0, relayed)
            REAL_COMPLETE(self, stolen["step1"])  # and on with attempt 1: confirm, reveal
        elif step.name == self.reveal and step.attempt == 1:
            seeds = {p: unpack_reveal(step.received[p])[1] for p in step.participants}
            stolen["sum1"] = opened(stolen["step1"], seeds)  # type: ignore[arg-type]
            self.masked, self.seeds = stolen["step0"], {}  # type: ignore[assignment]
            self.scope.start_step(self.reveal, list(FIVE), 0)  # d and e reveal; a, b, c's seeds from shares
        elif step.name == self.recover:
            REAL_COMPLETE(self, step)  # rebuilds a's, b's and c's seeds of attempt 0 and opens it
            stolen["sum0"] = opened(stolen["step0"], self.seeds)  # type: ignore[arg-type]
        else:
            REAL_COMPLETE(self, step)

    monkeypatch.setattr(MaskedSum, "on_step_complete", attack)
    rec = Recorder()
    datas = {p: party_data(40 + i) for i, p in enumerate(FIVE)}
    with coordinator(allow_list(keys, FIVE), [job("t", "flynn", FLYNN, parties=FIVE)],
                     observer=rec) as (_, address):
        results = run_parties(address, "t", keys, datas, policy=DEFAULT_POLICY)
    if "sum0" in stolen:  # the attack worked: say what it got before failing
        seed = next(r.seed for r in results.values() if isinstance(r, JobResult))
        params = parse_params("flynn", FLYNN)
        d_and_e = sum(flynn_counts(params, datas[p], seed) for p in "de").astype(np.uint32)
        difference = np.asarray(stolen["sum0"]) - np.asarray(stolen["sum1"])
        raise AssertionError(f"attempt 0 opened beside attempt 1: their difference is d's and e's counts "
                             f"in {np.mean(difference == d_and_e):.0%} of cells")
    for p in "abc":
        assert isinstance(results[p], ProtocolError), results[p]
        assert "sum attempt 0, which this party left for attempt 1" in str(results[p]), results[p]
    assert pushed(rec, "sum_confirm", 0) <= {"d", "e"}
    assert pushed(rec, "sum_reveal", 0) == set() and pushed(rec, "sum_recover") == set()


CANDIDATES = {"n_classes": 3, "lsh_bits": 64, "k": 5, "key_bits": 512, "insecure_test_keys": True,
              "pair_budget": 0.9, "centres": 4, "probes": 1}
FEDAVG = {"n_classes": 3, "hidden": [4], "rounds": 2, "local_epochs": 1, "batch_size": 8}


@pytest.mark.parametrize("job_type, params, relay", [("xclp", CANDIDATES, "probe_table_seeds"),
                                                     ("fedavg", FEDAVG, "r0.update_seeds")],
                         ids=["probe-table", "fedavg-update"])
def test_a_forged_seed_in_a_verifiable_sums_relay_is_refused_before_it_is_used(keys, monkeypatch, job_type, params,
                                                                              relay) -> None:
    """Attack: a verifiable sum is recomputed by every member from all masked vectors and
    seeds. The coordinator relays party a a random seed in place of b's: a's sum, and what it does
    with it (which probes it sends and how many, k-means centres that qualify in its view only; the
    next model), differs from everyone else's. Every member signed a commitment to its seed in its
    confirmation: a refuses a seed that does not open b's before using any of it."""
    def forge(party, name, payload):
        if party == "a" and name == relay:
            return payload[:32] + secrets.token_bytes(32) + payload[64:]  # members a, b, c: b's is second
        return None

    paillier = {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in PARTIES} \
        if job_type == "xclp" else None
    datas = {p: party_data(160 + i, n=300 if job_type == "xclp" else 60) for i, p in enumerate(PARTIES)}
    with hostile(monkeypatch, rewrite=forge), \
            coordinator(allow_list(keys), [job("t", job_type, params)]) as (_, address):
        results = run_parties(address, "t", keys, datas, paillier=paillier,
                              policy=PartyPolicy(min_parties=2, insecure_test_keys=True))
    assert isinstance(results["a"], ProtocolError), results["a"]
    assert "relayed for b do not open the commitments they signed before the reveal" in str(results["a"])
