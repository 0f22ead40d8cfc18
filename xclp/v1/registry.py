"""The job types: the one list of them (STYLE 9; docs/architecture.md "Adding a job type").

Each `JobType` names what both ends and the tools need to know of a type: its parameter schema
(a `JobParams` subclass, which also answers whether the job publishes Paillier keys, needs labels,
promises DP), its title for the reference, what a party writes when it is done, and the classes
that run it — the coordinator's (a `CoordinatorJob`: admission checks and the list of phases) and
the party's (a `PartyJob`). The classes are named as "module:attribute" and imported only when a
run needs them, so `xclp.v1` imports neither the server nor the client (docs/design.md §1).

The CLI's choices, the coordinator's config validation, the agent's policy, the party's outputs,
`predict` and `query`, and the parameter reference (docs/job-parameters.md) all read this registry; nothing else
lists job types.
"""

from __future__ import annotations

import enum
import importlib
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import MISSING, Field, asdict, dataclass, fields
from typing import Any

from xclp.errors import ConfigError
from xclp.v1.allreduce import FlynnJobParams, RaceJobParams
from xclp.v1.dbcl import DbclJobParams
from xclp.v1.fedavg import FedavgJobParams
from xclp.v1.params import DATA_KEYS, JobParams
from xclp.v1.xclp import XclpJobParams


class Output(enum.Enum):
    """What a party writes once its run is done."""

    PREDICTIONS = "predictions"  # labels, confidences and scores of its rows (predictions.csv)
    MODEL = "model"  # the trained model (model.npz), which `predict` or `query` reads


class ModelKind(enum.Enum):
    """How `xclp-client predict` / `query` use a model file of the type."""

    FLYNN = "flynn"  # predict: FlyNN classifier
    RACE = "race"  # query: kernel density or class estimates
    NETWORK = "network"  # predict: the small network of xclp.nn


@dataclass(frozen=True)
class JobType:
    name: str
    params: type[JobParams]
    title: str
    # what makes the coordinator's CoordinatorJob from a JobConfig, and the party's PartyJob from a
    # PartyContext: "module:attribute", imported when a run needs it (or, in tests, the callable itself)
    coordinator: str | Callable[..., Any]
    party: str | Callable[..., Any]
    output: Output
    model: ModelKind | None = None  # how `predict` or `query` read a MODEL output (None: they do not)
    files: frozenset[str] = frozenset()  # job-file keys naming files the coordinator writes ("summary", "model", ...)
    max_total_rows: int = 0  # default cap on the rows of all parties together (0: none)
    # what runs the type with every role in one process (xclp.simulation.simulate): "module:attribute"
    # of a Runner, (params, each party's table, seed, secure) -> (each party's aggregate, details)
    simulation: str | Callable[..., Any] | None = None
    # what makes a MODEL output's file usable (client/models.py): "module:attribute" of a function of
    # the ModelFile that returns what `predict` or `query` use
    model_loader: str | Callable[..., Any] | None = None
    # the [params] a new federation's job starts from (`xclp-server federation new`), given the
    # tables' feature count, beside the classes the tables give; None: the type has none (its
    # parameters depend on what it is for)
    starter: Callable[[int], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        for where in (self.coordinator, self.party, self.simulation, self.model_loader):
            if isinstance(where, str) and where.count(":") != 1:
                raise ValueError(f"{where!r} must be 'module:attribute'")
        if self.model is not None and self.output is not Output.MODEL:
            raise ValueError(f"job type {self.name!r}: only a model output has a model kind")
        if (self.model is None) != (self.model_loader is None):
            raise ValueError(f"job type {self.name!r}: a model kind goes with a model loader")

    def parse(self, raw: Mapping[str, Any]) -> JobParams:
        return self.params.parse(raw)

    def coordinator_class(self) -> Any:
        return _load(self.coordinator)

    def party_class(self) -> Any:
        return _load(self.party)

    def simulation_runner(self) -> Any:
        if self.simulation is None:
            raise ConfigError(f"job type {self.name!r} has no simulation")
        return _load(self.simulation)

    def load_model(self, model_file: Any) -> Any:
        """What `predict` or `query` use of a model file of this type (its `model_loader`)."""
        if self.model_loader is None:
            raise ConfigError(f"job type {self.name!r} writes no model")
        return _load(self.model_loader)(model_file)


def _load(where: str | Callable[..., Any]) -> Any:
    if not isinstance(where, str):
        return where
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


_TYPES: dict[str, JobType] = {}


def register(entry: JobType) -> JobType:
    if entry.name in _TYPES:
        raise ValueError(f"job type {entry.name!r} is registered already")
    _TYPES[entry.name] = entry
    return entry


@contextmanager
def registered(entry: JobType, *, replacing: bool = False) -> Iterator[JobType]:
    """`entry` registered for the duration: a test's own job type, or with `replacing` one that
    stands in for a registered type (a test's hostile coordinator)."""
    previous = _TYPES.get(entry.name)
    if previous is not None and not replacing:
        raise ValueError(f"job type {entry.name!r} is registered already")
    _TYPES[entry.name] = entry
    try:
        yield entry
    finally:
        if previous is None:
            del _TYPES[entry.name]
        else:
            _TYPES[entry.name] = previous


def get(name: str) -> JobType:
    try:
        return _TYPES[name]
    except KeyError:
        raise ConfigError(f"unknown job type {name!r}; known: {', '.join(names())}") from None


def names() -> tuple[str, ...]:
    return tuple(_TYPES)


def of(params: JobParams) -> JobType:
    """The job type whose schema `params` are."""
    for entry in _TYPES.values():
        if type(params) is entry.params:
            return entry
    raise ConfigError(f"{type(params).__name__} is not the schema of a registered job type")


def parse_params(job_type: str, raw: Mapping[str, Any]) -> JobParams:
    return get(job_type).parse(raw)


def params_json(params: JobParams) -> str:
    return json.dumps({k: v for k, v in asdict(params).items() if v is not None}, sort_keys=True)


def params_from_json(job_type: str, text: str) -> JobParams:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"job parameters are not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError("job parameters must be a JSON object")
    return parse_params(job_type, raw)


def parameter_reference() -> str:
    """The job parameter tables of docs/job-parameters.md, made from the schemas (so the two cannot drift)."""
    out = ["**Every job type**: how each party prepares its table first ([protocols §7](protocol.md#preparation), "
           "[your data](data.md)).\n"]
    out += _table(fields(JobParams))
    for entry in _TYPES.values():
        out.append(f"**`type = \"{entry.name}\"`**: {entry.title}.\n")
        out += _table([f for f in fields(entry.params) if f.name not in DATA_KEYS])
    return "\n".join(out)


def _see(where: str) -> str:
    """A parameter's "see": a page of the docs (docs/...) as a link from docs/job-parameters.md."""
    return f"[{where.removeprefix('docs/')}]({where.removeprefix('docs/')})" if where.startswith("docs/") else where


def _table(schema_fields: list[Field[Any]] | tuple[Field[Any], ...]) -> list[str]:
    out = ["| parameter | default | range | meaning |", "|---|---|---|---|"]
    for f in schema_fields:
        if f.default is MISSING:
            default = "required"
        elif f.default is None:
            default = "unset"
        else:
            default = f"`{json.dumps(f.default)}`"
        see = f" ({_see(f.metadata['see'])})" if f.metadata["see"] else ""
        out.append(f"| `{f.name}` | {default} | {f.metadata['range']} | {f.metadata['meaning']}{see} |")
    out.append("")
    return out


register(JobType(
    "xclp", XclpJobParams,
    "cross-client label propagation: every party gets labels for its unlabeled rows (Scott et al. 2023, Alg. 1)",
    coordinator="xclp.server.jobs.xclp:XclpJob", party="xclp.client.jobs.xclp:XclpParty",
    output=Output.PREDICTIONS, files=frozenset({"summary", "debug_dump"}), max_total_rows=300_000,
    simulation="xclp.simulation.simulate:run_xclp",
    starter=lambda features: {"lsh_bits": 1024, "k": 10, "key_bits": 2048}))  # docs/jobs/xclp.md's sizes
register(JobType(
    "flynn", FlynnJobParams,
    "a federated FlyNN classifier, equal to the one trained on the pooled data (Ram & Sinha 2022, "
    "[protocols §5](protocol.md#all-reduce))",
    coordinator="xclp.server.jobs.allreduce:AllReduceJob", party="xclp.client.jobs.allreduce:flynn_party",
    output=Output.MODEL, model=ModelKind.FLYNN, simulation="xclp.simulation.simulate:run_flynn",
    model_loader="xclp.client.jobs.allreduce:flynn_model",
    starter=lambda features: {"m": 4096, "s": min(5, features), "rho": 32}))  # docs/jobs/flynn-race.md's
register(JobType(
    "race", RaceJobParams,
    "federated RACE sketches for kernel density or class estimates (Coleman & Shrivastava 2021, "
    "[protocols §5](protocol.md#all-reduce))",
    coordinator="xclp.server.jobs.allreduce:AllReduceJob", party="xclp.client.jobs.allreduce:race_party",
    output=Output.MODEL, model=ModelKind.RACE, simulation="xclp.simulation.simulate:run_race",
    model_loader="xclp.client.jobs.allreduce:race_model"))
register(JobType(
    "fedavg", FedavgJobParams,
    "a small network trained by secure federated averaging, optionally on pseudo-labels from XCLP "
    "(Scott et al. 2023 Alg. 2, [protocols §6](protocol.md#training))",
    coordinator="xclp.server.jobs.fedavg:fedavg_job", party="xclp.client.jobs.fedavg:FedavgParty",
    output=Output.MODEL, model=ModelKind.NETWORK, files=frozenset({"model"}),
    simulation="xclp.simulation.simulate:run_fedavg", model_loader="xclp.client.jobs.networks:network_model"))
register(JobType(
    "dbcl", DbclJobParams,
    "a small network trained by double-blind collaborative learning: parties see only sketched "
    "parameters, the coordinator only the sum of sketched gradients (Zhang & Wang 2021, "
    "[protocols §6](protocol.md#training))",
    coordinator="xclp.server.jobs.dbcl:dbcl_job", party="xclp.client.jobs.dbcl:DbclParty",
    output=Output.MODEL, model=ModelKind.NETWORK, files=frozenset({"model"}),
    simulation="xclp.simulation.simulate:run_dbcl", model_loader="xclp.client.jobs.networks:network_model"))
