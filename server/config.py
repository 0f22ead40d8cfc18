"""Coordinator settings: the allow-list of party identities and the job files (docs/design.md §2, §8).

allow-list TOML:                          job TOML:
    [parties]                                 job_id = "flynn-demo"
    hospital-a = "ed25519:<base64>"           type = "flynn"            # xclp.v1.registry.names()
    hospital-b = "ed25519:<base64>"           expected_parties = ["hospital-a", "hospital-b"]
                                              min_parties = 2
                                              [deadlines]
                                              join_seconds = 600        # wait for parties to join
                                              step_seconds = 300        # silence before a party is late
                                              max_run_seconds = 0       # bound on a whole run (0: none)
                                              reconnect_seconds = 30    # a lost connection's grace (0: none)
                                              [params]                  # the type's schema
                                              n_classes = 10
                                              m = 4096
                                              ...

A job may name the files the coordinator writes for its type (the registry's `files`): an xclp job
`summary = "run.json"` (a run summary with per-step seconds and bytes, written when the run ends)
and, for tests only (refused unless XCLP_TESTING=1 is set), `debug_dump = "dir"` (the
coordinator's H and the SecureRowSums it opened, as .npy); a fedavg or dbcl job
`model = "model.npz"`: the trained network, written when the run ends (a dbcl job that withholds
the model from the parties must name it).
All paths are relative to the job file. A job submitted at runtime (`xclp-server job submit`) has
no directory of its own: its paths must be relative, stay inside, and resolve under
`<state directory>/jobs/<job_id>/`.

A job run by party agents names each party's data set by its name in that party's catalogue
(`xclp-client agent`), never by path: `dataset = "train"` for every party, or a `[datasets]`
table, party id = name, for some or all of them.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xclp.crypto.identity import check_party_id
from xclp.errors import ConfigError, InvalidInput
from xclp.runtime import check_keys, require_testing
from xclp.v1 import registry
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.params import JobParams

RECONNECT_SECONDS = 30.0  # how long a party that lost its connection mid-run keeps its place, by default


@dataclass(frozen=True)
class JobConfig:
    """One job as the coordinator runs it."""

    job_id: str
    job_type: str
    params: JobParams
    expected_parties: tuple[str, ...]
    min_parties: int
    join_seconds: float = 600.0
    step_seconds: float = 300.0  # a party that owes a step's next message is dropped after this long silent
    max_run_seconds: float = 0.0  # a run that takes longer fails (0: no bound)
    # a party whose connection is lost mid-run keeps its place this long, to reconnect and resume (0:
    # dropped at once); at most step_seconds (a longer one is cut to it)
    reconnect_seconds: float = RECONNECT_SECONDS
    max_rows_per_party: int = 1_000_000  # a party reporting more rows is refused at Join
    # the joined parties' rows in all; default: the job type's (xclp: 50 000, for the coordinator
    # holds an N × N uint16 H, 5 GB at that size); 0 = no cap. A party passing it is refused at Join.
    max_total_rows: int | None = None
    summary_path: Path | None = None  # "summary": the run summary, written when the run ends
    debug_dump_dir: Path | None = None  # "debug_dump", tests only (XCLP_TESTING=1): what the coordinator saw
    model_path: Path | None = None  # "model": the coordinator writes the trained network here
    datasets: dict[str, str] = field(default_factory=dict)  # party id -> catalogue name (party agents)

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        for party in self.expected_parties:
            try:
                check_party_id(party)
            except InvalidInput as exc:
                raise ConfigError(f"job {self.job_id}: {exc}") from None
        if len(set(self.expected_parties)) != len(self.expected_parties):
            raise ConfigError(f"job {self.job_id}: expected_parties lists a party twice")
        if not 2 <= self.min_parties <= len(self.expected_parties):
            raise ConfigError(
                f"job {self.job_id}: min_parties must be in [2, {len(self.expected_parties)}] "
                "(masking needs at least two parties)"
            )
        if isinstance(self.max_rows_per_party, bool) or not isinstance(self.max_rows_per_party, int) \
                or self.max_rows_per_party < 1:
            raise ConfigError(f"job {self.job_id}: max_rows_per_party must be a positive integer")
        job_type = registry.get(self.job_type)
        if type(self.params) is not job_type.params:
            raise ConfigError(f"job {self.job_id}: the parameters are not those of a {self.job_type} job")
        if self.max_total_rows is None:
            object.__setattr__(self, "max_total_rows", job_type.max_total_rows)
        if isinstance(self.max_total_rows, bool) or not isinstance(self.max_total_rows, int) or self.max_total_rows < 0:
            raise ConfigError(f"job {self.job_id}: max_total_rows must be an integer >= 0 (0: no cap)")
        most = self.max_rows_per_party * len(self.expected_parties)
        self.params.check_rows(min(most, self.max_total_rows) if self.max_total_rows else most)
        if not (self.join_seconds > 0 and self.step_seconds > 0 and self.max_run_seconds >= 0):
            raise ConfigError(f"job {self.job_id}: deadlines must be positive (max_run_seconds: 0 = no bound)")
        if not self.reconnect_seconds >= 0:
            raise ConfigError(f"job {self.job_id}: reconnect_seconds must be >= 0 (0: a party that loses its "
                              "connection is dropped at once)")
        object.__setattr__(self, "reconnect_seconds", min(self.reconnect_seconds, self.step_seconds))
        files = {"summary": self.summary_path, "debug_dump": self.debug_dump_dir, "model": self.model_path}
        for key, value in files.items():
            if value is not None and key not in job_type.files:
                offered = ", ".join(sorted(job_type.files)) or "none"
                raise ConfigError(f"job {self.job_id}: {key} is not an option of {self.job_type} jobs (they write: "
                                  f"{offered})")
        for key, why in self.params.required_files.items():
            if files.get(key) is None:
                raise ConfigError(f"job {self.job_id}: {why}, so the job must name {key} = \"<file>\"")
        try:
            self.params.check_threshold(len(self.expected_parties))
            self.params.check_roster(len(self.expected_parties), self.min_parties)
        except ConfigError as exc:
            raise ConfigError(f"job {self.job_id}: {exc}") from None
        if self.debug_dump_dir is not None:
            require_testing(f"job {self.job_id}: debug_dump writes what the coordinator learned to disk")
        for party, name in self.datasets.items():
            if party not in self.expected_parties:
                raise ConfigError(f"job {self.job_id}: [datasets] names {party!r}, which is not an expected party")
            if not isinstance(name, str) or not DATASET_NAME.match(name):
                raise ConfigError(f"job {self.job_id}: data set {name!r} of {party!r} must be a catalogue name "
                                  f"(letters, "
                                  "digits, '.', '_', '-'; no '/'): a job names data sets, never paths, and each party "
                                  "maps the name to its own file")


    def spec(self) -> pb.JobSpec:
        """The job as every party sees it in the Challenge and at Join."""
        return pb.JobSpec(job_id=self.job_id, job_type=self.job_type, params_json=registry.params_json(self.params),
                          expected_parties=list(self.expected_parties), min_parties=self.min_parties,
                          step_deadline_seconds=self.step_seconds, datasets=self.datasets,
                          max_run_seconds=self.max_run_seconds, reconnect_seconds=self.reconnect_seconds)


def check_job_id(job_id: str) -> str:
    """A job id names directories (a submitted job's files, an agent's outputs): one plain name."""
    if not job_id or len(job_id) > 128 or not job_id.isprintable() or "/" in job_id or job_id in (".", ".."):
        raise ConfigError(f"job_id {job_id!r} must be 1-128 printable characters without '/', and not "
                          "'.' or '..' (it names directories)")
    return job_id


def reconnect_seconds(deadlines: dict[str, Any], step: float) -> float:
    """[deadlines] reconnect_seconds: given, at most `step` (step_seconds); by default
    RECONNECT_SECONDS, which JobConfig cuts to step_seconds if that is shorter."""
    if "reconnect_seconds" not in deadlines:
        return RECONNECT_SECONDS
    value = float(deadlines["reconnect_seconds"])
    if value > step:
        raise ConfigError(f"reconnect_seconds = {value:g} is longer than step_seconds = {step:g}: a party that "
                          "owes a message is late after step_seconds, connected or not")
    return value


DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def load_job(path: str | os.PathLike[str]) -> JobConfig:
    return read_job(path)[0]


def read_job(path: str | os.PathLike[str]) -> tuple[JobConfig, str]:
    """A job file and its text (the coordinator records the text): paths relative to its directory."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text: {exc}") from None
    return _job(_toml(text, path), path, Path(path).parent, confined=False), text


def reread_job(text: str, source: str) -> JobConfig:
    """A job file's text as the coordinator recorded it from `source` (a run read back after a restart,
    server/resume.py): paths relative to the file's directory, as when it was read."""
    return _job(_toml(text, source), source, Path(source).parent, confined=False)


def parse_job(text: str, name: str, root: Path | None) -> JobConfig:
    """A job file's text submitted at runtime: its paths stay under `root`/<job_id> (root None: it
    may name none)."""
    return _job(_toml(text, name), name, root, confined=True)


def _toml(text: str, name: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name} is not valid TOML: {exc}") from None


def _job(raw: dict[str, Any], path: str | os.PathLike[str], base: Path | None, *, confined: bool) -> JobConfig:
    known = {"job_id", "type", "expected_parties", "min_parties", "deadlines", "params", "summary", "debug_dump",
             "model", "max_rows_per_party", "max_total_rows", "dataset", "datasets"}
    check_keys(path, raw, known)

    def relative(value: object) -> Path | None:
        where = base / check_job_id(str(raw["job_id"])) if confined and base is not None else base
        return _relative(where, value, confined=confined)

    try:
        parties = raw["expected_parties"]
        if not isinstance(parties, list) or not all(isinstance(p, str) for p in parties):
            raise ConfigError("expected_parties must be a list of party ids")
        deadlines = raw.get("deadlines", {})
        params = raw.get("params", {})
        if not isinstance(deadlines, dict) or not isinstance(params, dict):
            raise ConfigError("[deadlines] and [params] must be tables")
        step_seconds = float(deadlines.get("step_seconds", 300.0))
        return JobConfig(
            job_id=str(raw["job_id"]),
            job_type=str(raw["type"]),
            params=registry.parse_params(str(raw["type"]), params),
            expected_parties=tuple(parties),
            min_parties=int(raw.get("min_parties", len(parties))),
            join_seconds=float(deadlines.get("join_seconds", 600.0)),
            step_seconds=step_seconds,
            max_run_seconds=float(deadlines.get("max_run_seconds", 0.0)),
            reconnect_seconds=reconnect_seconds(deadlines, step_seconds),
            summary_path=relative(raw.get("summary")),
            debug_dump_dir=relative(raw.get("debug_dump")),
            model_path=relative(raw.get("model")),
            max_rows_per_party=raw.get("max_rows_per_party", 1_000_000),
            max_total_rows=raw.get("max_total_rows"),
            datasets=_datasets(raw, parties),
        )
    except KeyError as exc:
        raise ConfigError(f"{path}: missing required key {exc.args[0]!r}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _datasets(raw: dict[str, Any], parties: list[str]) -> dict[str, str]:
    """`dataset = "name"` for every party, then `[datasets]` party = "name" on top."""
    common = raw.get("dataset")
    table = raw.get("datasets", {})
    if common is not None and not isinstance(common, str):
        raise ConfigError("dataset must be a catalogue name (a string)")
    if not isinstance(table, dict):
        raise ConfigError("[datasets] must be a table: party id = catalogue name")
    names = dict.fromkeys(parties, common) if common is not None else {}
    names.update(table)
    return names


def _relative(base: Path | None, value: object, *, confined: bool) -> Path | None:
    """A path option of a job file: relative to its directory, or for a submitted job confined to `base`."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"path options must be non-empty strings, got {value!r}")
    if confined:
        if base is None:
            raise ConfigError(f"a submitted job may name files only when the coordinator keeps state on disk "
                              f"(--state); "
                              f"got {value!r}")
        if Path(value).is_absolute() or ".." in Path(value).parts:
            raise ConfigError(f"a submitted job's paths are relative to the coordinator's job directory and stay in "
                              f"it: {value!r} is absolute or climbs out with '..'")
    assert base is not None
    return base / value


@dataclass(frozen=True)
class TlsFiles:
    """Server certificate and key (PEM); `client_ca` turns on mutual TLS."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        try:
            return (self.key.read_bytes(), self.cert.read_bytes(),
                    None if self.client_ca is None else self.client_ca.read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read TLS file {exc.filename}: {exc.strerror}") from None
