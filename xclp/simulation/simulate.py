"""A whole federation in one process, before any institution is involved: `simulate`.

    import xclp.simulation

    sim = xclp.simulation.simulate("xclp-demo.toml", parties={"a": df_a, "b": df_b, "c": df_c})
    sim["a"].predictions()      # what party a would get: the same PartyResult as xclp.client.run's
    print(sim.report())         # what each party and the coordinator would learn

Every role runs here: the preparation (pooled moments, exact or DP), then the job. With
`secure=True` the protocols run with real cryptography where this module models them — XCLP's
Paillier SecureHamming and pairwise-masked SecureRowSums (`run_xclp_inprocess`), fedavg's XCLP
pseudo-labels, and the masked sum of FlyNN/RACE counts (X25519 pairwise masks, cancelled in the
ring as the coordinator's sum cancels them); with `secure=False` the plaintext reference computes
the same result (exactly equal for XCLP, FlyNN and RACE without DP). Training jobs' sums (fedavg,
dbcl) are plain sums in either mode: the service's masked sum opens to exactly that sum.
"""

from __future__ import annotations

import os
import secrets
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from xclp.data import tables
from xclp.data.party_table import PartyData
from xclp.data.prep import Scaling
from xclp.data.validation import UNLABELED
from xclp.errors import ConfigError, InvalidInput
from xclp.simulation.moments import pooled_scaling
from xclp.v1 import registry
from xclp.v1.params import JobParams

if TYPE_CHECKING:
    from xclp.client.api import PartyResult

__all__ = ["Simulation", "simulate"]


@dataclass(frozen=True)
class Simulation:
    """What a simulated run gives: each party's result (`sim[party]`, an `xclp.client.PartyResult`
    as a real run returns it) and, in words, what each role would learn (`learns`, `report()`)."""

    job_type: str
    params: JobParams
    secure: bool
    parties: Mapping[str, PartyResult]
    learns: Mapping[str, tuple[str, ...]]  # "coordinator" and each party id -> what it learns
    seconds: float
    details: Mapping[str, Any] = field(default_factory=dict)  # e.g. xclp: the coordinator's graph "W"

    def __getitem__(self, party: str) -> PartyResult:
        try:
            return self.parties[party]
        except KeyError:
            raise KeyError(f"no party {party!r}; the parties are {', '.join(self.parties)}") from None

    def report(self) -> str:
        """What each role would learn, one paragraph per role."""
        mode = "real cryptography" if self.secure else "the plaintext reference"
        lines = [f"{self.job_type} job simulated with {mode} for {len(self.parties)} parties in "
                 f"{self.seconds:.1f} s; what each role would learn:"]
        for role, items in self.learns.items():
            lines.append(f"- {role}:")
            lines.extend(f"    - {item}" for item in items)
        return "\n".join(lines)


def simulate(job: Any, parties: Mapping[str, Any], *, secure: bool = True, seed: bytes | None = None,
             label_column: str | None = tables.DEFAULT_LABEL, id_column: str | None = None) -> Simulation:
    """Run `job` over `parties` = {party id: its table} with every role in this process.

    - `job`: a job file's path (a PathLike, or a str ending in .toml) or its text (its `type` and
      `[params]`; the parties are those given here), a mapping with "type" and "params", or a
      JobParams.
    - each table: a path, a pandas DataFrame, a pyarrow Table or arrays (X, y[, ids]), read as
      `xclp.client.run` reads it (`label_column`; `id_column`, by default the job's `id_column`).
    - `secure`: real cryptography (module docstring) or the plaintext reference.
    - `seed`: the job's common seed (32 bytes; default fresh), which fixes the LSH projection,
      FlyHash, RACE hashes and batch orders: the same seed gives the same result.
    Raises InvalidInput or ConfigError with what is wrong.
    """
    from xclp.client.api import PartyResult, integer_ids
    from xclp.client.run_config import JobResult

    started = time.perf_counter()
    job_type, params = _job(job)
    if len(parties) < 2:
        raise InvalidInput(f"a federation needs at least two parties, got {len(parties)}")
    seed = secrets.token_bytes(32) if seed is None else bytes(seed)
    if len(seed) != 32:
        raise InvalidInput(f"seed must be 32 bytes, got {len(seed)}")
    id_column = params.id_column if id_column is None else id_column
    read = {p: tables.read_any(d, label_column=label_column, id_column=id_column, categorical=params.categorical)
            for p, d in parties.items()}
    data = {p: _checked(p, t, params) for p, t in read.items()}
    scaling = None
    if params.prepares:
        scaling = pooled_scaling([t.X for t in data.values()], params)
        data = {p: replace(t, X=scaling.apply(t.X)) for p, t in data.items()}
    dims = {t.X.shape[1] for t in data.values()}
    if len(dims) != 1:
        raise InvalidInput(f"the parties' tables have different numbers of feature columns: {sorted(dims)}")
    dim = dims.pop()
    members = tuple(sorted(data))
    aggregates, details = _runner(params)(params, data, seed, secure)
    results = {p: PartyResult(JobResult(job_type, params, dim, seed, aggregates[p], members, scaling,
                                        read[p].columns), read[p], integer_ids(parties[p], id_column))
               for p in parties}  # ids of the same type as xclp.client.run gives, so the two can be merged
    learns = _learns(params, data, scaling, details)
    return Simulation(job_type, params, secure, results, learns, time.perf_counter() - started, details)


def _job(job: Any) -> tuple[str, JobParams]:
    if isinstance(job, JobParams):
        return registry.of(job).name, job
    if isinstance(job, (str, os.PathLike)):
        text = str(job)
        if isinstance(job, os.PathLike) or (text.endswith(".toml") and "\n" not in text):
            try:
                with open(job, "rb") as f:
                    raw = tomllib.load(f)
            except OSError as exc:
                raise ConfigError(f"cannot read {job}: {exc.strerror}") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{job} is not valid TOML: {exc}") from None
        else:
            try:
                raw = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"the job is not valid TOML: {exc}") from None
        job = raw
    if not isinstance(job, Mapping) or "type" not in job:
        raise ConfigError("job must be a job file (path or text) with type = \"...\" and [params], a mapping with "
                          "'type' and 'params', or job parameters (e.g. XclpJobParams)")
    job_type = str(job["type"])
    if job_type not in registry.names():
        raise ConfigError(f"unknown job type {job_type!r}; known: {', '.join(registry.names())}")
    params = job.get("params", {})
    if not isinstance(params, Mapping):
        raise ConfigError("[params] must be a table")
    return job_type, registry.parse_params(job_type, params)


def _checked(party: str, table: PartyData, params: JobParams) -> PartyData:
    """The party's table as its session checks it before joining, y filled (−1: no labels)."""
    from xclp.client.run_config import checked_table

    try:
        table = checked_table(table, params)
    except InvalidInput as exc:
        raise InvalidInput(f"party {party!r}: {exc}") from None
    if table.y is None:
        return replace(table, y=np.full(table.X.shape[0], UNLABELED, dtype=np.int64))
    return table


# (params, each party's table, seed, secure) -> (each party's aggregate, what the run showed)
Runner = Callable[[Any, Mapping[str, PartyData], bytes, bool], tuple[dict[str, np.ndarray], dict[str, Any]]]


def run_xclp(params: Any, data: Mapping[str, PartyData], seed: bytes,
             secure: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from xclp.client.steps.xclp import party_scores
    from xclp.reference import xclp_reference
    from xclp.simulation.xclp import run_xclp_inprocess

    rows = sum(d.X.shape[0] for d in data.values())
    resolved = params.for_rows(rows)
    if resolved.candidates:
        unset = (f" (unset, it is \"auto\" above all_pairs_rows = {params.all_pairs_rows} rows, and these parties "
                 f"have {rows})") if params.pair_budget is None else ""
        raise InvalidInput(f"the simulation runs SecureHamming on all pairs, and this job's pair_budget{unset} runs "
                           "candidate pairs: set pair_budget = 1.0 to simulate")
    params = resolved
    C = params.n_classes
    order = sorted(data)
    if secure:
        run = run_xclp_inprocess(_pairs(data), C, seed=seed, L=params.lsh_bits,
                                 key_bits=params.key_bits, params=params.graph_params,
                                 hide_label_mask=params.hide_label_mask, normalise_labels=params.normalise_labels,
                                 insecure_test_keys=params.insecure_test_keys,
                                 label_dp_epsilon=params.label_dp_epsilon,
                                 label_dp_mechanism=params.label_dp_mechanism, label_dp_delta=params.label_dp_delta,
                                 influence_tolerance=params.tolerance)
        missing = sorted(set(order) - set(run.outputs))
        if missing:
            raise InvalidInput(f"parties {', '.join(missing)} got no labels")
        edges = int(run.W.nnz)
        return {p: run.outputs[p].scores for p in order}, {"family": "xclp", "W": run.W, "edges": edges,
                                                           "bytes": dict(run.bytes_sent)}
    if params.label_dp:
        raise InvalidInput("label-DP noise is drawn inside the protocol: simulate it with secure=True")
    pairs = _pairs(data)
    ref = xclp_reference([pairs[p] for p in order], seed, C, params.lsh_bits, params.graph_params,
                         normalise_labels=params.normalise_labels, method=params.influence_method,
                         influence_tolerance=params.tolerance)
    out = {}
    for j, p in enumerate(order):
        y = data[p].y
        assert y is not None
        rows = np.arange(y.size) if params.hide_label_mask else np.flatnonzero(y == UNLABELED)
        Z = ref.scores[ref.offsets[j]:ref.offsets[j + 1]]
        out[p] = party_scores(y, C, rows, Z[rows])
    return out, {"family": "xclp", "W": ref.influence.W, "edges": int(ref.influence.W.nnz)}


def run_flynn(params: Any, data: Mapping[str, PartyData], seed: bytes,
              secure: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from xclp.client.jobs.allreduce import FlynnRelease

    return _allreduce(FlynnRelease(params), "flynn", data, seed, secure)


def run_race(params: Any, data: Mapping[str, PartyData], seed: bytes,
             secure: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from xclp.client.jobs.allreduce import RaceRelease

    return _allreduce(RaceRelease(params), "race", data, seed, secure)


def _allreduce(release: Any, kind: str, data: Mapping[str, PartyData], seed: bytes,
               secure: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from xclp.crypto.masking import PairwiseMasker, generate_x25519, public_bytes, shared_secret
    from xclp.v1.allreduce import SUM_PURPOSE

    members = sorted(data)
    arrays = {p: release.contribution(data[p], seed, len(members)) for p in members}
    if secure:  # each party masks its array; the masks cancel in the coordinator's sum
        keys = {p: generate_x25519() for p in members}
        session = secrets.token_bytes(16)
        arrays = {p: PairwiseMasker(p, {q: shared_secret(keys[p], public_bytes(keys[q])) for q in members if q != p},
                                    session).apply(a, purpose=SUM_PURPOSE, attempt=0, participants=members)
                  for p, a in arrays.items()}
    total = np.zeros_like(next(iter(arrays.values())))
    for a in arrays.values():
        total += a  # in the ring: unsigned arithmetic wraps as the masks need
    aggregate = release.decode(total)
    return dict.fromkeys(members, aggregate), {"family": "counts", "shape": aggregate.shape, "kind": kind}


def run_fedavg(params: Any, data: Mapping[str, PartyData], seed: bytes,
               secure: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from xclp.simulation.fedavg import run_fedavg as fedavg

    model = fedavg(_pairs(data), params, seed=seed, xclp="secure" if secure else "reference").model
    return dict.fromkeys(data, model.flat), {"family": "training", "parameters": model.arch.n_params}


def run_dbcl(params: Any, data: Mapping[str, PartyData], seed: bytes,
             secure: bool) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from xclp.simulation.dbcl import run_dbcl as dbcl

    model = dbcl(_pairs(data), params, seed=seed).model
    final = np.zeros(0) if params.withhold_model else model.flat
    return dict.fromkeys(data, final), {"family": "training", "parameters": model.arch.n_params}


def _pairs(data: Mapping[str, PartyData]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{party: (X, y)} in party order, y with −1 = unlabeled (`_checked` filled it)."""
    out = {}
    for p in sorted(data):
        y = data[p].y
        assert y is not None
        out[p] = (data[p].X, y)
    return out


def _runner(params: JobParams) -> Runner:
    """The simulation of the job type whose parameters these are (the registry's `simulation`)."""
    entry = registry.of(params)
    if entry.simulation is None:
        raise InvalidInput(f"the simulation does not run {entry.name} jobs")
    runner: Runner = entry.simulation_runner()
    return runner


def _learns(params: Any, data: Mapping[str, PartyData], scaling: Scaling | None,
            details: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """What each role would learn, in words, with this run's sizes."""
    n = sum(t.X.shape[0] for t in data.values())
    coordinator = [f"each party's row count ({n} rows in all), labeled-row count and feature count"]
    common: list[str] = []
    if scaling is not None:
        dp = (f"with DP (ε = {params.moments_epsilon:g})" if params.moments_epsilon is not None else "exactly")
        what = "mean and standard deviation" if scaling.standardise else "mean"
        coordinator.append(f"the pooled {what} of every feature, {dp}")
        common.append(f"the pooled {what} of every feature, {dp}")
    epsilon = params.epsilon_total
    privacy = (f"the release is DP with ε = {epsilon:g} in total" if epsilon is not None
               else "no DP: what is released is exact")
    per_party: dict[str, list[str]] = {p: list(common) for p in data}
    family = details["family"]
    if family == "xclp":
        hidden = params.hide_label_mask
        coordinator += ["the Hamming distance between the LSH codes of every pair of rows of different parties "
                        "(SecureHamming opens them to it block by block; it keeps each row's nearest) and each "
                        f"party's k = {params.k} nearest own rows per row: the neighbour graph over all {n} rows "
                        f"({details['edges']} edges); never the features or the codes",
                        "nothing of which rows are labeled" if hidden else "which rows are labeled (not the labels)",
                        "nothing of the labels or scores: the row sums it adds are masked"]
        for p, t in data.items():
            assert t.y is not None
            rows = t.X.shape[0] if hidden else int((t.y == UNLABELED).sum())
            per_party[p].append(f"label scores for its {rows} {'rows' if hidden else 'unlabeled rows'}, from the "
                                "labeled rows of every party; nothing of the others' rows beyond them")
        if params.label_dp:
            privacy = f"each label's use is DP with ε = {params.label_dp_epsilon:g} (label-DP)"
    elif family == "counts":
        shape = "×".join(str(s) for s in details["shape"])
        what = "FlyNN counts" if details["kind"] == "flynn" else "RACE sketch"
        coordinator.append(f"the summed {what} ({shape}) of all parties: the model; no single party's array")
        for p in per_party:
            per_party[p].append(f"the summed {what} ({shape}): the model; minus its own, the sum of the others' "
                                f"({'exactly one party' if len(data) == 2 else f'{len(data) - 1} parties together'})")
    else:
        rounds = params.rounds
        coordinator.append(f"the sum of the parties' updates in each of the {rounds} rounds, and the model after "
                           "each; no single party's update")
        seen = ("nothing of the model: the job withholds it" if getattr(params, "withhold_model", False)
                else f"the model after each of the {rounds} rounds ({details['parameters']} parameters)")
        for p in per_party:
            per_party[p].append(seen)
    coordinator.append(privacy)
    for p in per_party:
        per_party[p].append(privacy)
    return {"coordinator": tuple(coordinator), **{p: tuple(v) for p, v in per_party.items()}}
