"""The party agent's own decisions on offered runs (client/agent.py), its config, and docs/operating.md's
examples of the agent and a job naming data sets (no network: the offers are built here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import save_identity
from xclp.client.agent import Agent, AgentConfig
from xclp.client.api import PartyResult
from xclp.client.outputs import write_run_dir
from xclp.client.run_config import JobResult
from xclp.crypto import identity
from xclp.data.party_table import PartyData
from xclp.errors import ConfigError, PolicyRefused
from xclp.server.config import parse_job
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.registry import params_json, parse_params

OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


def readme_block(marker: str) -> str:
    text = OPERATING.read_text()
    return re.search(r"```toml\n# " + re.escape(marker) + r"\n(.*?)```", text, re.S).group(1)


@pytest.fixture
def agent(tmp_path) -> Agent:
    key = identity.generate_identity()
    save_identity(key, tmp_path / "a.key")
    (tmp_path / "allow.toml").write_text(f'[parties]\na = "{identity.public_key_text(key)}"\n')
    (tmp_path / "agent.toml").write_text(
        'party = "a"\nidentity = "a.key"\npeers = "allow.toml"\ncoordinator = "localhost:1"\nout = "out"\n'
        '[policy]\njob_types = ["xclp", "flynn"]\nmin_parties = 3\nmin_key_bits = 2048\nmax_key_bits = 3072\n'
        '[datasets.demo]\npath = "a.csv"\n')
    return Agent(AgentConfig.load(tmp_path / "agent.toml"), say=lambda m: None)


def offer(job_type: str, params: dict, *, dataset: str | None = "demo", parties=("a", "b", "c")) -> pb.Offer:
    spec = pb.JobSpec(job_id="j", job_type=job_type, params_json=params_json(parse_params(job_type, params)),
                      expected_parties=list(parties), min_parties=2,
                      datasets=dict.fromkeys(parties, dataset) if dataset else {})
    return pb.Offer(run_id="1", spec=spec)


FLYNN = {"n_classes": 2, "m": 64, "s": 2, "rho": 4}


def test_the_agent_takes_what_its_policy_accepts_and_says_why_it_refuses_the_rest(agent):
    params, dataset = agent.check(offer("flynn", FLYNN))
    assert dataset.path.name == "a.csv" and params.m == 64
    refusals = {
        "job type 'race' is not among this agent's job_types": offer("race", {"rows": 4, "width": 8}),
        "names no data set for this party": offer("flynn", FLYNN, dataset=None),
        "data set 'icu', which is not in this agent's catalogue (demo)": offer("flynn", FLYNN, dataset="icu"),
        "expects 2 parties; this party masks with at least 3": offer("flynn", FLYNN, parties=("a", "b")),
        "4096-bit Paillier keys; this agent takes 2048 to 3072": offer("xclp", {"n_classes": 2, "key_bits": 4096}),
    }
    for reason, refused in refusals.items():
        with pytest.raises(PolicyRefused, match=re.escape(reason)):
            agent.check(refused)


def test_an_offered_run_is_decided_once(agent):
    taken: list[str] = []
    agent.check = lambda o: (_ for _ in ()).throw(PolicyRefused("no"))  # type: ignore[method-assign]
    agent.say = taken.append
    agent.consider(offer("flynn", FLYNN))
    agent.consider(offer("flynn", FLYNN))
    assert taken == ["refused run 1 of job j: no"]


def test_run_1_of_another_job_is_another_run(agent):
    """The agent remembered runs by run id alone, so run "1" of a second job was skipped."""
    said: list[str] = []
    agent.check = lambda o: (_ for _ in ()).throw(PolicyRefused("no"))  # type: ignore[method-assign]
    agent.say = said.append
    other = offer("flynn", FLYNN)
    other.spec.job_id = "k"
    for o in (offer("flynn", FLYNN), other, offer("flynn", FLYNN)):
        agent.consider(o)
    assert said == ["refused run 1 of job j: no", "refused run 1 of job k: no"]


def test_the_agent_takes_part_in_at_most_max_runs_at_once_and_takes_the_rest_later(agent, monkeypatch):
    """Attack: a coordinator offered 20 runs and the agent joined them all at once (23
    processes of 0.5-1 GB). With max_runs = 2 the third waits, is said once, and is taken when a
    place frees up."""
    import threading

    said: list[str] = []
    agent.say = said.append
    release = threading.Event()
    started: list[str] = []

    def fake_run(o, params, dataset, active):
        started.append(o.run_id)
        release.wait(10)
        with agent.lock:
            agent.finished[(o.spec.job_id, o.run_id)] = True
            agent.active.pop((o.spec.job_id, o.run_id), None)

    monkeypatch.setattr(agent, "_run", fake_run)
    offers = []
    for i in range(3):
        o = offer("flynn", FLYNN)
        o.run_id = str(i + 1)
        offers.append(o)
    for _ in range(2):  # two polls while two runs are under way
        for o in offers:
            agent.consider(o)
    assert sorted(started) == ["1", "2"] and len(agent.active) == 2
    assert [m for m in said if "waits" in m] == ["run 3 of job j waits: 2 runs are under way (max_runs = 2)"]
    release.set()
    for a in list(agent.active.values()):
        assert a.thread is not None
        a.thread.join(10)
    agent.consider(offers[2])
    assert "3" in started


def test_a_job_names_data_sets_never_paths():
    head = 'job_id = "j"\ntype = "flynn"\nexpected_parties = ["a", "b"]\n'
    tail = "[params]\nn_classes = 2\nm = 64\ns = 2\nrho = 4\n"
    assert parse_job(head + 'dataset = "demo"\n[datasets]\nb = "other"\n' + tail, "j.toml", None).datasets == \
        {"a": "demo", "b": "other"}
    for bad, reason in (('dataset = "/srv/data/a.csv"\n', "must be a catalogue name"),
                        ('dataset = "../a"\n', "must be a catalogue name"),
                        ('[datasets]\nz = "demo"\n', "not an expected party")):
        with pytest.raises(ConfigError, match=reason):
            parse_job(head + bad + tail, "j.toml", None)
    xclp = 'job_id = "x"\ntype = "xclp"\nexpected_parties = ["a", "b"]\nsummary = "s.json"\n[params]\nn_classes = 2\n'
    # under root/<job_id>
    assert parse_job(xclp, "x.toml", Path("/srv/jobs")).summary_path == Path("/srv/jobs/x/s.json")
    with pytest.raises(ConfigError, match="climbs out with '..'"):
        parse_job(head + 'model = "../../etc/x.npz"\n' + tail.replace("flynn", "flynn"), "j.toml", Path("/tmp/jobs/j"))


def test_the_readme_examples_load(tmp_path):
    (tmp_path / "agent.toml").write_text(readme_block("agent.toml"))
    config = AgentConfig.load(tmp_path / "agent.toml")
    assert config.party == "hospital-a" and set(config.datasets) == {"icu-2026"}
    assert config.job_types == {"xclp", "flynn"} and (config.min_key_bits, config.max_key_bits) == (2048, 4096)
    text = OPERATING.read_text()
    job = re.search(r'```toml\n(job_id = "xclp-icu".*?)```', text, re.S).group(1)
    hospitals = ("hospital-a", "hospital-b", "hospital-c")
    assert parse_job(job, "xclp-icu.toml", None).datasets == dict.fromkeys(hospitals, "icu-2026")


def test_a_run_directory_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    import numpy as np

    data = PartyData(np.zeros((2, 3)), np.array([0, -1]), ("r0", "r1"))
    result = JobResult("xclp", parse_params("xclp", {"n_classes": 2}), 3, b"s" * 32, np.array([[0.2, 0.8], [0.9, 0.1]]),
                       ("a", "b", "c"))
    path = write_run_dir(tmp_path, "j", "5", PartyResult(result, data))
    assert sorted(p.name for p in path.iterdir()) == ["predictions.csv", "run.json"]
    import xclp.client.outputs as outputs

    def broken(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "write_atomic", broken)
    with pytest.raises(OSError):
        write_run_dir(tmp_path, "j", "6", PartyResult(result, data))
    assert sorted(p.name for p in (tmp_path / "j").iterdir()) == ["5"]  # no 6, no partial left


def test_with_runs_the_agent_stops_after_that_many_and_remembers_which_were_done(agent, monkeypatch):
    import threading

    offers = [offer("flynn", FLYNN), offer("flynn", FLYNN)]
    offers[1].run_id = "2"
    polls = []

    def poll(stub):
        polls.append(1)
        return offers

    def fake_run(o, params, dataset, active):
        with agent.lock:
            agent.finished[(o.spec.job_id, o.run_id)] = o.run_id == "1"
            agent.active.pop((o.spec.job_id, o.run_id), None)

    monkeypatch.setattr(agent, "poll", poll)
    monkeypatch.setattr(agent, "_run", fake_run)
    agent.config = type(agent.config)(**{**agent.config.__dict__, "poll_seconds": 0.01})
    stop = threading.Event()
    done = threading.Thread(target=agent.serve, args=(stop,), kwargs={"runs": 2})
    done.start()
    done.join(10)
    assert not done.is_alive(), "the agent must stop by itself after its runs"
    job = offers[0].spec.job_id
    assert agent.finished == {(job, "1"): True, (job, "2"): False}


def test_a_hostile_coordinator_cannot_steer_outputs_out_of_the_output_directory(agent, tmp_path):
    """The run and job ids name the output directory: from the coordinator, they are refused unless
    each is one plain path component."""
    import numpy as np

    for job_id, run_id in (("j", "../../escape"), ("..", "1"), ("j", "."), ("j", ""), ("a/b", "1")):
        hostile = offer("flynn", FLYNN)
        hostile.spec.job_id, hostile.run_id = job_id, run_id
        with pytest.raises(PolicyRefused, match="not a plain directory name"):
            agent.check(hostile)
    data = PartyData(np.zeros((1, 3)), np.array([0]), ("r0",))
    result = JobResult("xclp", parse_params("xclp", {"n_classes": 2}), 3, b"s" * 32, np.array([[0.2, 0.8]]), ("a",))
    with pytest.raises(PolicyRefused, match="not a plain directory name"):
        write_run_dir(tmp_path / "out", "j", "../escape", PartyResult(result, data))
    assert not (tmp_path / "escape").exists()


def test_the_agents_workers_are_processes_or_its_own_tls_scheduler(agent, tmp_path):
    base = (tmp_path / "agent.toml").read_text()
    for line, expected in [('workers = 2\n', "2"), ('workers = "tls://dask.internal:8786"\n', "tls://dask.internal:8786"),
                           ('workers = "tcp://dask.internal:8786"\ninsecure_workers = true\n',
                            "tcp://dask.internal:8786")]:
        (tmp_path / "agent.toml").write_text(line + base)
        assert str(AgentConfig.load(tmp_path / "agent.toml").workers) == expected
    (tmp_path / "agent.toml").write_text('workers = "tcp://dask.internal:8786"\n' + base)
    with pytest.raises(ConfigError, match="tcp:// sends them in the clear"):
        AgentConfig.load(tmp_path / "agent.toml")


def test_the_agents_runs_share_one_ledger_with_its_budget(tmp_path, monkeypatch):
    """The agent path: every run an agent takes part in is accounted in one ledger (its
    `state` directory), with the [policy] privacy_budget, and sealed under the agent's key."""
    import xclp.client.agent as agent_module
    from xclp.client.ledger import Budget

    key = identity.generate_identity()
    save_identity(key, tmp_path / "a.key")
    (tmp_path / "allow.toml").write_text(f'[parties]\na = "{identity.public_key_text(key)}"\n')
    (tmp_path / "a.csv").write_text("f0,label\n1,0\n2,1\n")
    (tmp_path / "agent.toml").write_text(
        'party = "a"\nidentity = "a.key"\npeers = "allow.toml"\ncoordinator = "localhost:1"\nout = "out"\n'
        'state = "state"\n[policy]\nprivacy_budget = [3.0, 1e-6]\n[datasets.demo]\npath = "a.csv"\n')
    agent = Agent(AgentConfig.load(tmp_path / "agent.toml"), say=lambda m: None)
    assert agent.ledger is not None and agent.ledger.directory == tmp_path / "state"
    assert agent.ledger.budget == Budget(3.0, 1e-6)
    seen = []
    monkeypatch.setattr(agent_module, "take_part", lambda config, data, **kw: seen.append(config.ledger) or 1 / 0)
    for run in ("1", "2"):
        o = offer("flynn", FLYNN)
        o.run_id = run
        agent._run(o, parse_params("flynn", FLYNN), agent.config.datasets["demo"], agent_module._Active("j"))
    assert seen == [agent.ledger, agent.ledger]


def test_a_bad_privacy_budget_is_named_the_way_it_was_given(tmp_path, monkeypatch) -> None:
    """One budget, four ways in, each error naming the setting as the user wrote it: an agent's
    [policy] privacy_budget, a run.toml's privacy_budget, the flag, the API's keyword. Before, every
    one said "--privacy-budget", which an agent's operator never typed."""
    import xclp.client.cli as cli
    from xclp.client.budget import Budget

    agent_toml = tmp_path / "agent.toml"
    agent_toml.write_text('party = "a"\nidentity = "a.key"\npeers = "allow.toml"\ncoordinator = "localhost:1"\n'
                          'out = "out"\n[policy]\nprivacy_budget = [3.0, 2.0]\n[datasets.demo]\npath = "a.csv"\n')
    with pytest.raises(ConfigError, match=r"\[policy\] privacy_budget in .*agent.toml: a privacy budget's delta must "
                                          r"be in \[0, 1\), got 2.0"):
        AgentConfig.load(agent_toml)
    run_toml = tmp_path / "run.toml"
    run_toml.write_text('privacy_budget = "ten"\n')
    args = cli._parser().parse_args(["run", "--config", str(run_toml)])
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)
    with pytest.raises(ConfigError, match=r"^privacy_budget in .*run.toml takes EPS or EPS,DELTA .* got 'ten'"):
        cli.run(args)
    flag = cli._parser().parse_args(["run", "--config", str(run_toml), "--privacy-budget", "1,2,3"])
    with pytest.raises(ConfigError, match=r"^--privacy-budget takes EPS or EPS,DELTA .* got '1,2,3'"):
        cli.run(flag)  # the flag wins over the file, and is named
    with pytest.raises(ConfigError, match=r"^privacy_budget: a privacy budget's epsilon must be > 0"):
        Budget.of(-1.0, "privacy_budget")
