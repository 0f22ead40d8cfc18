"""What an XCLP job will ask of a party, estimated before any of the work (client/jobs/estimate.py)."""

from __future__ import annotations

import pytest

from xclp.client.jobs.estimate import (
    OperationCosts,
    WorkLimits,
    check_memory,
    check_time,
    paillier_seconds,
    party_bytes,
    work_seconds,
)
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import ConfigError, ResourceExhausted

LAYOUT = SlotLayout(2048, 1024)  # K = 186 slots of 11 bits


def test_the_memory_estimate_is_linear_in_the_rows_of_every_party() -> None:
    """Streamed SecureHamming (docs/design.md §10.1): no n × n block anywhere, so twice the rows of every
    party is about twice the memory (the old estimate was 4 · n²: 566.6 GiB at 390 000 rows)."""
    small = party_bytes(20_000, {"b": 20_000, "c": 20_000}, LAYOUT, workers=2, n_classes=2)
    large = party_bytes(40_000, {"b": 40_000, "c": 40_000}, LAYOUT, workers=2, n_classes=2)
    assert small < 2**30 and 1.5 < large / small < 2.0  # the fixed part (blocks, one wave) does not grow
    assert LAYOUT.slices_bytes(1860) == 10 * 1024 * 512  # ⌈n/K⌉ · L ciphertexts of 2|N|/8 bytes
    alone = party_bytes(20_000, {}, LAYOUT, workers=2, n_classes=2)  # before the layout: its own part
    assert alone < small and party_bytes(390_000, {}, LAYOUT, workers=2, n_classes=2) < 3 * 2**30


def test_the_memory_check_refuses_with_the_estimate_and_what_to_change() -> None:
    need = party_bytes(390_000, {"b": 390_000}, LAYOUT, workers=2, n_classes=2)
    with pytest.raises(ResourceExhausted) as exc:
        check_memory(need, 2**30, 390_000, {"b": 390_000})
    message = str(exc.value)
    assert f"about {need / 2**30:.1f} GiB on this party (390000 rows against 390000 rows of 1 peers)" in message
    assert "above the limit of 1.0 GiB (--max-memory-gb" in message and "subsample the rows" in message
    check_memory(need, 64 * 2**30, 390_000, {"b": 390_000})  # fits
    check_memory(need, 0, 390_000, {})  # 0: no limit


def test_the_paillier_estimate_grows_with_the_product_of_the_rows():
    keypair = PaillierKeypair.generate(512, allow_insecure_test_size=True)
    costs = OperationCosts.measure(keypair)
    assert costs.decrypt > 0 and costs.encrypt > 0 and costs.multiply > 0
    layout = LAYOUT
    decrypt_only = OperationCosts(encrypt=0.0, multiply=0.0, decrypt=1.0)
    assert paillier_seconds(decrypt_only, layout, 1860, {"b": 500, "c": 1000}, 1) == 10 * 1500  # ⌈n/K⌉ · Σ n_k
    assert paillier_seconds(decrypt_only, layout, 1860, {"b": 500, "c": 1000}, 4) == 10 * 1500 / 4
    encrypt_only = OperationCosts(encrypt=1.0, multiply=0.0, decrypt=0.0)
    assert paillier_seconds(encrypt_only, layout, 1860, {"b": 500}, 1) == 1024 * 10  # L · ⌈n/K⌉ slices
    multiply_only = OperationCosts(encrypt=0.0, multiply=1.0, decrypt=0.0)
    assert paillier_seconds(multiply_only, layout, 1860, {"b": 372}, 1) == 512 * 2 * 1860  # L/2 · ⌈n_k/K⌉ · n


def test_on_candidate_pairs_the_estimates_are_the_bounds_the_budget_and_the_slots_set() -> None:
    """docs/design.md §10.3, §10.5: the ciphertexts are at most pair_budget of all pairs'; a party's slots
    as A at most probes × budget_slack times its rows (XclpJobParams.slots_per_row)."""
    from xclp.v1.xclp import XclpJobParams

    params = XclpJobParams.parse({"n_classes": 3, "pair_budget": 0.1, "probes": 3, "budget_slack": 1.5})
    assert params.slots_per_row == 4.5
    auto = XclpJobParams.parse({"n_classes": 3, "pair_budget": "auto", "probes": 3, "budget_slack": 1.5})
    assert auto.slots_per_row == 1.5  # "auto" lists each row once: one probe
    assert XclpJobParams.parse({"n_classes": 3, "probes": 3}).for_rows(300).slots_per_row == 1.0
    decrypt_only = OperationCosts(encrypt=0.0, multiply=0.0, decrypt=1.0)
    assert paillier_seconds(decrypt_only, LAYOUT, 1860, {"b": 500}, 1, budget=0.1) == 0.1 * 10 * 500
    encrypt_only = OperationCosts(encrypt=1.0, multiply=0.0, decrypt=0.0)
    assert paillier_seconds(encrypt_only, LAYOUT, 1860, {"b": 500}, 1, slots=4.5) == 1024 * 45  # ⌈4.5·1860/186⌉
    plain = party_bytes(1860, {"b": 500}, LAYOUT, workers=2, n_classes=3)
    more = party_bytes(1860, {"b": 500}, LAYOUT, workers=2, n_classes=3, slots=4.5)
    assert more - plain == 2 * LAYOUT.slices_bytes(8370) + LAYOUT.slices_bytes(2250) - (
        2 * LAYOUT.slices_bytes(1860) + LAYOUT.slices_bytes(500))  # its slices (and the sealed copy), the peer's


def test_auto_is_planned_at_twice_the_even_spread_of_one_probe() -> None:
    """pair_budget = "auto" names no bound: the estimate plans for twice what one probe per row costs
    with the rows spread evenly (never above all pairs); a number is its own bound."""
    from xclp import candidates as cd
    from xclp.client.jobs.estimate import candidate_note
    from xclp.v1.xclp import XclpJobParams

    sizes = {"a": 6000, "b": 6000, "c": 6000}
    auto = XclpJobParams.parse({"n_classes": 3, "pair_budget": "auto"}).for_rows(18_000)  # as the roster resolves it
    even = cd.spread_fraction(sizes, LAYOUT.slots, 64, 1.0)
    assert auto.work_budget(sizes, LAYOUT.slots) == pytest.approx(2 * even) and 0.02 < even < 0.1
    assert auto.work_budget({"a": 100, "b": 100}, LAYOUT.slots) == 1.0  # one batch per row is all pairs here
    assert XclpJobParams.parse({"n_classes": 3, "pair_budget": 0.1}).for_rows(18_000).work_budget(sizes,
                                                                                             LAYOUT.slots) == 0.1
    assert candidate_note(auto, 2 * even) == f"; candidate pairs, one probe per row: planned at {2 * even:.1%} of " \
        "all pairs' ciphertexts"


def test_the_work_limit_takes_minutes_or_its_old_name_in_hours_not_both() -> None:
    assert work_seconds(None) == 24 * 3600 and work_seconds(30) == 1800 and work_seconds(0) == 0
    assert work_seconds(None, 2) == 7200  # --max-paillier-hours, the old name
    with pytest.raises(ConfigError, match="not both"):
        work_seconds(30, 2)
    with pytest.raises(ConfigError, match="at least 0"):
        work_seconds(-1)


def test_the_time_check_names_the_estimate_and_every_limit_it_passes() -> None:
    peers = {"b": 100, "c": 100}
    check_time(100.0, WorkLimits(party_seconds=200, run_seconds=0), 100, peers, 2)  # within: no error
    with pytest.raises(ResourceExhausted) as both:
        check_time(7200.0, WorkLimits(party_seconds=1800, run_seconds=600), 100, peers, 2, assumed=True)
    message = str(both.value)
    assert "100 rows against 200 rows of 2 peers (before joining: each peer taken to hold 100 rows" in message
    assert "estimated at 2.0 hours on 2 workers" in message
    assert "above this party's limit of 30.0 min (--max-work-minutes) and the job's max_run_seconds = 600 " \
           "(10.0 min), after which the coordinator would fail the run" in message


def test_a_key_is_timed_once_so_the_estimates_before_join_and_from_the_layout_agree(monkeypatch) -> None:
    timed = []
    costs = OperationCosts(1e-3, 1e-6, 1e-3)
    monkeypatch.setattr(OperationCosts, "measure", classmethod(lambda cls, keypair: timed.append(1) or costs))
    key = PaillierKeypair.generate(512, allow_insecure_test_size=True)
    assert OperationCosts.of(key) is costs and OperationCosts.of(key) is costs and len(timed) == 1


def test_a_scheduled_attempts_work_is_counted_from_its_pieces_and_held_to_the_limits(monkeypatch) -> None:
    """On candidate pairs the layout's estimate is the plan's (rows spread evenly over the centres);
    once an attempt's schedule is known its work is counted exactly: L·⌈slots/K⌉ encryptions,
    one decryption per ciphertext as A, L/2 multiplications per ciphertext as B. At 3 x 100 000
    flights rows the plan said 0.5 % of all pairs' ciphertexts and the schedule was 1.3 %."""
    from xclp.client.jobs.estimate import check_scheduled_work

    costs = OperationCosts(encrypt=2e-3, multiply=1e-5, decrypt=4e-3)
    monkeypatch.setattr(OperationCosts, "of", classmethod(lambda cls, keypair: costs))
    key = PaillierKeypair.generate(512, allow_insecure_test_size=True)
    layout = SlotLayout.for_key(key.public, 64)
    said: list[str] = []
    limits = WorkLimits(party_seconds=60)
    check_scheduled_work(key, 64, 3 * layout.slots, 500, 800, 100, {"b": 90}, 2, limits, said.append)
    seconds = (64 * 3 * 2e-3 + 500 * 4e-3 + 800 * 32 * 1e-5) / 2
    assert said == [f"Paillier work on this attempt's schedule: {seconds:.2g} s on 2 workers (800 ciphertexts to "
                    f"evaluate, 500 to decrypt, {3 * layout.slots} slots to encrypt)"]
    with pytest.raises(ResourceExhausted, match=r"above this party's limit of 0.05 s \(--max-work-minutes\)"):
        check_scheduled_work(key, 64, 0, 500, 800, 100, {"b": 90}, 2, WorkLimits(party_seconds=0.05), said.append)
    check_scheduled_work(key, 64, 0, 10**9, 10**9, 100, {"b": 90}, 2, WorkLimits(0, 0), said.append)  # no limits
