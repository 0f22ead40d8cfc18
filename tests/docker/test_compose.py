"""The compose demo (docker-compose.yml, docker/): a coordinator service, three institutions'
agents and the one-shot `submit` service in real containers, on the real engine, with real faults
(docs/design.md §5 dropouts).

Each Docker test runs its own compose project (unique `-p` name, so its containers, network and
volumes are its own) and takes it down with `down -v` afterwards, also when it fails. The fault
tests submit the XCLP job alone with a short step deadline (XCLP_JOBS_DIR, XCLP_AGENT_RUNS=1) and
stop or disconnect hospital-b as soon as it reports that SecureHamming has started.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.docker.conftest import REPO

PARTIES = ("hospital-a", "hospital-b", "hospital-c")
SERVICES = ("setup", "coordinator", *PARTIES, "submit")
DEMO_DATA = REPO / "xclp" / "demo_data"
JOBS = REPO / "docker" / "jobs"
# `docker compose` (v2) where installed, else docker-compose (v1.29): the file is written for both.
COMPOSE = ["docker", "compose"] if shutil.which("docker-compose") is None else ["docker-compose"]
# A summary table line: institution, unlabeled rows, XCLP, alone, FlyNN together, FlyNN alone;
# in `up`'s output after compose's "submit_1  | " (v1) or "submit-1  | " (v2) prefix.
TABLE_LINE = re.compile(r"^(?:[\w.-]+\s*\|\s)?(hospital-[abc])\s+(\d+)\s+([\d.]+|-)\s+([\d.]+)"
                        r"\s+([\d.]+|-)\s+([\d.]+|-)\s*$", re.M)


def run(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 120,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


@dataclass
class Project:
    """One compose project of the demo; `env` holds the compose file's settings (XCLP_*)."""

    image: str
    name: str = field(default_factory=lambda: f"xclp-test-{uuid.uuid4().hex[:10]}")
    env: dict[str, str] = field(default_factory=dict)
    overrides: list[Path] = field(default_factory=list)  # compose files on top of docker-compose.yml
    profiles: list[str] = field(default_factory=list)  # compose profiles on (e.g. "cluster")

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "XCLP_IMAGE": self.image, **self.env}
        files = [arg for f in [REPO / "docker-compose.yml", *self.overrides] for arg in ("-f", str(f))]
        profiles = [arg for p in self.profiles for arg in ("--profile", p)]
        return run([*COMPOSE, "-p", self.name, *files, *profiles, *args], env=env, timeout=timeout, check=check)

    def container(self, service: str) -> str:
        cid = self.compose("ps", "--all", "-q", service).stdout.strip()
        assert cid, f"no container for service {service}"
        return cid

    def state(self, service: str) -> dict[str, object]:
        state: dict[str, object] = json.loads(run(["docker", "inspect", "--format", "{{json .State}}",
                                                   self.container(service)]).stdout)
        return state

    def wait_exit(self, service: str, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(service)
            if not state["Running"]:
                return int(state["ExitCode"])  # type: ignore[call-overload]
            time.sleep(1.0)
        raise AssertionError(f"{service} still runs after {timeout:.0f}s:\n{self.logs(service)[-3000:]}")

    def logs(self, service: str) -> str:
        done = run(["docker", "logs", self.container(service)])
        return done.stdout + done.stderr

    def read(self, volume: str, path: str) -> str | None:
        """A file of one of the project's volumes (None if it is not there), read in a throwaway
        container; `path` may hold a shell glob (the first match is read)."""
        done = run(["docker", "run", "--rm", "-v", f"{self.volume(volume)}:/v:ro", self.image,
                    "sh", "-c", f'set -- /v/{path}; [ -e "$1" ] || exit 3; cat "$1"'], check=False)
        if done.returncode == 3:
            return None
        assert done.returncode == 0, done.stderr
        return done.stdout

    def volume(self, name: str) -> str:
        # docker-compose v1 names volumes <project>_<name> (v2 too), with the project name normalised
        return f"{re.sub(r'[^-_a-z0-9]', '', self.name.lower())}_{name}"

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "2", timeout=180, check=False)


@pytest.fixture
def project(image: str) -> Iterator[Project]:
    made = Project(image)
    try:
        yield made
    finally:
        made.down()


def own_row_ids(party: str) -> list[str]:
    with open(DEMO_DATA / f"{party}.csv", newline="") as fh:
        return [row["row_id"] for row in csv.DictReader(fh)]


def labeled_rows(party: str) -> int:
    with open(DEMO_DATA / f"{party}.csv", newline="") as fh:
        return sum(row["label"] != "" for row in csv.DictReader(fh))


def xclp_accuracy(party: str, predictions_csv: str) -> float:
    """Accuracy on the party's unlabeled rows, computed here from its predictions and the truth file."""
    with open(DEMO_DATA / f"{party}.csv", newline="") as fh:
        unlabeled = {r["row_id"] for r in csv.DictReader(fh) if r["label"] == ""}
    with open(DEMO_DATA / f"{party}.truth.csv", newline="") as fh:
        truth = {r["row_id"]: int(r["true_label"]) for r in csv.DictReader(fh)}
    predicted = {r["row_id"]: int(r["label"]) for r in csv.DictReader(predictions_csv.splitlines())}
    return sum(predicted[i] == truth[i] for i in unlabeled) / len(unlabeled)


def check_predictions(project: Project, party: str) -> str:
    """The party's predictions.csv: its own row ids, in order, each with a label and confidence."""
    text = project.read(f"{party}-results", "runs/xclp-demo/*/predictions.csv")
    assert text is not None, f"{party} has no predictions.csv:\n{project.logs(party)[-3000:]}"
    rows = list(csv.DictReader(text.splitlines()))
    assert list(rows[0])[:3] == ["row_id", "label", "confidence"]  # the id column as the hospital's CSV names it
    assert [r["row_id"] for r in rows] == own_row_ids(party)
    assert all(0 <= int(r["label"]) < 10 and 0.0 <= float(r["confidence"]) <= 1.0 for r in rows)
    return text


def fault_jobs(tmp_path: Path, step_seconds: int | None = 40) -> Path:
    """The demo's XCLP job alone, with a 40 s step deadline (a silent party is dropped soon; the
    first step, LSH with numba compiling in fresh containers, took 11 s on an idle machine and
    over 20 s, the deadline this had before, on a loaded one) unless
    `step_seconds` is None, readable by the image's user (uid 10001)."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    xclp = (JOBS / "xclp-demo.toml").read_text()
    if step_seconds is not None:
        xclp = re.sub(r"(?m)^step_seconds = \d+", f"step_seconds = {step_seconds}", xclp)
    (jobs / "xclp-demo.toml").write_text(xclp)
    for path in (tmp_path, jobs, *jobs.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return jobs


def wait_for_log(project: Project, service: str, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in project.logs(service):
            return
        time.sleep(0.2)
    raise AssertionError(f"{service} never logged {needle!r}:\n{project.logs(service)[-3000:]}")


def say(message: str) -> None:
    print(f"[compose test] {message}", file=sys.stderr, flush=True)


# --- the summary script alone (no Docker) --------------------------------------------------------


def _summary(tmp_path: Path, predictions: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """summary.py on the records of a done XCLP run (run 1) and FlyNN run (run 2) of all three, with
    the given predictions as the agents' outputs and no FlyNN model anywhere."""
    results = tmp_path / "results"
    for party in PARTIES:
        (results / party).mkdir(parents=True)
    for party, text in predictions.items():
        (results / party / "runs" / "xclp-demo" / "1").mkdir(parents=True)
        (results / party / "runs" / "xclp-demo" / "1" / "predictions.csv").write_text(text)
    joined = [{"party_id": p, "state": "joined", "reason": ""} for p in PARTIES]
    runs = [{"run_id": str(i), "job_id": job, "state": "done", "parties": joined, "steps": [], "bytes_total": "0"}
            for i, job in ((1, "xclp-demo"), (2, "flynn-demo"))]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    cmd = [sys.executable, str(REPO / "docker" / "summary.py"), "--runs", str(tmp_path / "runs.json"), "--jobs",
           str(JOBS), "--data", str(DEMO_DATA), "--results", str(results)]
    return run(cmd, env={**os.environ, "XCLP_SUMMARY_GRACE": "0"}, check=False)


def test_summary_scores_predictions_against_the_truth_and_reports_what_is_missing(tmp_path: Path) -> None:
    perfect = {}
    for party in ("hospital-a", "hospital-b"):
        with open(DEMO_DATA / f"{party}.truth.csv", newline="") as fh:
            perfect[party] = "id,label,confidence\n" + "".join(f"{r['row_id']},{r['true_label']},1.0\n"
                                                             for r in csv.DictReader(fh))
    done = _summary(tmp_path, perfect)
    table = {m[0]: m[1:] for m in TABLE_LINE.findall(done.stdout)}
    assert done.returncode == 1, "hospital-c has no results: the summary must not claim success"
    assert table["hospital-a"][1] == table["hospital-b"][1] == "1.000"
    assert table["hospital-c"][1] == "-"
    assert ("hospital-c: no predictions.csv: no outputs of xclp-demo run 1 (see hospital-c's log); "
            "no FlyNN model: no outputs of flynn-demo run 2") in done.stdout
    assert "XCLP job xclp-demo: run 1 done" in done.stdout


def test_summary_refuses_predictions_for_rows_that_are_not_the_institutions(tmp_path: Path) -> None:
    foreign = "id,label,confidence\n" + "".join(f"{i},0,1.0\n" for i in own_row_ids("hospital-b"))
    done = _summary(tmp_path, {"hospital-a": foreign})
    assert done.returncode == 1
    assert "hospital-a: unreadable predictions.csv" in done.stdout
    assert "does not hold exactly the institution's own row ids" in done.stdout


# --- the demo in real containers ------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_compose_up_runs_the_demo_and_every_service_exits_0(project: Project) -> None:
    started = time.monotonic()
    up = project.compose("up", "--no-color", timeout=600, check=False)
    seconds = time.monotonic() - started
    say(f"`up` (2048-bit Paillier, L = 1024, both jobs) took {seconds:.1f}s")
    out = up.stdout + up.stderr
    assert up.returncode == 0, out[-5000:]
    codes = {s: project.state(s)["ExitCode"] for s in SERVICES}
    assert codes == dict.fromkeys(SERVICES, 0), out[-5000:]

    # Each institution saw only its own CSV: no truth file, no other institution's data.
    for party in PARTIES:
        mounts = json.loads(run(["docker", "inspect", "--format", "{{json .Mounts}}", project.container(party)]).stdout)
        data = sorted(m["Source"] for m in mounts if m["Destination"].startswith("/data"))
        assert data == [str(DEMO_DATA / f"{party}.csv")]
    # The dev CA's key lives in a volume that setup alone mounts; the operator's key, setup and submit.
    ca_volume, operator_volume = project.volume("ca"), project.volume("operator")
    for service in SERVICES:
        inspect = run(["docker", "inspect", "--format", "{{json .Mounts}}", project.container(service)])
        mounts = json.loads(inspect.stdout)
        names = [m.get("Name") for m in mounts]
        assert (ca_volume in names) == (service == "setup"), service
        assert (operator_volume in names) == (service in ("setup", "submit")), service

    table = {m[0]: m[1:] for m in TABLE_LINE.findall(out)}
    assert sorted(table) == list(PARTIES), out[-5000:]
    for party in PARTIES:
        predictions = check_predictions(project, party)
        unlabeled, together, alone, flynn, flynn_alone = table[party]
        assert int(unlabeled) == len(own_row_ids(party)) - labeled_rows(party)
        # The table's XCLP number is the accuracy of exactly what the institution wrote.
        assert float(together) == pytest.approx(xclp_accuracy(party, predictions), abs=5e-4)
        say(f"{party}: XCLP {together}, alone {alone}, FlyNN {flynn} (alone {flynn_alone})")
    labeled = sum(labeled_rows(p) for p in PARTIES)
    assert re.search(rf"identical everywhere;\n(\S+\s*\| )?  trained on {labeled} labeled rows in all", out)
    assert "dropped: none" in out
    # XCLP's point (Scott et al. 2023 §4): propagating across institutions beats each one alone. The demo's
    # data were chosen so that XCLP beats every institution's own LP for every common seed tried.
    assert sum(float(table[p][1]) for p in PARTIES) > sum(float(table[p][2]) for p in PARTIES)
    run_summary = json.loads(project.read("coordinator", "state/jobs/xclp-demo/xclp-demo.summary.json") or "{}")
    assert run_summary["outcome"] == "done" and run_summary["graph_parties"] == list(PARTIES)
    # the coordinator kept both runs in its state file, and the agents wrote each into runs/<job>/<run>/
    # the demo's first run, the XCLP one its table shows first, is run 1 (it was run 2: the FlyNN job's
    # file sorts first, and run ids count a coordinator's runs, not a job's)
    assert re.search(r"XCLP job xclp-demo: run 1 done in", out)
    assert re.search(r"FlyNN job flynn-demo: run 2 done", out)
    for party in PARTIES:
        meta = json.loads(project.read(f"{party}-results", "runs/flynn-demo/*/run.json") or "{}")
        assert meta["files"] == ["model.npz"] and meta["participants"] == list(PARTIES)
    say(f"XCLP job {run_summary['total_seconds']:.1f}s; steps: "
        + ", ".join(f"{k} {v['seconds']:.1f}s" for k, v in run_summary["steps"].items() if v.get("seconds")))


def _fault_run(project: Project, tmp_path: Path, fault: Callable[[str], None]) -> dict[str, object]:
    """Starts the demo with the XCLP job alone and a short step deadline, applies `fault` to
    hospital-b's container as soon as it starts SecureHamming, waits for the others; returns the
    coordinator's run summary."""
    project.env.update({"XCLP_JOBS_DIR": str(fault_jobs(tmp_path)), "XCLP_AGENT_RUNS": "1",
                        "XCLP_SUMMARY_GRACE": "10"})
    started = time.monotonic()
    project.compose("up", "--detach", timeout=180)  # returns once the institutions run
    wait_for_log(project, "hospital-b", "SecureHamming attempt 0", timeout=180)
    fault(project.container("hospital-b"))
    say(f"fault applied to hospital-b {time.monotonic() - started:.1f}s after `up`")
    for service in ("hospital-a", "hospital-c", "coordinator", "submit"):
        project.wait_exit(service, timeout=300)
    say(f"survivors, coordinator and submit done {time.monotonic() - started:.1f}s after `up`")
    for party in ("hospital-a", "hospital-c"):
        assert project.state(party)["ExitCode"] == 0, (project.logs(party)[-3000:] + "\ncoordinator:\n"
                                                        + project.logs("coordinator")[-5000:])
        check_predictions(project, party)
    assert project.read("hospital-b-results", "runs/xclp-demo/*/predictions.csv") is None

    summary = project.logs("submit")
    say("summary:\n" + summary)
    assert project.state("submit")["ExitCode"] == 1, "an institution without results is a failed demo"
    table = {m[0]: m[1:] for m in TABLE_LINE.findall(summary)}
    assert table["hospital-b"][1] == "-"
    run_summary: dict[str, object] = json.loads(
        project.read("coordinator", "state/jobs/xclp-demo/xclp-demo.summary.json") or "{}")
    # docs/design.md §5: dropped during SecureHamming = its rows and columns leave H; the others go on.
    assert run_summary["outcome"] == "done"
    assert run_summary["graph_parties"] == run_summary["label_parties"] == ["hospital-a", "hospital-c"]
    assert list(run_summary["dropped"]) == ["hospital-b"]  # type: ignore[call-overload]
    return run_summary


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_stopping_an_institution_mid_securehamming_leaves_the_others_their_predictions(
        project: Project, tmp_path: Path) -> None:
    run_summary = _fault_run(project, tmp_path, lambda cid: run(["docker", "stop", "--time", "5", cid]))
    # docker stop: SIGTERM through docker-init; the agent stops its run, tells the coordinator (which
    # drops it at once, not after reconnect_seconds), writes nothing, exits 0
    assert run_summary["dropped"] == {"hospital-b": "left the run (it was stopped)"}
    assert project.state("hospital-b")["ExitCode"] == 0
    assert "run 1 of job xclp-demo stopped" in project.logs("hospital-b")
    assert re.search(r"hospital-b: no predictions.csv: dropped in xclp-demo run \d+ "
                     r"\(left the run \(it was stopped\)\)", project.logs("submit"))


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_a_disconnected_institution_misses_the_deadline_and_is_dropped_the_same_way(
        project: Project, tmp_path: Path) -> None:
    network = project.volume("default")  # the project's default network: same naming as volumes
    # hospital-b alone gives up its run after 45 s without news (the others keep the default).
    override = tmp_path / "hospital-b-idle.yml"
    override.write_text("services:\n  hospital-b:\n    environment:\n      XCLP_IDLE_TIMEOUT: \"45\"\n")
    project.overrides.append(override)
    run_summary = _fault_run(project, tmp_path, lambda cid: run(["docker", "network", "disconnect", network, cid]))
    # Cut off, hospital-b falls silent: the coordinator drops it once it owes SecureHamming a message
    # and has been silent for step_seconds, or earlier if its TCP connection errors first (the bridge
    # answers for the lost address) and it does not come back within reconnect_seconds.
    reason = run_summary["dropped"]["hospital-b"]  # type: ignore[index]
    assert reason == "disconnected, and did not reconnect within 30 s" or re.fullmatch(
        r"sent nothing for \d+ s in step 'secure_hamming', which waited", reason), reason
    # hospital-b's agent gives up the run after 45 s without news, writes nothing, and, its one
    # run over and not done, exits 5 ("dropped or timed out").
    assert project.wait_exit("hospital-b", timeout=120) == 5
    assert "run 1 of job xclp-demo failed" in project.logs("hospital-b")


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_the_cluster_profile_sends_hospital_as_paillier_work_to_its_own_dask_cluster_over_tls(
        project: Project, tmp_path: Path) -> None:
    """`docker compose --profile cluster up` (the XCLP job alone): hospital-a's agent finds its own
    scheduler, sends its Paillier work there over mutual TLS with its own cluster CA (not the dev
    CA), and every institution gets its predictions; the cluster's CA key is setup's alone."""
    project.profiles.append("cluster")
    project.env.update({"XCLP_JOBS_DIR": str(fault_jobs(tmp_path, step_seconds=None)), "XCLP_AGENT_RUNS": "1",
                        "XCLP_SUMMARY_GRACE": "10"})
    started = time.monotonic()
    project.compose("up", "--detach", timeout=180)
    for service in (*PARTIES, "coordinator", "submit"):
        project.wait_exit(service, timeout=420)
    say(f"XCLP with hospital-a on its cluster done {time.monotonic() - started:.1f}s after `up`")
    codes = {s: project.state(s)["ExitCode"] for s in (*PARTIES, "coordinator", "submit")}
    assert codes == dict.fromkeys(codes, 0), project.logs("hospital-a")[-3000:]
    for party in PARTIES:
        check_predictions(project, party)
    said = re.findall(r"Paillier work on the Dask scheduler (\S+): (\d+) workers", project.logs("hospital-a"))
    assert said and said[0][0] == "tls://hospital-a-scheduler:8786", project.logs("hospital-a")[-3000:]
    for other in ("hospital-b", "hospital-c"):
        assert "Dask scheduler" not in project.logs(other)
    scheduler = project.logs("hospital-a-scheduler")
    assert "tls://" in scheduler and scheduler.count("Register worker") >= 2, scheduler[-3000:]
    # the cluster's own CA: its key in a volume only setup mounts; not the coordinator's dev CA
    cluster_ca = project.volume("hospital-a-cluster-ca")
    for service in (*SERVICES, "hospital-a-scheduler", "hospital-a-worker-1", "hospital-a-worker-2"):
        mounts = json.loads(run(["docker", "inspect", "--format", "{{json .Mounts}}",
                                 project.container(service)]).stdout)
        assert (cluster_ca in [m.get("Name") for m in mounts]) == (service == "setup"), service
    assert project.read("hospital-a-cluster", "ca.pem") != project.read("coordinator", "certs/ca.pem")
