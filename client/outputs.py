"""What a party writes: XCLP predictions, model files, and an agent's run directory.

Every file is written atomically (a temporary file, then a rename) with mode 0600: outputs are
the party's data. An agent's run directory `<out>/<job>/<run>/` appears whole or not at all: it is
filled as `<out>/<job>/.<run>.partial/` and renamed once every file is in.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xclp.client.models import ModelFile
from xclp.client.run_config import JobResult
from xclp.data.party_table import PartyData
from xclp.errors import ConfigError, InvalidInput, PolicyRefused
from xclp.propagation import predict as xclp_predict
from xclp.race import Estimator
from xclp.race import query as race_query
from xclp.runtime import write_atomic
from xclp.v1.registry import ModelKind, Output, get, names

if TYPE_CHECKING:
    from xclp.client.api import PartyResult

PREDICTIONS_FILE = "predictions.csv"
MODEL_FILE = "model.npz"  # the model's name when --out is a directory
RUN_FILE = "run.json"


def write_predictions(out: Path, data: PartyData, result: JobResult) -> Path:
    """The XCLP output (docs/design.md §5.7): id, label, confidence, score_<c>, atomically, own row
    ids; the id column under the name the party's table gave it (`with_id_name`).

    `out` is a .csv file or a directory that gets predictions.csv.
    """
    path = out if out.suffix == ".csv" else out / PREDICTIONS_FILE
    write_columns(path, with_id_name(xclp_columns(data, result), data))
    return path


def with_id_name(columns: Columns, data: PartyData) -> Columns:
    """`columns` with their "id" column named as the table's id column (`patient_id`), so that a
    file joins back onto the user's table by that name; "id" for row numbers, or where the name is
    another output column's ("label", "score_0")."""
    name = data.id_column
    if not name or name == "id" or name in columns:
        return columns
    return {(name if key == "id" else key): value for key, value in columns.items()}


Columns = dict[str, Any]  # column name -> a list or a 1-D array, every column as long as the table


def xclp_columns(data: PartyData, result: JobResult) -> Columns:
    """An XCLP job's labels for this party's rows: id, label, confidence, score_<c>."""
    scores = result.aggregate
    labels, confidence = xclp_predict(scores)
    names = class_names(result.params.classes, scores.shape[1])
    return {"id": list(data.ids), "label": [names[lab] for lab in labels], "confidence": confidence,
            **{f"score_{c}": scores[:, k] for k, c in enumerate(names)}}


def predict_columns(model: ModelFile, data: PartyData) -> Columns:
    """A FlyNN or network model's classes for `data`: id, prediction (a network also: confidence)."""
    if model.kind not in (ModelKind.FLYNN, ModelKind.NETWORK):
        takes = [t for t in names() if get(t).model in (ModelKind.FLYNN, ModelKind.NETWORK)]
        raise InvalidInput(f"this is a {model.job_type} model: predict takes {', '.join(takes[:-1])} and "
                           f"{takes[-1]} models (RACE models answer a query: `xclp-client query`, PartyResult.query)")
    labels, confidence = model.predict(model.features(data))
    classes = class_names(model.class_names, model.n_classes)
    columns: Columns = {"id": list(data.ids), "prediction": [classes[p] for p in labels]}
    if confidence is not None:
        columns["confidence"] = confidence
    return columns


def query_columns(model: ModelFile, data: PartyData, *, estimator: Estimator = "mean",
                  groups: int | None = None) -> Columns:
    """A RACE model's answers for `data`: id, kde (a density model), or id, prediction, score_<c>."""
    if model.kind is not ModelKind.RACE:
        raise InvalidInput(f"this is a {model.job_type} model: only RACE models answer a query")
    X = model.features(data)
    race = model.loaded()
    if model.aggregate.ndim == 3:
        scores = race.classifier().scores(X)
        classes = class_names(model.class_names, scores.shape[1])
        return {"id": list(data.ids), "prediction": [classes[p] for p in np.argmax(scores, axis=1)],
                **{f"score_{c}": scores[:, k] for k, c in enumerate(classes)}}
    kde = race_query(model.aggregate, None, race.hashes, X, estimator=estimator, groups=groups)
    return {"id": list(data.ids), "kde": kde}


def write_columns(path: Path, columns: Columns, *, float_format: Callable[[float], str] = repr) -> None:
    """`columns` as a CSV file, atomically; floats in `float_format` (repr: every digit)."""
    cells = [[float_format(float(v)) for v in c] if isinstance(c, np.ndarray) and c.dtype.kind == "f"
             else [str(v) for v in c] for c in columns.values()]
    write_csv(path, list(columns), [list(row) for row in zip(*cells)])


def dataframe(columns: Columns) -> Any:
    """`columns` as a pandas.DataFrame (pip install 'xclp[pandas]')."""
    try:
        import pandas as pd
    except ImportError:
        raise ConfigError("a DataFrame needs pandas: pip install 'xclp[pandas]'") from None
    return pd.DataFrame(columns)


def withheld(result: JobResult) -> bool:
    """A model output the job keeps from the parties (dbcl's withhold_model): an empty aggregate."""
    return get(result.job_type).output is Output.MODEL and result.aggregate.size == 0


def model_file(result: JobResult) -> ModelFile:
    return ModelFile(result.job_type, result.params, result.dim, result.seed, result.aggregate, result.scaling,
                     result.columns)


def class_names(classes: tuple[str, ...] | None, n_classes: int) -> list[str]:
    """How outputs name classes: the job's declared names, else the class numbers."""
    return list(classes) if classes else [str(c) for c in range(n_classes)]


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_atomic(path, buf.getvalue().encode(), mode=0o600)  # predictions are the party's data


def check_dir_name(name: str, what: str) -> str:
    """`name` as one plain path component (the coordinator chooses job and run ids; they must not
    lead an agent's outputs out of its output directory)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or len(name) > 128:
        raise PolicyRefused(f"the {what} {name!r} is not a plain directory name: refusing to write outputs under it")
    return name


def write_run_dir(out: Path, job_id: str, run_id: str, party: PartyResult) -> Path:
    """An agent's outputs of one run, atomically: predictions.csv or model.npz (the job type's output), and run.json
    (ids, type, participants, time: nothing about the data)."""
    data, result = party.data, party.job
    final = out / check_dir_name(job_id, "job id") / check_dir_name(run_id, "run id")
    if final.exists():
        raise ConfigError(f"{final} exists already: is another agent writing to this output directory?")
    partial = out / job_id / f".{run_id}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True, mode=0o700)
    try:
        files = []
        if get(result.job_type).output is Output.PREDICTIONS:
            files.append(write_predictions(partial / PREDICTIONS_FILE, data, result).name)
        elif not withheld(result):
            model_file(result).save(partial / MODEL_FILE)
            files.append(MODEL_FILE)
        write_atomic(partial / RUN_FILE, (json.dumps({
            "job_id": job_id, "run_id": run_id, "job_type": result.job_type, "participants": list(result.participants),
            "rows": int(data.X.shape[0]), "files": files, "finished_at": time.time(),
            **({"privacy": result.privacy} if result.privacy is not None else {}),
            **({"approximation": result.approximation} if result.approximation is not None else {})},
            indent=2) + "\n").encode())
        os.rename(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def remove_partial(out: Path, job_id: str, run_id: str) -> None:
    shutil.rmtree(out / check_dir_name(job_id, "job id") / f".{check_dir_name(run_id, 'run id')}.partial",
                  ignore_errors=True)
