"""A party's options, declared once (docs/cli.md, "Where each option may be given").

Every setting of a party is one `Option` here: its name, its kind, its default, its help and the
places it may be given (`Source`): `xclp-client run`'s flags (FLAG), a `--config party.toml`
(RUN_TOML), `xclp.client.run`'s keywords (API), an agent's agent.toml (AGENT) or its [policy]
table (POLICY). From this table:

- client/cli.py makes `xclp-client run`'s flags (`add_flags`) and reads its party.toml;
- client/agent.py reads agent.toml and its [policy] table;
- client/api.py checks `run`'s keywords, whose names and defaults a test holds to this table;
- client/policy.py takes its defaults and its bounds from it.

`read_settings` checks what a user gave, in one of those places, and refuses it with an error that
names the option the way it was given: `--min-parties`, `min_parties in party.toml`,
`[policy] min_parties in agent.toml` or the API's `min_parties`.
"""

from __future__ import annotations

import argparse
import enum
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xclp.client.budget import Budget
from xclp.crypto.paillier import MIN_SECURE_BITS
from xclp.data import tables
from xclp.errors import ConfigError
from xclp.runtime import TESTING_ENV
from xclp.v1.double_masking import MIN_SHARE_THRESHOLD


class Source(enum.Flag):
    FLAG = enum.auto()  # xclp-client run --flag
    RUN_TOML = enum.auto()  # xclp-client run --config party.toml
    API = enum.auto()  # xclp.client.run(keyword=...)
    AGENT = enum.auto()  # agent.toml
    POLICY = enum.auto()  # agent.toml's [policy]


RUN = Source.FLAG | Source.RUN_TOML | Source.API
BOTH = RUN | Source.AGENT  # a setting of the run and of the agent alike
RUN_POLICY = RUN | Source.POLICY  # the party's own policy: on the run, and in the agent's [policy]


class Kind(enum.Enum):
    TEXT = "text"
    WHOLE = "a whole number"
    NUMBER = "a number"
    SWITCH = "true or false"
    PATH = "a file or directory"
    SOURCE = "a file, or (from Python) what it holds"  # identity, peers, data: their readers check them
    BUDGET = "EPS or EPS,DELTA"
    WORKERS = "a number of processes or a scheduler address"
    NAMES = "a list of names"


@dataclass(frozen=True)
class Where:
    """Where a setting was given, to name it the way the user gave it."""

    source: Source
    file: str | os.PathLike[str] | None = None

    def name(self, option: Option, key: str | None = None) -> str:
        key = key or option.name
        if self.source is Source.FLAG:
            return "--" + key.replace("_", "-")
        if self.source is Source.POLICY:
            return f"[policy] {key} in {self.file}"
        if self.source in (Source.RUN_TOML, Source.AGENT):
            return f"{key} in {self.file}"
        return key

    def named(self, name: str) -> str:
        """The option `name` as a user gives it here."""
        return self.name(OPTIONS[name])


def flag_name(name: str) -> str:
    """The option `name` as `xclp-client run`'s flag (how a policy made in Python names it)."""
    return OPTIONS[name].flag


@dataclass(frozen=True)
class Option:
    name: str
    kind: Kind
    help: str
    default: Any = None
    sources: Source = RUN
    metavar: str | None = None
    old_names: tuple[str, ...] = ()  # names it had, still read (a flag too where it was one)
    at_least: float | None = None
    above: float | None = None
    below: float | None = None
    why: str = ""  # why a bound is what it is, said when it refuses a value
    says: str = ""  # what a value must be, when not the kind and its bounds
    hidden: bool = False  # kept for old settings, not shown in --help
    nullable: bool = False  # None means something of its own (label_column: no labels), not "unset"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def read(self, value: Any, given: str) -> Any:
        """`value` as given (a flag's, a TOML key's or a keyword's), checked and converted; a
        ConfigError names the option `given`. None is kept where it means unset (the option's
        default is None) or something of its own (`nullable`), and refused elsewhere."""
        kind = self.kind
        wrong = ConfigError(f"{given} must be {kind.value}, got {value!r}")
        if value is None:
            if self.default is None or self.nullable:
                return None
            if kind not in (Kind.WHOLE, Kind.NUMBER):
                raise wrong
        if kind is Kind.BUDGET:
            return Budget.of(value, given)
        if kind in (Kind.SOURCE, Kind.PATH) and isinstance(value, (str, os.PathLike)):
            return Path(value) if str(value) else None  # an empty path is unset, as in a TOML file's ""
        if kind is Kind.SOURCE:
            return value
        if kind is Kind.PATH:
            raise wrong
        if kind is Kind.SWITCH:
            if not isinstance(value, bool):
                raise wrong
            return value
        if kind is Kind.TEXT:
            if not isinstance(value, str):
                raise wrong
            return value
        if kind is Kind.NAMES:
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise wrong
            return list(value)
        if kind is Kind.WORKERS:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise wrong
            return value
        bounded = ConfigError(f"{given} must be {self.expected}{f' ({self.why})' if self.why else ''}, got {value!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                kind is Kind.WHOLE and not isinstance(value, int)) or not math.isfinite(value):
            raise bounded
        number = value if kind is Kind.WHOLE else float(value)
        if ((self.at_least is not None and number < self.at_least) or (self.above is not None and number <= self.above)
                or (self.below is not None and number >= self.below)):
            raise bounded
        return number

    @property
    def expected(self) -> str:
        """What a value of this option must be, as an error says it."""
        if self.says:
            return self.says
        what = self.kind.value
        if self.above is not None and self.below is not None:
            return f"{what} in ({self.above:g}, {self.below:g})"
        if self.at_least is not None:
            return f"{what} >= {self.at_least:g}"
        return what if self.above is None else f"{what} > {self.above:g}"


OPTIONS: dict[str, Option] = {o.name: o for o in (
    Option("coordinator", Kind.TEXT, "coordinator address host:port", sources=BOTH),
    Option("job", Kind.TEXT, "job id, as configured on the coordinator"),
    Option("party", Kind.TEXT, "this party's id (must match the allow-list)", sources=BOTH),
    Option("identity", Kind.SOURCE, "identity key from `xclp-client keygen`", sources=BOTH),
    Option("peers", Kind.SOURCE, "the job's allow-list (allow.toml, from the operator by an authenticated "
           "channel): the only identity keys this party accepts from the coordinator's roster", sources=BOTH),
    Option("data", Kind.SOURCE, "CSV or Parquet (features, a label column, an optional id column) or .npz "
           "(X, y, ids, columns); see docs/data.md"),
    Option("label_column", Kind.TEXT, "label column name (default label; empty cell = unlabeled; a name given "
           "here must be a column of the table, while a table without a label column is all unlabeled)",
           default=tables.DEFAULT_LABEL, nullable=True),
    Option("id_column", Kind.TEXT, "row id column name in the CSV (default: row numbers; ids must be unique)"),
    Option("delimiter", Kind.TEXT, "CSV separator: , ; | or tab (default: detected from the header)"),
    Option("out", Kind.PATH, "model file to write (.npz); for xclp jobs a directory (gets "
           "predictions.csv) or a .csv file: id (named as in --data), label, confidence, score_<c>",
           sources=Source.FLAG | Source.RUN_TOML | Source.AGENT),
    Option("ca_cert", Kind.PATH, "CA certificate that signed the coordinator's certificate (default: system "
           "roots)", sources=BOTH),
    Option("client_cert", Kind.PATH, "this party's client certificate, if the coordinator requires mutual TLS",
           sources=BOTH),
    Option("client_key", Kind.PATH, "the private key of --client-cert", sources=BOTH),
    Option("server_name", Kind.TEXT, "TLS name to expect in the server certificate, if not the host in "
           "--coordinator", sources=BOTH),
    Option("insecure", Kind.SWITCH, "plaintext gRPC (local tests only)", default=False, sources=BOTH),
    Option("connect_timeout", Kind.NUMBER, "seconds to keep retrying an unreachable coordinator, backing off "
           "exponentially (0.5 s doubling to 30 s, with jitter), before giving up with exit code 5 (default 60)",
           default=60.0, sources=BOTH, old_names=("join_wait",), at_least=0),
    Option("idle_timeout", Kind.NUMBER, "give up after this many seconds without news (default 900)",
           default=900.0, sources=BOTH, above=0),
    Option("rejoins", Kind.WHOLE, "join the job's next run, up to N times, when the coordinator stops or "
           "restarts during this party's run and cannot go on with it (default 3; 0: never; docs/operating.md)",
           default=3, metavar="N", at_least=0),
    Option("paillier_bits", Kind.WHOLE, "xclp jobs: publish a fresh Paillier key of this size (the job's "
           "key_bits, normally 2048)", at_least=0),
    Option("insecure_test_keys", Kind.SWITCH, "allow --paillier-bits below 2048 (tests only; the job must allow "
           "it too)", default=False, sources=RUN_POLICY),
    Option("min_parties", Kind.WHOLE, "refuse any masked sum among fewer parties (default 3, at least 2)",
           default=3, sources=RUN_POLICY, at_least=2, why="masking a sum of one reveals it"),
    Option("min_share_threshold", Kind.WHOLE, "refuse jobs that let fewer than T shares rebuild this party's "
           "self-mask seed if it is lost while revealing (default 2, at least 2)", default=MIN_SHARE_THRESHOLD,
           metavar="T", sources=RUN_POLICY, at_least=MIN_SHARE_THRESHOLD, why="one share would be the seed itself"),
    Option("require_dp", Kind.NUMBER, "take part only in DP jobs with epsilon <= EPS", metavar="EPS",
           sources=RUN_POLICY, above=0.0, says="a positive epsilon"),
    Option("require_label_dp", Kind.NUMBER, "take part only in jobs whose release of each label is DP with "
           "epsilon <= EPS (xclp: label_dp_epsilon; record-level DP covers labels too)", metavar="EPS",
           sources=RUN_POLICY, above=0.0, says="a positive epsilon"),
    Option("allow_unsketched_layers", Kind.SWITCH, "take part in dbcl jobs that release some layers' gradients "
           "unsketched (the paper's output layer, or sketch = \"none\"; a property probe reads them; "
           "docs/jobs/dbcl.md)", default=False, sources=RUN_POLICY),
    Option("allow_non_dp_dbcl", Kind.SWITCH, "take part in dbcl jobs without record-level DP (dp_epsilon): the "
           "coordinator can difference their rounds into one party's per-class feature sums (docs/jobs/dbcl.md)",
           default=False, sources=RUN_POLICY),
    Option("allow_hide_label_mask", Kind.SWITCH, "take part in xclp jobs with hide_label_mask (peers could then "
           "solve for labels; docs/jobs/xclp.md)", default=False, sources=RUN_POLICY),
    Option("workers", Kind.WORKERS, "xclp: where Paillier work runs: a number of local processes (default: the "
           "cores; 0 = none) or the institution's own Dask scheduler, tls://host:8786 (it gets this party's "
           "secret key and codes; docs/cluster.md)", sources=BOTH),
    Option("insecure_workers", Kind.SWITCH, "allow a tcp:// Dask scheduler (Paillier tasks then cross the network "
           "in the clear)", default=False, sources=BOTH),
    Option("state", Kind.PATH, "the directory of this party's privacy ledger: what it released about each data "
           "set, among whom, and the DP budget spent; and, while a run is in SecureHamming, SecureRowSums or a "
           "training round, its sealed run state, which the same command rejoins the run with if the process is "
           "killed (default: $XDG_STATE_HOME/xclp; for an agent <out>/.state; docs/privacy.md, "
           "docs/operating.md)", sources=BOTH),
    Option("privacy_budget", Kind.BUDGET, "the most all DP releases about one data set may spend, over every run "
           "(default 10,1e-5; docs/privacy.md); --require-dp stays a limit per job", metavar="EPS[,DELTA]",
           sources=RUN_POLICY),
    Option("allow_rerun", Kind.SWITCH, "release the data exactly among another set of parties than its earlier "
           "exact releases (lets the coordinator difference the sums; `xclp-client ledger move` is the lasting "
           "choice; docs/privacy.md)", default=False, sources=RUN_POLICY),
    Option("validate", Kind.NUMBER, "xclp: hold out this fraction of the labeled rows locally (their labels never "
           "sent) and print, on them, the accuracy of XCLP's labels next to this party's rows alone "
           "(docs/jobs/xclp.md)", metavar="FRACTION", above=0.0, below=1.0, says="a fraction in (0, 1)"),
    Option("max_memory_gb", Kind.NUMBER, "xclp: refuse, before joining, a job whose distance block needs more "
           "memory than this (default: three quarters of the RAM; 0 = no limit)", sources=RUN_POLICY, at_least=0),
    Option("max_work_minutes", Kind.NUMBER, "xclp: refuse, before joining and again before any Paillier work, a "
           "job whose Paillier work is estimated to take longer (timed with this party's key; default 1440 = 24 "
           "hours; 0 = no limit); the job's max_run_seconds is a limit too", sources=RUN_POLICY, at_least=0),
    Option("max_paillier_hours", Kind.NUMBER, "the old name of max_work_minutes, in hours", sources=RUN_POLICY,
           at_least=0, hidden=True),
    Option("debug_dump_seed", Kind.PATH, f"TEST HOOK, refused unless {TESTING_ENV}=1: write the job's common seed "
           "to this file so a test can rebuild the plaintext reference", sources=Source.FLAG | Source.RUN_TOML),
    # the agent's own
    Option("poll_seconds", Kind.NUMBER, "how often to ask the coordinator for runs that name this party",
           default=2.0, sources=Source.AGENT, above=0),
    Option("max_runs", Kind.WHOLE, "runs taken part in at once; further offers wait", default=2,
           sources=Source.AGENT, at_least=1),
    Option("join_deadline", Kind.NUMBER, "seconds a joined run may wait for its roster", default=1800.0,
           sources=Source.AGENT, above=0),
    Option("job_types", Kind.NAMES, "the job types taken part in (default: every type)", sources=Source.POLICY),
    Option("min_key_bits", Kind.WHOLE, "the smallest Paillier key a job may ask for (default 2048; "
           "insecure_test_keys = true allows less)", default=MIN_SECURE_BITS, sources=Source.POLICY,
           at_least=1),
    Option("max_key_bits", Kind.WHOLE, "the largest Paillier key a job may ask for", default=4096,
           sources=Source.POLICY, at_least=1),
)}


def given(source: Source) -> list[Option]:
    """The options that may be given in `source`, in the order they are declared."""
    return [o for o in OPTIONS.values() if source in o.sources]


def keys(source: Source) -> set[str]:
    """The names (old ones too) a settings file or the flags of `source` may use."""
    return {name for o in given(source) for name in (o.name, *o.old_names)}


def default(name: str) -> Any:
    return OPTIONS[name].default


def value(settings: Mapping[str, Any], name: str) -> Any:
    """Option `name` in settings read by `read_settings`: as given, or else its default."""
    return settings[name] if name in settings else OPTIONS[name].default


def read_settings(raw: Mapping[str, Any], where: Where, *, base: Path | None = None,
                  also: Iterable[str] = ()) -> dict[str, Any]:
    """The settings `raw` given in `where`, each checked (`Option.read`) and named by its current
    name (one given as None stays None); unknown keys refused with the known ones listed; relative
    paths of a file taken from `base`, the file's directory. `also`: keys of the file that are not
    options (its tables)."""
    known = keys(where.source)
    extra = sorted(set(raw) - known - set(also))
    if extra:
        place = {Source.POLICY: f"{where.file} [policy]", Source.API: "xclp.client.run",
                 Source.FLAG: "xclp-client run"}.get(where.source, str(where.file))
        raise ConfigError(f"{place}: unknown key(s) {', '.join(extra)}; known: {', '.join(sorted(known | set(also)))}")
    settings: dict[str, Any] = {}
    for option in given(where.source):
        present = [name for name in (option.name, *option.old_names) if raw.get(name) is not None]
        if len(present) > 1:
            raise ConfigError(f"give {where.name(option)} or its old name {where.name(option, present[1])}, "
                              "not both")
        if not present:
            if option.name in raw:  # given as None: kept where that means something (Option.read)
                settings[option.name] = option.read(None, where.name(option))
            continue
        value = option.read(raw[present[0]], where.name(option, present[0]))
        if base is not None and option.kind in (Kind.PATH, Kind.SOURCE) and isinstance(value, Path):
            value = base / value
        settings[option.name] = value
    return settings


def add_flags(parser: argparse.ArgumentParser) -> None:
    """`xclp-client run`'s flags, one per option it takes: unset (None) unless given, so that a
    party.toml fills what the flags leave."""
    for option in given(Source.FLAG):
        names = [option.flag, *("--" + old.replace("_", "-") for old in option.old_names)]
        shown = argparse.SUPPRESS if option.hidden else option.help
        if option.kind is Kind.SWITCH:
            parser.add_argument(*names, dest=option.name, action="store_true", default=None, help=shown)
            continue
        convert = {Kind.WHOLE: int, Kind.NUMBER: float, Kind.PATH: Path, Kind.SOURCE: Path}.get(option.kind, str)
        parser.add_argument(*names, dest=option.name, type=convert, metavar=option.metavar, help=shown)
