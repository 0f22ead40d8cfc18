"""The party's privacy ledger on its own and through `xclp-client ledger` (client/ledger.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from tests.client.test_phases import contexts
from xclp.client.cli import main
from xclp.client.ledger import Budget, Ledger, Release, RunAccount, Spend, data_digest, function_id
from xclp.client.ledger_v1 import release_log_notice
from xclp.client.phases.masked_sum import MaskedSumParty, Noisy
from xclp.data.party_table import PartyData
from xclp.errors import ConfigError, PolicyRefused, ProtocolError
from xclp.privacy import dpsgd
from xclp.privacy.accounting import ORDERS, composed_epsilon, pure_rdp

DATA = bytes(range(32))


def filled(tmp_path) -> Ledger:
    book = Ledger(tmp_path, budget=Budget(2.0, 1e-5))
    book.reserve_exact(DATA, [Release(function_id("moments", "age", "count"), "the count of column 'age'")], "abcd",
                       "std", "1")
    book.charge(DATA, [Spend(0.5, 1e-6, "run:dp:1:release", "the job's DP releases")], "dp", "1")
    book.charge(DATA, [Spend(0.5, 1e-6, "run:dp:1:release", "the job's DP releases")], "dp", "1")  # once per key
    return book


def test_the_budget_counts_each_charge_once_and_refuses_what_would_pass_it(tmp_path) -> None:
    book = filled(tmp_path)
    assert book.spent(DATA) == (0.5, 1e-6)
    book.check_budget(DATA, [Spend(1.5, 0.0, "run:next:1:release", "x")], "next")  # exactly what is left
    with pytest.raises(PolicyRefused, match=r"would spend ε = 1.6, δ = 0 .* has spent ε = 0.5, δ = 1e-06 of ε = 2"):
        book.check_budget(DATA, [Spend(1.6, 0.0, "run:next:1:release", "x")], "next")
    book.check_budget(DATA, [Spend(5.0, 0.0, "run:dp:1:release", "x")], "dp")  # charged already: nothing new
    assert Budget.parse("3,1e-6") == Budget(3.0, 1e-6) and Budget.parse("4") == Budget(4.0, 1e-5)
    for bad in ("0", "x", "1,2,3", "1,1"):
        with pytest.raises(ConfigError):
            Budget.parse(bad)


def test_ledger_show_export_and_forget(tmp_path, capsys) -> None:
    filled(tmp_path)
    assert main(["ledger", "show", "--state", str(tmp_path), "--privacy-budget", "2"]) == 0
    shown = capsys.readouterr().out
    assert f"data set {DATA.hex()[:16]}: DP spent ε = 0.5, δ = 1e-06; left ε = 1.5" in shown
    assert "exact among a, b, c, d (job std, run 1, " in shown and "): the count of column 'age'" in shown
    assert main(["ledger", "export", "--state", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == Ledger(tmp_path).load()
    assert main(["ledger", "forget", DATA.hex()[:8], "--state", str(tmp_path)]) == 2  # says, forgets nothing
    said = capsys.readouterr().out
    assert "re-opens 1 exact release(s) to a rerun among other parties and gives back ε = 0.5" in said
    assert Ledger(tmp_path).summary()
    assert main(["ledger", "forget", "--state", str(tmp_path)]) == 2  # neither a data set nor --all
    assert main(["ledger", "forget", DATA.hex()[:8], "--yes", "--state", str(tmp_path)]) == 0
    assert Ledger(tmp_path).summary() == {}


def test_the_release_log_of_earlier_versions_is_named_not_silently_dropped(tmp_path) -> None:
    (tmp_path / "releases.json").write_text("{}")
    book = Ledger(tmp_path)
    assert "releases.json (the release log of xclp before the privacy ledger) is not read" in \
        release_log_notice(tmp_path)
    book.reserve_exact(DATA, [Release(function_id("moments", "x", "sum"), "the sum of column 'x'")], "ab", "j", "1")
    assert release_log_notice(tmp_path) == ""  # said until the ledger has started


def test_many_pure_releases_compose_by_rdp_below_the_advanced_composition_theorem(tmp_path) -> None:
    """100 releases of ε = 0.1 at δ = 10⁻⁵: basic composition says ε = 10; the advanced composition
    theorem (Dwork, Rothblum and Vadhan 2010) √(2k ln 1/δ)·ε + kε(e^ε − 1) ≈ 5.85; the ledger's RDP
    composition (ε²/2-zCDP per release) must be below both. One release stays at its own ε (basic
    is tighter there)."""
    book = Ledger(tmp_path, budget=Budget(10.0, 1e-5))
    one = Spend(0.1, 0.0, "run:0:release", "x", "release", pure_rdp(0.1))
    book.charge(DATA, [one], "j", "0")
    assert book.standing(DATA)["composition"] == "basic" and book.spent(DATA) == (0.1, 0.0)
    for k in range(1, 100):
        book.charge(DATA, [Spend(0.1, 0.0, f"run:{k}:release", "x", "release", pure_rdp(0.1))], "j", str(k))
    advanced = math.sqrt(2 * 100 * math.log(1e5)) * 0.1 + 100 * 0.1 * math.expm1(0.1)
    eps, delta = book.spent(DATA)
    assert eps < advanced < 10 and delta == 1e-5, (eps, advanced)
    assert book.standing(DATA)["composition"] == "rdp"
    book.check_budget(DATA, [Spend(10.0 - eps - 0.2, 0.0, "run:next:release", "x")], "next")  # basic for a newcomer
    with pytest.raises(PolicyRefused, match=r"would have spent ε = 10\.1 \(RDP composition\)"):
        book.check_budget(DATA, [Spend(10.0 - eps + 0.1, 0.0, "run:next:release", "x")], "next")


def test_a_curve_planned_after_the_charge_tightens_it_and_a_charge_without_one_composes_basically(tmp_path) -> None:
    """A Skellam release charged at (ε, δ) before its noise is planned counts by basic composition
    beside the others' RDP, until the run attaches its curve (RunAccount.mechanism)."""
    book = Ledger(tmp_path, budget=Budget(10.0, 1e-5))
    plan = dpsgd.plan(1.0, 1e-7, 1.0, 50, 20, distributed=True)
    spends = (Spend(0.5, 0.0, "run:r:release-pure", "x", "pure", pure_rdp(0.5)),
              Spend(1.0, 1e-7, "run:r:release", "y", "release"))
    account = RunAccount(book, DATA, "train", "r", spends)
    account.charge()
    before = book.spent(DATA)
    assert before == (1.5, 1e-7)  # one release of each: basic is tighter than RDP at δ = 10⁻⁵
    account.mechanism("release", plan.rdp)
    charges = Ledger(tmp_path).load()["datasets"][DATA.hex()]["dp"]
    assert {key: len(c.get("rdp", [])) for key, c in charges.items()} == {"run:r:release-pure": len(ORDERS),
                                                                          "run:r:release": len(ORDERS)}
    for k in range(8):  # seven more runs of the same job: RDP composes the curves
        more = RunAccount(book, DATA, "train", str(k), (replace(spends[1], key=f"run:{k}:release"),))
        more.mechanism("release", plan.rdp)
        more.charge()
    eps, delta = book.spent(DATA)
    assert eps == pytest.approx(composed_epsilon([pure_rdp(0.5)] + [plan.rdp] * 9, 1e-5), rel=1e-12)
    assert eps < 9.5 and delta == 1e-5
    with pytest.raises(ValueError, match="an RDP curve has"):
        book.attach_curve(DATA, "run:r:release", [1.0])


def test_a_sum_that_says_it_is_noisy_in_a_job_that_charges_nothing_is_refused(tmp_path) -> None:
    """Every masked sum says what it releases (MaskedSumParty's `releases` has no default): the
    functions of an exact sum, or Noisy.DP, which the job's DP spends must pay for. A noisy sum in
    a job that declares no DP release would reach the coordinator uncharged: refused."""
    (ctx, _), *_ = contexts().values()
    uncharged = dataclasses.replace(ctx, account=RunAccount(Ledger(tmp_path), DATA, "j", "1", ()))
    with pytest.raises(ProtocolError, match="'total' is noisy, but the job declares no DP release"):
        MaskedSumParty(uncharged, "total", lambda members: np.ones(2, np.uint64), releases=Noisy.DP)
    charged = dataclasses.replace(ctx, account=RunAccount(Ledger(tmp_path), DATA, "j", "1",
                                                          (Spend(1.0, 0.0, "run:1:release", "x", "release"),)))
    MaskedSumParty(charged, "total", lambda members: np.ones(2, np.uint64), releases=Noisy.DP)


MOMENTS = [Release(function_id("moments", "x", "sum"), "the sum of column 'x'")]


def test_a_data_sets_exact_releases_stay_among_one_set_of_parties_whatever_the_function(tmp_path) -> None:
    book = Ledger(tmp_path)
    book.reserve_exact(DATA, MOMENTS, "abcd", "std", "1")
    book.reserve_exact(DATA, [Release(function_id("update"), "training updates")], "dcba", "train", "2")  # one set
    with pytest.raises(PolicyRefused, match=r"exactly among a, b, c, d \(job 'std', run 1: the sum of column 'x'\); "
                                            r"every exact release .* not releasing it among a, b, c \(`xclp-client "
                                            rf"ledger move {DATA.hex()[:16]} --to PARTIES`"):
        book.reserve_exact(DATA, [Release(function_id("other"), "something else")], "abc", "other", "3")
    Ledger(tmp_path, allow_rerun=True).reserve_exact(DATA, MOMENTS, "abc", "other", "3")  # the named escape
    assert Ledger(tmp_path).summary()[DATA.hex()]["among"] == ["a", "b", "c", "d"]


def test_a_dropout_before_anything_opened_takes_the_smaller_set_and_after_is_refused(tmp_path) -> None:
    """The run's first sum restarted among fewer (the party left attempt 0, which is dead to it):
    the data set's set becomes the smaller one. Once a sum of the run opened, or another run
    holds the set, a smaller set is refused."""
    book = Ledger(tmp_path)
    account = RunAccount(book, DATA, "j", "1")
    account.reserve_exact(MOMENTS, "abcd")
    account.reserve_exact(MOMENTS, "abc", shrunk=True)
    assert book.summary()[DATA.hex()]["among"] == ["a", "b", "c"]
    account.revealing()
    with pytest.raises(PolicyRefused, match="exactly among a, b, c "):
        account.reserve_exact(MOMENTS, "ab", shrunk=True)
    other = Ledger(tmp_path / "other")
    RunAccount(other, DATA, "j", "2").reserve_exact(MOMENTS, "abcd")
    RunAccount(other, DATA, "k", "3").reserve_exact(MOMENTS, "abcd")  # another run holds the set too
    with pytest.raises(PolicyRefused, match="exactly among a, b, c, d "):
        RunAccount(other, DATA, "j", "2").reserve_exact(MOMENTS, "abc", shrunk=True)
    grown = RunAccount(Ledger(tmp_path / "x"), DATA, "j", "4")
    grown.reserve_exact(MOMENTS, "abcd")
    with pytest.raises(PolicyRefused):  # a "restart" among more parties is no dropout
        grown.reserve_exact(MOMENTS, "abcde", shrunk=True)


def test_moving_a_data_set_is_explicit_and_named(tmp_path, capsys) -> None:
    book = Ledger(tmp_path)
    book.reserve_exact(DATA, MOMENTS, "abcd", "std", "1")
    state = ["--state", str(tmp_path)]
    assert main(["ledger", "move", DATA.hex()[:8], "--to", "a,b,c,e", *state]) == 2  # says, moves nothing
    said = capsys.readouterr().out
    assert "difference the two into what d, e released" in said and "nothing moved" in said
    assert main(["ledger", "move", DATA.hex()[:8], "--to", "a,b,c,e", "--yes", *state]) == 0
    book.reserve_exact(DATA, MOMENTS, "eabc", "new", "2")
    summary = book.summary()[DATA.hex()]
    assert summary["among"] == ["a", "b", "c", "e"] and summary["moves"][0]["from"] == ["a", "b", "c", "d"]
    assert summary["exact"][0]["retired"] and not summary["exact"][1].get("retired")
    assert main(["ledger", "show", *state]) == 0
    assert "exact releases only among a, b, c, e" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="at least two"):
        book.move(DATA.hex(), ["a"])


def test_a_budget_refusal_is_kept_until_the_data_set_is_reopened(tmp_path, capsys) -> None:
    book = Ledger(tmp_path, budget=Budget(1.0, 1e-5))
    with pytest.raises(PolicyRefused, match="would spend ε = 2"):
        book.check_budget(DATA, [Spend(2.0, 0.0, "run:x:release", "x")], "big")
    with pytest.raises(PolicyRefused, match="declined job 'big' for its privacy budget"):
        book.check_budget(DATA, [Spend(0.1, 0.0, "run:y:release", "x")], "small")
    assert main(["ledger", "reopen", DATA.hex()[:8], "--state", str(tmp_path)]) == 0
    book.check_budget(DATA, [Spend(0.1, 0.0, "run:y:release", "x")], "small")


def test_a_charge_is_checked_again_under_the_lock_at_masking(tmp_path) -> None:
    """Two runs each fit the budget at Join; the second to mask finds the first's charge."""
    book = Ledger(tmp_path, budget=Budget(1.0, 1e-5))
    first, second = (RunAccount(book, DATA, "j", r, (Spend(0.6, 0.0, f"run:{r}:release", "x"),)) for r in "12")
    for account in (first, second):
        book.check_budget(DATA, account.spends, "j")
    first.charge()
    with pytest.raises(PolicyRefused, match="not releasing \\(another run charged the data set since this one"):
        second.charge()
    assert book.spent(DATA) == (0.6, 0.0)


def test_a_version_1_ledger_is_migrated_never_reset(tmp_path) -> None:
    """A format 1 ledger's data set, named after one job's label mapping, is kept as legacy and
    carried over when a run reads the table it describes; a file of no known format is refused."""
    from xclp.client.ledger_v1 import legacy_digest

    table = PartyData(np.arange(6.0).reshape(3, 2), np.array([0, 1, -1]), ("r1", "r2", "r3"))
    old = legacy_digest(table).hex()
    (tmp_path / "ledger.json").write_text(json.dumps({"version": 1, "datasets": {old: {
        "exact": {"f1": {"what": "the sum of column '#1'", "parties": ["a", "b", "c", "d"], "job": "std", "run": "1",
                         "at": "2026-11-01T00:00:00Z"}},
        "dp": {"run:r:release": {"epsilon": 0.5, "delta": 0.0, "what": "x", "job": "dp", "run": "2",
                                 "at": "2026-11-02T00:00:00Z"}}}}}))
    book = Ledger(tmp_path)
    new = data_digest(table)
    assert book.spent(new) == (0.0, 0.0) and old in book.load()["legacy"]  # not claimed yet, not lost
    assert book.adopt_legacy(new, legacy_digest(table))
    assert book.spent(new) == (0.5, 0.0)
    with pytest.raises(PolicyRefused, match=r"exactly among a, b, c, d \(job 'std', run v1:std:1: the sum of"):
        book.reserve_exact(new, MOMENTS, "abc", "j", "3")
    assert json.loads((tmp_path / "ledger.json").read_text())["version"] == 2
    assert not book.adopt_legacy(new, legacy_digest(table))  # once
    (tmp_path / "ledger.json").write_text(json.dumps({"version": 1, "datasets": []}))
    with pytest.raises(ConfigError, match="not a version 2 ledger \\(nor one of version 1, which is migrated\\)"):
        book.spent(new)


def test_randomised_responses_are_reused_by_row_id_and_label_value(tmp_path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from xclp.client import responses

    book = Ledger(tmp_path, identity=Ed25519PrivateKey.generate())
    ids = ("r1", "r2", "r3", "r4")
    drawn = np.array([2, -1, 0, 1])  # in the first job's numbering of ("no", "maybe", "yes")
    first = responses.released_labels(book, DATA, ids, ("no", "maybe", "yes"), 1.0, False, lambda: drawn)
    np.testing.assert_array_equal(first, drawn)
    # another job: classes reordered, rows in another order, a larger ε: the same responses by value
    again = responses.released_labels(book, DATA, ("r3", "r1", "r4", "r2"), ("yes", "no", "maybe"), 2.0, False,
                                      lambda: pytest.fail("drawn twice"))
    assert [("yes", "no", "maybe")[v] if v >= 0 else None for v in again] == ["no", "yes", "maybe", None]
    with pytest.raises(PolicyRefused, match="drawn once, at ε = 1, .* cannot give this job's ε = 0.5"):
        responses.check(book, DATA, 0.5, False)
    with pytest.raises(PolicyRefused, match="drawn without hide_label_mask"):
        responses.check(book, DATA, 1.0, True)
    with pytest.raises(PolicyRefused, match="drawn over the classes maybe, no, yes .* classes are maybe, no"):
        responses.released_labels(book, DATA, ids, ("no", "maybe"), 1.0, False, lambda: drawn)
