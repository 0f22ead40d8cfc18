"""Does federating help? (`xclp-client simulate`): per party, accuracy on held-out labeled rows
for the party alone, federated, and pooled, before any institution is involved.

Each party's held-out rows are a fraction of its labeled rows (`holdout`, drawn from a fixed
public seed so that a rerun holds out the same rows), whose labels are hidden from every
computation and only compared with at the end:
- alone: label propagation on the party's own rows (exact cosine, the job's k, α and p:
  `xclp.baselines.per_client_lp`), what it can do without anyone;
- federated: the XCLP job simulated over every party (`simulate`, the plaintext reference, which
  the service's result equals);
- pooled: the same propagation as alone on all the parties' rows in one table: the plaintext
  reference a central data set would give, which no party can run;
- logistic: a logistic regression on the party's own labeled rows (`xclp.baselines.logistic_baseline`),
  the plain supervised model it could fit without anyone.
Each accuracy comes with its 95 % Wilson interval. A party for which federating is worse than alone
beyond those intervals is warned; where they overlap it is told the held-out rows are too few to
tell; and where the logistic regression beats federating beyond them, that a local model may serve
it better. On a table where the parties' labels disagree, or whose columns do not carry the class,
XCLP can do worse than each alone.

`xclp-client simulate` runs this module in a process of its own (`python -m xclp.simulation.compare`
with the request as JSON): a simulation drives the coordinator's steps too, and the party's
command line never loads the coordinator's code (docs/design.md §1's arrows).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from xclp.baselines import logistic_baseline, per_client_lp
from xclp.data import tables
from xclp.errors import ConfigError, XclpError
from xclp.propagation import predict
from xclp.simulation.simulate import _checked, _job, simulate
from xclp.v1.xclp import XclpJobParams
from xclp.validation import Comparison, accuracy, check_fraction, hold_out, table

__all__ = ["Comparison", "compare", "table"]


def compare(job: Any, parties: Mapping[str, Any], *, holdout: float = 0.2, seed: bytes | None = None,
            label_column: str | None = tables.DEFAULT_LABEL, id_column: str | None = None) -> list[Comparison]:
    """Per party, in the order given (module docstring)."""
    job_type, params = _job(job)
    if not isinstance(params, XclpJobParams):
        raise ConfigError(f"simulate compares XCLP jobs (labels for a party's own rows); this job is {job_type!r}")
    check_fraction(holdout, "--holdout")
    id_column = params.id_column if id_column is None else id_column
    read = {p: _checked(p, tables.read_any(d, label_column=label_column, id_column=id_column,
                                           categorical=params.categorical), params) for p, d in parties.items()}
    held, hidden = {}, {}
    for p, t in read.items():
        assert t.y is not None
        held[p] = hold_out(t.y, holdout, p, "xclp/simulate-holdout")
        y = t.y.copy()
        y[held[p]] = -1
        hidden[p] = replace(t, y=y, labels=None)
    sim = simulate(params, hidden, secure=False, seed=seed)
    scaling = sim[next(iter(read))].job.scaling
    X = {p: t.X if scaling is None else scaling.apply(t.X) for p, t in read.items()}
    graph, norm, C = params.graph_params, params.normalise_labels, params.n_classes
    pooled = per_client_lp(np.vstack(list(X.values())), np.concatenate([t.y for t in hidden.values()]), C, graph,
                           norm).labels
    out, start = [], 0
    for p, t in read.items():
        assert t.y is not None and hidden[p].y is not None
        truth, rows = t.y[held[p]], held[p]
        alone = per_client_lp(X[p], hidden[p].y, C, graph, norm).labels
        federated, _ = predict(sim[p].job.aggregate)
        mine = pooled[start: start + t.X.shape[0]]
        start += t.X.shape[0]
        local = logistic_baseline(X[p], hidden[p].y, C)
        out.append(Comparison(p, int(rows.size), accuracy(alone[rows], truth), accuracy(federated[rows], truth),
                              accuracy(mine[rows], truth), accuracy(local[rows], truth)))
    return out


def main(argv: list[str] | None = None) -> int:
    """`xclp-client simulate`'s work: argv[0] is the request as JSON (job, data: party -> table,
    holdout, label_column, id_column); prints the table; exits as xclp-client does."""
    from xclp.v1.exits import EXIT_OK, exit_code

    request = json.loads((sys.argv[1:] if argv is None else argv)[0])
    try:
        rows = compare(request["job"], request["data"], holdout=request["holdout"],
                       label_column=request["label_column"], id_column=request["id_column"])
    except XclpError as exc:
        print(f"xclp-client: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    print(table(rows))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
