"""The party's privacy ledger on its own and through `xclp-client ledger` (client/ledger.py, issue 46)."""

from __future__ import annotations

import json

import pytest

from xclp.client.cli import main
from xclp.client.ledger import Budget, Ledger, Release, Spend, function_id
from xclp.errors import ConfigError, PolicyRefused

DATA = bytes(range(32))


def filled(tmp_path) -> Ledger:
    book = Ledger(tmp_path, budget=Budget(2.0, 1e-5))
    book.record_exact(DATA, [Release(function_id("moments", "age", "count"), "the count of column 'age'")], "abcd",
                      "std", "1")
    book.charge(DATA, Spend(0.5, 1e-6, "run:dp:1:release", "the job's DP releases"), "dp", "1")
    book.charge(DATA, Spend(0.5, 1e-6, "run:dp:1:release", "the job's DP releases"), "dp", "1")  # once per key
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
    book.record_exact(DATA, [Release(function_id("moments", "x", "sum"), "the sum of column 'x'")], "ab", "j", "1")
    assert book.legacy_notice() == ""  # said until the ledger has started
