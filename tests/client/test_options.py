"""A party's options declared once (client/options.py): `xclp-client run`'s flags are made from the
table; party.toml, `xclp.client.run`'s keywords and agent.toml are read and checked by it; an error
names the option the way the user gave it; a switch written as text is never read as true."""

from __future__ import annotations

import argparse
import inspect
from dataclasses import fields
from pathlib import Path

import pytest

import xclp.client
from xclp.client import cli, options
from xclp.client.agent import AgentConfig
from xclp.client.options import OPTIONS, Source
from xclp.client.policy import PartyPolicy
from xclp.errors import ConfigError, PolicyRefused

AGENT_TOML = 'party = "a"\nidentity = "a.key"\npeers = "allow.toml"\ncoordinator = "localhost:1"\nout = "out"\n'
DATASETS = '[datasets.demo]\npath = "a.csv"\n'


def run_flags() -> dict[str, argparse.Action]:
    parser = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    return {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}


def test_the_run_flags_are_made_from_the_options_and_nothing_else() -> None:
    flags = run_flags()
    assert set(flags) == {o.name for o in options.given(Source.FLAG)}
    for name, action in flags.items():
        option = OPTIONS[name]
        assert action.option_strings[0] == option.flag and action.default is None  # a party.toml fills the rest
        assert action.help == (argparse.SUPPRESS if option.hidden else option.help)


def test_the_api_keywords_are_the_options_with_the_options_defaults() -> None:
    signature = inspect.signature(xclp.client.run).parameters
    keywords = {name: p.default for name, p in signature.items() if name != "progress"}
    assert set(keywords) == {o.name for o in options.given(Source.API)}
    required = {name for name, default in keywords.items() if default is inspect.Parameter.empty}
    assert required == {"job", "coordinator", "identity", "peers", "data"}
    assert all(OPTIONS[name].default is None for name in required)
    assert {n: d for n, d in keywords.items() if n not in required} == {
        name: OPTIONS[name].default for name in keywords if name not in required}


def test_the_policy_and_the_agent_take_their_defaults_from_the_options() -> None:
    for f in fields(PartyPolicy):
        if f.name == "named":  # how the settings were given, not one of them
            continue
        assert Source.POLICY in OPTIONS[f.name].sources and f.default == OPTIONS[f.name].default, f.name
    agent = {f.name: f.default for f in fields(AgentConfig)}
    for name in ("poll_seconds", "max_runs", "join_deadline", "min_key_bits", "max_key_bits", "idle_timeout"):
        assert agent[name] == OPTIONS[name].default, name
    assert agent["join_wait"] == OPTIONS["connect_timeout"].default


def test_agent_toml_takes_every_agent_and_policy_option_and_no_other(tmp_path) -> None:
    (tmp_path / "agent.toml").write_text(AGENT_TOML + "poll_secs = 1\n" + DATASETS)
    with pytest.raises(ConfigError, match="unknown key.*poll_secs; known: .*poll_seconds"):
        AgentConfig.load(tmp_path / "agent.toml")
    (tmp_path / "agent.toml").write_text(AGENT_TOML + "[policy]\nrejoins = 1\n" + DATASETS)
    with pytest.raises(ConfigError, match=r"\[policy\]: unknown key\(s\) rejoins"):
        AgentConfig.load(tmp_path / "agent.toml")
    assert options.keys(Source.AGENT) | options.keys(Source.POLICY) >= {"max_runs", "min_parties", "job_types"}


# (where, how the option is named there, a way to give it)
def _flag(tmp_path: Path, name: str, value: object) -> None:
    flag = OPTIONS[name].flag
    argv = ["run", "--job", "j", "--party", "a", "--identity", "a.key", "--coordinator", "h:1", "--data", "d.csv",
            "--peers", "allow.toml", "--out", str(tmp_path)]
    argv += [flag] if value is True else [flag, str(value)]
    cli.run(cli._parser().parse_args(argv))


def _run_toml(tmp_path: Path, name: str, value: object) -> None:
    toml = tmp_path / "party.toml"
    toml.write_text(f"{name} = {_toml(value)}\n")
    cli.run(cli._parser().parse_args(["run", "--config", str(toml)]))


def _api(tmp_path: Path, name: str, value: object) -> None:
    xclp.client.run(job="j", coordinator="127.0.0.1:9", identity="no.key", peers="no.toml", data="no.csv",
                    **{name: value})


def _agent(tmp_path: Path, name: str, value: object) -> None:
    table = "[policy]\n" if Source.POLICY in OPTIONS[name].sources else ""
    (tmp_path / "agent.toml").write_text(AGENT_TOML.replace("[policy]", "") + table + f"{name} = {_toml(value)}\n"
                                         + DATASETS)
    AgentConfig.load(tmp_path / "agent.toml")


def _toml(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


PLACES = {"flag": (_flag, "--min-parties"), "party.toml": (_run_toml, "min_parties in {dir}/party.toml"),
          "api": (_api, "min_parties"), "agent.toml": (_agent, "[policy] min_parties in {dir}/agent.toml")}


@pytest.mark.parametrize("place", PLACES)
def test_a_bad_setting_is_named_the_way_it_was_given(tmp_path, monkeypatch, place) -> None:
    """`min_parties = 1` in each of the four places: refused before anything else is read (there is
    no key, data or coordinator here), naming the option as the user wrote it there, with the
    reason. Before, the flag's and the API's were PolicyRefused naming --min-parties in every
    case."""
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)
    give, named = PLACES[place]
    with pytest.raises(ConfigError) as refused:
        give(tmp_path, "min_parties", 1)
    assert not isinstance(refused.value, PolicyRefused)
    assert str(refused.value) == (named.format(dir=tmp_path) + " must be a whole number >= 2 (masking a sum of one "
                                  "reveals it), got 1")


@pytest.mark.parametrize("place", ["party.toml", "api", "agent.toml"])
@pytest.mark.parametrize("name", ["insecure", "allow_rerun", "allow_hide_label_mask", "insecure_workers"])
def test_a_switch_written_as_text_is_refused_never_read_as_true(tmp_path, monkeypatch, place, name) -> None:
    """`insecure = "false"`: before, every one of these was read with bool(), so the text "false"
    turned on plaintext gRPC, a rerun among other parties or a hidden label mask."""
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)
    if place == "agent.toml" and not OPTIONS[name].sources & (Source.AGENT | Source.POLICY):
        pytest.skip("not an agent's setting")
    give = PLACES[place][0]
    with pytest.raises(ConfigError, match=f"{name}.* must be true or false, got 'false'"):
        give(tmp_path, name, "false")


@pytest.mark.parametrize(("name", "value", "says"), [
    ("connect_timeout", -1.0, "connect_timeout must be a number >= 0, got -1.0"),
    ("idle_timeout", 0, "idle_timeout must be a number > 0, got 0"),
    ("rejoins", 1.5, "rejoins must be a whole number >= 0, got 1.5"),
    ("require_dp", 0, "require_dp must be a positive epsilon, got 0"),
    ("validate", 1.0, "validate must be a fraction in (0, 1), got 1.0"),
    ("max_memory_gb", float("nan"), "max_memory_gb must be a number >= 0, got nan"),
    ("workers", 2.5, "workers must be a number of processes or a scheduler address, got 2.5"),
    ("paillier_bits", "2048", "paillier_bits must be a whole number >= 0, got '2048'"),
    ("label_column", 3, "label_column must be text, got 3"),
    # None where it does not mean "unset": refused, not carried on to fail later (a None rejoins was
    # a TypeError in take_part)
    ("rejoins", None, "rejoins must be a whole number >= 0, got None"),
    ("min_parties", None, "min_parties must be a whole number >= 2 (masking a sum of one reveals it), got None"),
    ("insecure", None, "insecure must be true or false, got None"),
])
def test_the_api_refuses_a_bad_keyword_by_its_name_before_anything(name, value, says) -> None:
    with pytest.raises(ConfigError) as refused:
        _api(Path("."), name, value)
    assert str(refused.value) == says


def test_a_flag_wins_over_its_old_name_in_the_file_and_both_names_in_one_place_are_refused(tmp_path) -> None:
    toml = tmp_path / "party.toml"
    toml.write_text("join_wait = -5\n")  # the old name of connect_timeout, wrong: the flag replaces it
    assert cli._read_party_toml(toml, without={"connect_timeout"}) == {}
    toml.write_text("join_wait = 5\nconnect_timeout = 6\n")
    with pytest.raises(ConfigError, match="give connect_timeout in .* or its old name join_wait in .*, not both"):
        cli._read_party_toml(toml)
    toml.write_text('join_wait = 5\nstate = "s"\n')
    assert cli._read_party_toml(toml) == {"connect_timeout": 5.0, "state": tmp_path / "s"}


def test_a_policy_made_in_python_is_held_to_the_same_bounds() -> None:
    with pytest.raises(PolicyRefused, match="--min-parties must be a whole number >= 2"):
        PartyPolicy(min_parties=1)
    assert PartyPolicy.from_settings({"min_parties": 4, "require_dp": None}) == PartyPolicy(min_parties=4)


def test_a_refusal_names_the_setting_that_decided_as_it_was_given(tmp_path) -> None:
    """A job expecting 3 parties, refused by min_parties = 4 given in three places: the refusal
    says which setting decided, as it was given. Before, an agent's operator read "--min-parties",
    a flag no agent takes."""
    from xclp.client.options import Where
    from xclp.v1 import xclp_pb2 as pb
    from xclp.v1.registry import parse_params

    spec = pb.JobSpec(job_id="j", job_type="flynn", expected_parties=["a", "b", "c"], min_parties=2)
    params = parse_params("flynn", {"n_classes": 3, "m": 256, "s": 3, "rho": 8})
    (tmp_path / "agent.toml").write_text(AGENT_TOML + "[policy]\nmin_parties = 4\n" + DATASETS)
    agent = AgentConfig.load(tmp_path / "agent.toml").policy
    api = PartyPolicy.from_settings({"min_parties": 4}, named=Where(Source.API).named)
    for policy, named in ((agent, f"[policy] min_parties in {tmp_path}/agent.toml"), (api, "min_parties"),
                          (PartyPolicy(min_parties=4), "--min-parties")):
        with pytest.raises(PolicyRefused) as refused:
            policy.check_job(spec, params)
        assert str(refused.value).endswith(f"this party masks with at least 4 ({named})")
