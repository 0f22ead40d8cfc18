"""The coordinator's settings files fail loudly with what to fix (docs/design.md §9)."""

from __future__ import annotations

import re

import pytest

from tests.helpers import load_allow_list
from xclp.crypto import identity
from xclp.errors import ConfigError
from xclp.server.config import load_job
from xclp.v1.allreduce import FlynnJobParams, RaceJobParams
from xclp.v1.registry import params_from_json, params_json, parse_params

JOB = '''job_id = "j"
type = "flynn"
expected_parties = ["a", "b"]
[deadlines]
step_seconds = 5
[params]
n_classes = 2
m = 64
s = 3
rho = 4
'''


def test_job_file_loads_with_defaults(tmp_path):
    (tmp_path / "j.toml").write_text(JOB)
    job = load_job(tmp_path / "j.toml")
    assert job.min_parties == 2 and job.step_seconds == 5 and job.join_seconds == 600
    assert job.params == FlynnJobParams(n_classes=2, m=64, s=3, rho=4)
    assert job.reconnect_seconds == 5  # 30 s by default, but never longer than step_seconds
    assert job.spec().reconnect_seconds == 5  # the parties retry a lost connection as long
    (tmp_path / "j.toml").write_text(JOB.replace("step_seconds = 5", "step_seconds = 300\nreconnect_seconds = 0"))
    assert load_job(tmp_path / "j.toml").reconnect_seconds == 0


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace('type = "flynn"', 'type = "xgboost"'), "unknown job type"),
    (lambda t: t.replace("rho = 4", "rho = 4\nrh0 = 1"), "unknown flynn job parameter"),
    (lambda t: t.replace("m = 64", "m = -1"), "'m' must be an integer >= 1"),
    (lambda t: t.replace("rho = 4", "rho = 400"), "rho = 400 exceeds m"),
    (lambda t: t.replace('["a", "b"]', '["a"]'), "min_parties"),
    (lambda t: t.replace('["a", "b"]', '["a", "a b"]'), "party id"),
    (lambda t: t.replace('job_id = "j"\n', ""), "missing required key 'job_id'"),
    (lambda t: t.replace('job_id = "j"', 'job_id = ".."'), "not '.' or '..'"),
    (lambda t: t + "epsilon = 1.0\n", "both epsilon and T"),
    (lambda t: t + "[[oops", "not valid TOML"),
    (lambda t: t.replace("m = 64", "m = 64\ngamma = 1.5"), r"gamma must be in \[0, 1\), got 1.5"),
    (lambda t: t.replace("rho = 4", "rho = 4") + "max_rows_per_party = 0\n", "max_rows_per_party"),
    (lambda t: t.replace("step_seconds = 5", "step_seconds = 5\nreconnect_seconds = 6"),
     "reconnect_seconds = 6 is longer than step_seconds = 5"),
    (lambda t: t.replace("step_seconds = 5", "step_seconds = 5\nreconnect_seconds = -1"),
     "reconnect_seconds must be >= 0"),
])
def test_bad_job_files_name_the_problem(tmp_path, edit, match):
    (tmp_path / "j.toml").write_text(edit(JOB))
    with pytest.raises(ConfigError, match=match):
        load_job(tmp_path / "j.toml")


def test_allow_list_parses_and_refuses_bad_keys(tmp_path):
    key = identity.generate_identity()
    (tmp_path / "ok.toml").write_text(f'[parties]\na = "{identity.public_key_text(key)}"\n')
    assert load_allow_list(tmp_path / "ok.toml") == {"a": identity.public_bytes(key)}
    (tmp_path / "bad.toml").write_text('[parties]\na = "ssh-ed25519 AAAA"\n')
    with pytest.raises(ConfigError, match="bad.toml: party 'a'"):
        load_allow_list(tmp_path / "bad.toml")
    (tmp_path / "empty.toml").write_text("")
    with pytest.raises(ConfigError, match=r"\[parties\]"):
        load_allow_list(tmp_path / "empty.toml")


def test_params_survive_the_wire_json():
    for p in (FlynnJobParams(3, 64, 3, 4, 0.5, 1, 2.0, 7), RaceJobParams(8, 16, "l2", 1, 2.5, 3, 1.0)):
        assert params_from_json(type(p).__name__.lower().removesuffix("jobparams"), params_json(p)) == p
    with pytest.raises(ConfigError, match="family"):
        parse_params("race", {"rows": 1, "width": 2, "family": "cosine"})


@pytest.mark.parametrize(("job_type", "params", "match"), [
    # bandwidth = 0 used to be read as 1.0 silently
    ("race", {"rows": 4, "width": 8, "family": "l2", "bandwidth": 0}, "bandwidth must be > 0, got 0.0"),
    ("race", {"rows": 4, "width": 8, "family": "l2", "bandwidth": -2.0}, "bandwidth must be > 0"),
    # refused when the job file loads, not after parties joined
    ("race", {"rows": 4, "width": 4, "p": 3}, r"width W = 4 cannot hold the 2\^p = 8 SRP buckets"),
    ("xclp", {"n_classes": 3, "n_bits": 1024}, "'n_bits' is now called 'lsh_bits'"),
    ("xclp", {"n_classes": 3, "alpha": 1.5}, r"alpha must be in \(0, 1\)"),
    # two expected parties: t is 2 at most (and one share would be the seed itself)
    ("flynn", {"n_classes": 3, "m": 64, "s": 3, "rho": 4, "share_threshold": 3},
     "share_threshold must be 0 \\(a majority\\) or between 2 and the 2 expected parties, got 3"),
    ("flynn", {"n_classes": 3, "m": 64, "s": 3, "rho": 4, "share_threshold": 1}, "got 1"),
    ("flynn", {"n_classes": 3, "m": 64, "s": 3, "rho": 4, "share_threshold": -1}, "share_threshold"),
])
def test_job_parameters_are_validated_once_at_load(tmp_path, job_type, params, match):
    body = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in params.items())
    (tmp_path / "j.toml").write_text(f'job_id = "j"\ntype = "{job_type}"\nexpected_parties = ["a", '
                                     f'"b"]\n[params]\n{body}')
    with pytest.raises(ConfigError, match=match):
        load_job(tmp_path / "j.toml")


@pytest.mark.parametrize("job_type, params", [("flynn", {"n_classes": 2, "m": 8, "s": 2, "rho": 2}),
                                              ("race", {"rows": 4, "width": 4})])
def test_row_caps_that_would_let_uint32_counts_wrap_are_refused(job_type, params) -> None:
    """Exact counts travel as uint32 and never exceed the rows in all; caps that allow 2^32 rows
    could wrap the sum, so the job is refused with the way out; DP counts travel in 64 bits."""
    from xclp.server.config import JobConfig

    def config(**caps: object) -> JobConfig:
        return JobConfig("j", job_type, parse_params(job_type, params), ("a", "b", "c"), 2, 60.0, 60.0,
                         **caps)  # type: ignore[arg-type]

    with pytest.raises(ConfigError, match=r"with up to 6442450944 rows in all, the .* counts could pass 4294967295"):
        config(max_rows_per_party=2**31)
    config(max_rows_per_party=2**31, max_total_rows=2**32 - 1)
    config(max_rows_per_party=2**32 // 3)
    private = {**params, "epsilon": 1.0, **({"T": 4} if job_type == "flynn" else {})}
    JobConfig("j", job_type, parse_params(job_type, private), ("a", "b", "c"), 2, 60.0, 60.0, max_rows_per_party=2**31)


def test_pair_budget_is_a_fraction_or_auto_and_survives_the_wire() -> None:
    auto = parse_params("xclp", {"n_classes": 2, "pair_budget": "auto"})
    assert auto.pair_budget == "auto" and auto.candidates  # type: ignore[attr-defined]
    assert params_from_json("xclp", params_json(auto)) == auto
    assert parse_params("xclp", {"n_classes": 2, "pair_budget": 0.2}).pair_budget == 0.2  # type: ignore[attr-defined]
    for bad in ("half", "AUTO", 0.0, 1.5, True):
        with pytest.raises(ConfigError, match="pair_budget"):
            parse_params("xclp", {"n_classes": 2, "pair_budget": bad})


def test_an_unset_pair_budget_is_all_pairs_up_to_all_pairs_rows_and_auto_above() -> None:
    unset = parse_params("xclp", {"n_classes": 2})
    assert unset.pair_budget is None and unset.all_pairs_rows == 20_000  # type: ignore[attr-defined]
    assert params_from_json("xclp", params_json(unset)) == unset  # unset on the wire too: each side resolves it
    assert unset.for_rows(20_000).pair_budget == 1.0 and not unset.for_rows(20_000).candidates
    assert unset.for_rows(20_001).pair_budget == "auto" and unset.for_rows(20_001).candidates
    small = parse_params("xclp", {"n_classes": 2, "all_pairs_rows": 0})
    assert small.for_rows(1).pair_budget == "auto"  # type: ignore[attr-defined]
    given = parse_params("xclp", {"n_classes": 2, "pair_budget": 1.0, "centres": 32, "influence_tolerance": 0.0})
    assert given.for_rows(10**6) is given  # a budget and centres the job file sets stand, whatever the size
    with pytest.raises(AssertionError, match="resolve it for the run's rows first"):
        _ = unset.candidates  # type: ignore[attr-defined]
    for bad, said in ((-1, "'all_pairs_rows' must be an integer >= 0, got -1"),
                      (10**9 + 1, "all_pairs_rows must be in [0, 10^9], got 1000000001")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            parse_params("xclp", {"n_classes": 2, "all_pairs_rows": bad})


def test_an_unset_influence_tolerance_is_exact_up_to_20_000_rows_and_pushed_above() -> None:
    """docs/design.md §10.7: dense exact columns cost n floats each (2.3 GB over TLS at 3 x 18 000
    rows); above EXACT_INFLUENCE_ROWS an unset tolerance is AUTO_INFLUENCE_TOLERANCE, resolved on both
    sides from the roster's row counts; 0 keeps the exact path at any size."""
    unset = parse_params("xclp", {"n_classes": 2})
    assert unset.influence_tolerance is None  # type: ignore[attr-defined]
    assert params_from_json("xclp", params_json(unset)) == unset  # unset on the wire too
    assert unset.for_rows(20_000).tolerance == 0.0  # type: ignore[attr-defined]
    assert unset.for_rows(20_001).tolerance == 1e-4  # type: ignore[attr-defined]
    exact = parse_params("xclp", {"n_classes": 2, "influence_tolerance": 0})
    assert exact.for_rows(10**6).tolerance == 0.0  # type: ignore[attr-defined]
    given = parse_params("xclp", {"n_classes": 2, "influence_tolerance": 3e-5})
    assert given.for_rows(100).tolerance == 3e-5  # type: ignore[attr-defined]
    assert params_from_json("xclp", params_json(given)) == given
    with pytest.raises(AssertionError, match="resolve it for the run's rows first"):
        _ = unset.tolerance  # type: ignore[attr-defined]
    for bad in (-1e-4, 0.5, "small", True):
        with pytest.raises(ConfigError, match="influence_tolerance"):
            parse_params("xclp", {"n_classes": 2, "influence_tolerance": bad})


def test_a_run_state_keeps_the_resolved_parameters_and_refuses_another_jobs() -> None:
    """What `for_rows` made concrete goes into the run's state (`resolved`) and comes back whole
    (`with_resolved`) for a restarted party or coordinator, which never resolves it again; values a
    job set otherwise, or no job could have, are refused."""
    from xclp.errors import InvalidInput

    unset = parse_params("xclp", {"n_classes": 2})
    run = unset.for_rows(54_000)
    kept = run.resolved()  # type: ignore[attr-defined]
    assert kept == {"pair_budget": "auto", "centres": run.centre_count, "influence_tolerance": 1e-4}  # type: ignore
    assert unset.with_resolved(kept) == run  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="resolve the parameters"):
        unset.resolved()  # type: ignore[attr-defined]
    given = parse_params("xclp", {"n_classes": 2, "pair_budget": 0.1})
    with pytest.raises(InvalidInput, match="resolves pair_budget otherwise than this job sets"):
        given.with_resolved(kept)  # type: ignore[attr-defined]
    with pytest.raises(InvalidInput, match="a value no job could have"):
        unset.with_resolved({**kept, "influence_tolerance": 0.5})  # type: ignore[attr-defined]
    with pytest.raises(InvalidInput, match="not \\['centres', 'influence_tolerance', 'pair_budget'\\]"):
        unset.with_resolved({"pair_budget": 1.0})  # type: ignore[attr-defined]
    flynn = FlynnJobParams(n_classes=2, m=64, s=3, rho=4)
    assert flynn.resolved() == {} and flynn.with_resolved({}) is flynn
    with pytest.raises(InvalidInput, match="which this job does not have"):
        flynn.with_resolved(kept)


def test_unset_centres_grow_with_the_rows_as_both_sides_resolve_them() -> None:
    """With the defaults, 3 x 18 000 rows ran on 64 centres and cost 14.4 % of all pairs'
    ciphertexts where 256 cost 1.8 %: unset centres now follow the rows in all (about 200 per
    centre, a power of two from 64 to 4 096), resolved with pair_budget from the roster's row counts."""
    from xclp.v1.xclp import auto_centres

    assert [auto_centres(n) for n in (0, 6_000, 20_000, 54_000, 300_000, 10**8)] == [64, 64, 128, 256, 2048, 4096]
    unset = parse_params("xclp", {"n_classes": 2})
    assert unset.centres is None  # type: ignore[attr-defined]
    assert params_from_json("xclp", params_json(unset)) == unset  # unset on the wire too
    assert unset.for_rows(54_000).centre_count == 256  # type: ignore[attr-defined]
    assert parse_params("xclp", {"n_classes": 2, "centres": 64}).for_rows(54_000).centre_count == 64  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="resolve it for the run's rows first"):
        _ = unset.centre_count  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"probes \(8\) cannot pass centres \(4\)"):
        parse_params("xclp", {"n_classes": 2, "centres": 4, "probes": 8})


def test_a_job_may_set_more_centres_than_unset_ones_reach() -> None:
    """3 x 100 000 flights crowd the 2 048 centres the rows give (1.29 % of all pairs' ciphertexts where an
    even spread costs 0.19 %); 16 384 cost 0.57 %: a job may set up to 16 384, unset ones stay within 4 096
    (a party of the version before reads unset centres alike)."""
    from xclp.v1.xclp import auto_centres

    assert parse_params("xclp", {"n_classes": 2, "centres": 16384}).for_rows(300_000).centre_count == 16384  # type: ignore[attr-defined]
    assert auto_centres(10**9) == 4096
    with pytest.raises(ConfigError, match=r"centres must be in \[2, 16384\], got 16385"):
        parse_params("xclp", {"n_classes": 2, "centres": 16385})
