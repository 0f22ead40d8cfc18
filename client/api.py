"""Taking part in a job from Python: `xclp.client.run` (what `xclp-client run` and the agent call).

    import pandas as pd
    import xclp.client

    result = xclp.client.run(job="xclp-demo", coordinator="coord.example.org:50051", ca_cert="ca.pem",
                             identity="keys/hospital-a.key", peers="allow.toml",
                             data=pd.read_parquet("patients.parquet"), label_column="diagnosis",
                             id_column="patient_id", paillier_bits=2048)
    result.predictions()        # XCLP: a DataFrame id, label, confidence, score_<c> for this party's rows
    result.model                # FlyNN, RACE, fedavg, dbcl: the model (xclp.client.models.ModelFile)
    result.predict(new_rows)    # FlyNN, fedavg, dbcl: classes for new rows; result.query(rows) for RACE

Data may be a path (CSV, Parquet, .npz, as `xclp-client run --data`), a pandas DataFrame, a
pyarrow Table, or arrays `(X, y)` / `(X, y, ids)` with y's −1 meaning unlabeled. A table's columns
follow the rules of docs/data.md: every column but the label and id columns is a feature.

Errors are the project's exceptions (`xclp.errors`): `InvalidInput` for bad data or a job that
cannot run with it, `ConfigError` for bad settings, `PolicyRefused` when this party's own policy
refuses the job, `ProtocolError` when the coordinator breaks the protocol, `PeerDropped` /
`DeadlineExceeded` when the run fails for want of others, `RunCancelled` when it is stopped.
Each has the exit code `xclp-client` gives it (`xclp.v1.status.exit_code`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from xclp.client import options
from xclp.client.connection import ConnectionConfig
from xclp.client.context import Progress
from xclp.client.jobs.estimate import work_seconds
from xclp.client.ledger import Budget, Ledger, default_directory
from xclp.client.models import ModelFile
from xclp.client.options import Source, Where
from xclp.client.outputs import (
    MODEL_FILE,
    dataframe,
    model_file,
    predict_columns,
    query_columns,
    withheld,
    write_predictions,
    xclp_columns,
)
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import JobResult, RunConfig
from xclp.client.session import DataLoader, PartySession, stderr_progress
from xclp.client.validate import HeldOut
from xclp.crypto import identity as identities
from xclp.data import tables
from xclp.data.party_table import PartyData
from xclp.errors import ConfigError, InvalidInput, RunInterrupted, XclpError
from xclp.race import Estimator
from xclp.runtime import read_bytes, read_toml
from xclp.v1 import registry
from xclp.v1.params import JobParams
from xclp.v1.registry import Output
from xclp.validation import Comparison
from xclp.workers import WorkerSpec

PathLike = str | os.PathLike[str]

__all__ = ["PartyResult", "read_data", "run", "run_with", "take_part"]


@dataclass(frozen=True)
class PartyResult:
    """What a run gave this party.

    `data` is the table as the job read it (its row ids and feature columns); `job` is everything
    the session returned (`xclp.client.run_config.JobResult`), for those who need the raw aggregate;
    `ids`: the id column's own values when they were integers (a DataFrame's or an Arrow table's),
    which `predictions` gives back as they came rather than as text; `validation`: with
    `validate`, this party's accuracy alone and federated on its held-out rows (client/validate.py).
    """

    job: JobResult
    data: PartyData
    ids: tuple[Any, ...] | None = None
    validation: Comparison | None = None  # with validate=F: alone and federated on the held-out rows

    @property
    def job_type(self) -> str:
        return self.job.job_type

    @property
    def participants(self) -> tuple[str, ...]:
        """The parties whose data the result is computed from."""
        return self.job.participants

    @property
    def privacy(self) -> dict[str, Any] | None:
        """With DP: what this party's rows (or labels) spent, as the run's privacy report."""
        return self.job.privacy

    @property
    def approximation(self) -> dict[str, Any] | None:
        """XCLP with sparse influence (influence_tolerance): the tolerance, the columns received and the
        largest and mean share of a column's mass the push left out; every class column of this party's
        Z̄ keeps at least 1 − dropped_max of its degree-weighted mass (docs/jobs/xclp.md). None if exact."""
        return self.job.approximation

    @property
    def output(self) -> Output:
        """PREDICTIONS (xclp: labels for this party's rows) or MODEL (the other job types)."""
        return registry.get(self.job_type).output

    @property
    def model(self) -> ModelFile | None:
        """The trained model (FlyNN, RACE, fedavg, dbcl); None for xclp, or when the job withholds it."""
        if self.output is not Output.MODEL or withheld(self.job):
            return None
        return model_file(self.job)

    def predictions(self) -> Any:
        """XCLP: a pandas DataFrame with a row per row of this party's table: id, label (the class
        name), confidence, score_<c> per class (pip install 'xclp[pandas]')."""
        if self.output is not Output.PREDICTIONS:
            raise InvalidInput(f"a {self.job_type} job gives a model, not predictions for the party's rows: use "
                               "result.model, result.predict(data) or result.query(data)")
        columns = xclp_columns(self.data, self.job)
        if self.ids is not None and len(self.ids) == len(columns["id"]):
            columns["id"] = list(self.ids)
        return dataframe(columns)

    def predict(self, data: Any, *, id_column: str | None = None) -> Any:
        """FlyNN, fedavg, dbcl: the model's classes for `data` (any form `run` takes; a label column
        is ignored) as a DataFrame id, prediction (a network also: confidence)."""
        model = self._model("predict")
        return dataframe(predict_columns(model, _features_only(data, model, id_column)))

    def query(self, data: Any, *, id_column: str | None = None, estimator: Estimator = "mean",
              groups: int | None = None) -> Any:
        """RACE: the kernel density (id, kde) or class estimates (id, prediction, score_<c>) for `data`."""
        model = self._model("query")
        return dataframe(query_columns(model, _features_only(data, model, id_column), estimator=estimator,
                                       groups=groups))

    def save(self, out: PathLike) -> Path | None:
        """Write the output as `xclp-client run --out` does (atomically): XCLP predictions to a .csv
        file or a directory's predictions.csv; a model to a .npz file or a directory's model.npz.
        None when the job withholds the model."""
        directory = str(out).endswith(("/", os.sep))  # Path() drops the separator that says so
        path = Path(out)
        if self.output is Output.PREDICTIONS:
            return write_predictions(path, self.data, self.job)
        model = self.model
        if model is None:
            return None
        return model.save(path / MODEL_FILE if path.is_dir() or directory else path)

    def _model(self, what: str) -> ModelFile:
        model = self.model
        if model is None:
            raise InvalidInput(f"this {self.job_type} run gave this party no model to {what} with")
        return model


def run(*, job: str, coordinator: str, identity: PathLike | Ed25519PrivateKey, peers: PathLike | Mapping[str, bytes],
        data: Any, party: str | None = None, label_column: str | None = tables.DEFAULT_LABEL,
        id_column: str | None = None, delimiter: str | None = None, ca_cert: PathLike | None = None,
        client_cert: PathLike | None = None,
        client_key: PathLike | None = None, server_name: str | None = None, insecure: bool = False,
        paillier_bits: int | None = None, insecure_test_keys: bool = False, workers: str | int | None = None,
        insecure_workers: bool = False, min_parties: int = 3, min_share_threshold: int = 2,
        require_dp: float | None = None, require_label_dp: float | None = None, allow_hide_label_mask: bool = False,
        allow_unsketched_layers: bool = False, allow_non_dp_dbcl: bool = False, max_memory_gb: float | None = None,
        max_work_minutes: float | None = None, max_paillier_hours: float | None = None, state: PathLike | None = None,
        allow_rerun: bool = False, privacy_budget: str | float | Budget | None = None,
        connect_timeout: float = 60.0, idle_timeout: float = 900.0, rejoins: int = 3, validate: float | None = None,
        progress: Progress | None = None) -> PartyResult:
    """Take part in one run of `job` on the coordinator at `coordinator` (host:port) with `data`.

    Blocks until the run ends and returns this party's result; raises an `xclp.errors.XclpError`
    if it cannot take part or the run fails. The settings are `xclp-client run`'s flags, with
    the same meanings and defaults (docs: CLI reference):

    - `identity`: this party's Ed25519 key (a file from `xclp-client keygen`, or the key);
      `peers`: the job's allow-list (allow.toml, or a mapping party id -> public key bytes);
      `party`: this party's id, by default the one whose key in `peers` is `identity`'s.
    - `data`: a path, a pandas DataFrame, a pyarrow Table, or arrays `(X, y[, ids])`;
      `label_column` (None: no labels), `id_column` (None: row numbers), `delimiter` (CSV).
    - TLS: `ca_cert`, `client_cert`, `client_key`, `server_name`; `insecure` for plaintext
      gRPC on a test machine.
    - XCLP: `paillier_bits` (the job's key size), `workers` (local processes or a Dask scheduler;
      local processes import the main module, so a script calls `run` under
      `if __name__ == "__main__":`, or passes `workers=0` to do the work in this process).
    - This party's own policy: `min_parties`, `min_share_threshold`, `require_dp`, `require_label_dp`,
      `allow_hide_label_mask`, `allow_unsketched_layers`, `allow_non_dp_dbcl`, `max_memory_gb`, `max_work_minutes`
      (default 1440; `max_paillier_hours` is its old name, in hours);
      `state` (the directory of the party's privacy ledger, docs/privacy.md; default
      $XDG_STATE_HOME/xclp), `privacy_budget` (each data set's DP budget: ε, "ε,δ" or a Budget;
      default ε = 10, δ = 1e-5) and `allow_rerun`.
    - `connect_timeout`: how long to keep retrying an unreachable coordinator (with exponential
      back-off) before DeadlineExceeded; `idle_timeout`: give up after this long without news;
      `rejoins`: how many times to join the job's next run when the coordinator stops or restarts
      during this party's run and cannot go on with it (0: never; `take_part`).
    - `validate`: XCLP: hold out this fraction of the party's labeled rows locally (never sent)
      and compare, on them, XCLP's labels with its own rows alone (`PartyResult.validation`).
    - `progress`: called with each progress line (default: printed to stderr).
    """
    settings = options.read_settings({k: v for k, v in locals().items() if k != "progress"}, Where(Source.API))
    return run_with(settings, named=Where(Source.API).named, progress=progress)


def run_with(settings: Mapping[str, Any], *, named: Callable[[str], str],
             progress: Progress | None = None) -> PartyResult:
    """`run` with settings read by `options.read_settings` (a value left out has its option's
    default); `named(option)`: how the user gave it, for the errors (`xclp-client run` names a flag
    or a party.toml key, `run` its keyword)."""
    def get(name: str) -> Any:
        return options.value(settings, name)

    say = progress or stderr_progress
    worker_spec = WorkerSpec.parse(get("workers"), insecure=get("insecure_workers"), given=named("workers"),
                                   insecure_given=named("insecure_workers"))  # before reading anything
    if worker_spec.scheduler is not None and worker_spec.scheduler.startswith("tcp://"):
        say(f"WARNING: insecure workers: Paillier tasks go to {worker_spec.scheduler} in the clear")
    identity, peers, data = get("identity"), get("peers"), get("data")
    key = (identity if isinstance(identity, Ed25519PrivateKey)
           else identities.load_private_key(read_bytes(Path(identity), "identity key"), source=str(identity)))
    allow = (dict(peers) if isinstance(peers, Mapping)
             else identities.allow_list(read_toml(Path(peers)).get("parties"), source=str(peers)))
    party = _party(get("party"), key, allow)
    validate = get("validate")
    held = None if validate is None else HeldOut(party, validate)
    source = read_data(data, label_column=get("label_column"), id_column=get("id_column"),
                       delimiter=get("delimiter"), progress=say)
    connection = ConnectionConfig(address=get("coordinator"), ca_cert=get("ca_cert"), client_cert=get("client_cert"),
                                  client_key=get("client_key"), server_name=get("server_name"),
                                  insecure=get("insecure"))
    if connection.insecure:
        say("WARNING: insecure: talking plaintext gRPC to the coordinator")
    memory, state = get("max_memory_gb"), get("state")
    config = RunConfig(job_id=get("job"), party_id=party, identity=key, connection=connection,
                       join_wait_seconds=get("connect_timeout"), idle_seconds=get("idle_timeout"),
                       paillier_bits=get("paillier_bits") or 0,
                       workers=worker_spec, peers=allow,
                       max_memory_bytes=None if memory is None else int(memory * 2**30),
                       max_work_seconds=work_seconds(get("max_work_minutes"), get("max_paillier_hours")),
                       policy=PartyPolicy.from_settings(settings, named=named),
                       ledger=Ledger(state if state is not None else default_directory(),
                                     budget=Budget.of(get("privacy_budget"), named("privacy_budget")),
                                     allow_rerun=get("allow_rerun"), identity=key))
    result = take_part(config, source if held is None else held.loader(source), progress=say,
                       rejoins=get("rejoins"))
    return replace(result, ids=integer_ids(data, get("id_column")),
                   validation=None if held is None else held.compare(result.job, result.data))


def integer_ids(data: Any, id_column: str | None) -> tuple[Any, ...] | None:
    """A DataFrame's or Arrow table's id column, when it holds integers (they used to come back as
    text); None otherwise (a CSV's ids are text; without an id column the ids are row numbers)."""
    if id_column is None:
        return None
    schema = getattr(data, "schema", None)
    if schema is not None and hasattr(data, "column"):  # pyarrow.Table
        import pyarrow as pa

        if id_column in schema.names and pa.types.is_integer(schema.field(id_column).type):
            return tuple(data.column(id_column).to_pylist())
        return None
    if not (hasattr(data, "iloc") and id_column in getattr(data, "columns", ())):  # not a pandas DataFrame's
        return None
    column = data[id_column]
    kind = getattr(column.dtype, "kind", "")
    return tuple(int(v) for v in column.tolist()) if kind and kind in "iu" else None


def take_part(config: RunConfig, data: DataLoader, *, progress: Progress = stderr_progress,
              started: Callable[[PartySession], None] | None = None, rejoins: int = 0) -> PartyResult:
    """One run with a prepared `RunConfig` (the agent's way in): `data(params)` reads the table once
    the job's parameters are known; `started(session)` gets the session (to abort it from another
    thread). `rejoins`: how many times to join the job's next run when the coordinator stopped or
    restarted during this party's run and could not go on with it (RunInterrupted). Each joins
    afresh: a new session, keys, masks and seeds, and the ledger decides what may be released again
    (an exact release among the same parties, a DP release against the budget)."""
    loaded: list[PartyData] = []

    def load(params: JobParams) -> PartyData:
        loaded.append(data(params))  # as read: the session checks it (checked_table)
        return loaded[-1]

    for joined in range(1 + max(rejoins, 0)):
        session = PartySession(config, load, progress=progress)
        if started is not None:
            started(session)
        try:
            result = session.run()
        except RunInterrupted as exc:
            if joined == rejoins or config.run_id:  # a run named by the agent: it is offered the next one
                raise
            progress(f"{exc}; joining the job's next run ({joined + 1} of at most {rejoins} times; the coordinator "
                     f"has {config.join_wait_seconds:g} s to answer, --connect-timeout)")
            continue
        return PartyResult(result, loaded[-1])
    raise AssertionError("unreachable")


def read_data(data: Any, *, label_column: str | None = tables.DEFAULT_LABEL, id_column: str | None = None,
              delimiter: str | None = None, progress: Progress | None = None) -> DataLoader:
    """`data` as a loader for the job's parameters (categorical columns are known only then).

    The table is read at once, so that bad data fails before anything is sent; a text column the
    job may declare categorical is the exception (tables.TextFeature): that failure waits for the
    job's parameters.
    """
    say = progress or stderr_progress
    said: set[str] = set()

    def once(message: str) -> None:
        if message not in said:  # the table may be read twice (categorical columns)
            said.add(message)
            say(message)

    def read(categorical: Mapping[str, tuple[str, ...]] | None) -> PartyData:
        table = tables.read_any(data, label_column=label_column, id_column=id_column, delimiter=delimiter,
                                categorical=categorical)
        empty = int(table.missing.sum())
        cells = f", {empty} empty feature cells" if empty else ""
        say(f"loaded {table.X.shape[0]} rows x {table.X.shape[1]} features ({int(table.labeled.sum())} labeled"
            f"{cells}) from {_describe(data)}")
        if table.labels is None and table.y is None and label_column is not None:
            once(f"{_describe(data)} has no label column {label_column!r}, so every row is unlabeled (name the "
                 "label column with --label-column, label_column in a config or catalogue, or label_column=...)")
        return table

    if isinstance(data, (str, os.PathLike)) and not Path(data).is_file():
        raise InvalidInput(f"cannot read {data}: no such file")
    try:
        early: PartyData | XclpError = read(None)
    except tables.TextFeature as exc:  # said now, not only once the coordinator has answered
        early = exc
        say(f"WARNING: {exc}; this party can take part only in a job that declares that column categorical "
            "(it learns the job's parameters once connected)")

    def load(params: JobParams) -> PartyData:
        if params.categorical:
            table = read(params.categorical)
        elif isinstance(early, XclpError):
            raise early
        else:
            table = early
        if params.label_classes and not table.labeled.any():
            once("this party's table has no labeled row: the job learns from labeled rows, so this party brings "
                 "none (its rows take part all the same)")
        return table

    return load


def _features_only(data: Any, model: ModelFile, id_column: str | None) -> PartyData:
    """New rows for a model: any form `run` takes; a label column is ignored."""
    if isinstance(data, np.ndarray):
        data = (data, None)
    return tables.read_any(data, id_column=id_column, categorical=model.params.categorical)


def _party(party: str | None, key: Ed25519PrivateKey, allow: Mapping[str, bytes]) -> str:
    """This party's id: the allow-list's entry for its key (checked against `party` when given)."""
    public = identities.public_bytes(key)
    mine = [p for p, k in allow.items() if k == public]
    if party is not None:
        identities.check_party_id(party)
        if party in allow and allow[party] != public:
            raise ConfigError(f"the identity key is not the key the allow-list pins for {party!r}")
        return party
    if len(mine) != 1:
        raise ConfigError("the allow-list pins this identity key for no party; pass party=..." if not mine else
                          f"the allow-list pins this identity key for {len(mine)} parties ({', '.join(mine)}); "
                          "pass party=...")
    return mine[0]


def _describe(data: Any) -> str:
    return str(data) if isinstance(data, (str, os.PathLike)) else f"a {type(data).__name__}"
