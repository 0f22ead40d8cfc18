"""`xclp-client run --validate F`: does federating help this party, in a real run?

A fraction F of the party's labeled rows is held out locally: their labels are hidden from the run
(the rows go in as unlabeled rows, so no value of their labels is used or released) and, once the
run is done, the party compares on those rows the labels XCLP gave with the labels label
propagation on its own rows alone gives (the same preparation, k, α and p: `xclp.baselines`),
and warns when federating is not better. The rows are drawn from a public seed named by the party
(xclp.validation), so a rerun holds out the same rows; predictions cover every row as usual.

In the ledger the table stays the data set it is (its digest is the whole table's,
`PartyData.dataset_digest`), so a validated run and a plain one are accounted together. Not with
label-DP: its randomised responses are drawn once per data set for every labeled row, and a run
that hides some labels could not reuse them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from xclp.baselines import logistic_baseline, per_client_lp
from xclp.client.ledger import data_digest
from xclp.client.run_config import JobResult
from xclp.client.session import DataLoader
from xclp.data.party_table import PartyData
from xclp.data.validation import UNLABELED
from xclp.errors import ConfigError, InvalidInput
from xclp.propagation import predict
from xclp.v1.params import JobParams
from xclp.v1.xclp import XclpJobParams
from xclp.validation import Comparison, accuracy, check_fraction, hold_out

SEED_NAME = "xclp/validate-holdout"


class HeldOut:
    """The rows one party holds out of one run, and its comparison on them afterwards."""

    def __init__(self, party: str, fraction: float) -> None:
        self.party, self.fraction = party, check_fraction(float(fraction), "--validate")
        self.rows: np.ndarray | None = None
        self.truth: np.ndarray | None = None

    def loader(self, source: DataLoader) -> DataLoader:
        """`source` with this party's held-out labels hidden, refusing a job it cannot validate."""
        def load(params: JobParams) -> PartyData:
            table = source(params)
            if not isinstance(params, XclpJobParams):
                raise ConfigError("--validate holds out labels of an XCLP job (labels for a party's own rows); "
                                  "this job trains a model: drop --validate")
            if params.label_dp:
                raise ConfigError("--validate cannot run with label-DP (label_dp_epsilon): the labels' randomised "
                                  "responses are drawn once for every labeled row of the table; drop --validate, or "
                                  "compare without DP in `xclp-client simulate`")
            table = table.with_classes(params.classes)
            if table.y is None:
                raise InvalidInput("--validate needs labeled rows to hold out, and this table has no label column")
            self.rows = hold_out(table.y, self.fraction, self.party, SEED_NAME)
            self.truth = table.y[self.rows]
            y = table.y.copy()
            y[self.rows] = UNLABELED
            return replace(table, y=y, labels=None, dataset_digest=data_digest(table))
        return load

    def compare(self, job: JobResult, data: PartyData) -> Comparison:
        """On the held-out rows of `data` (as the run took it, their labels hidden): accuracy of the
        run's labels, and of label propagation on this party's rows alone."""
        if self.rows is None or self.truth is None or data.y is None:
            raise InvalidInput("--validate: the run never read the table")
        params = job.params
        assert isinstance(params, XclpJobParams)
        X = data.X if job.scaling is None else job.scaling.apply(data.X)
        alone = per_client_lp(X, data.y, params.n_classes, params.graph_params, params.normalise_labels).labels
        federated, _ = predict(job.aggregate)
        local = logistic_baseline(X, data.y, params.n_classes)
        return Comparison(self.party, int(self.rows.size), accuracy(alone[self.rows], self.truth),
                          accuracy(federated[self.rows], self.truth), baseline=accuracy(local[self.rows], self.truth))
