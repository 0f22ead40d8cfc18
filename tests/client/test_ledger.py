"""The party's privacy ledger on its own and through `xclp-client ledger` (client/ledger.py, issue 46)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from tests.client.test_phases import contexts
from xclp.client.cli import main
from xclp.client.ledger import Budget, Ledger, Release, RunAccount, Spend, function_id
from xclp.client.phases.masked_sum import MaskedSumParty, Noisy
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
    assert "releases.json (the release log of xclp before the privacy ledger) is not read" in book.legacy_notice()
    book.reserve_exact(DATA, [Release(function_id("moments", "x", "sum"), "the sum of column 'x'")], "ab", "j", "1")
    assert book.legacy_notice() == ""  # said until the ledger has started


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
