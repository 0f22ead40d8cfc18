"""The model files of training jobs (fedavg, dbcl): what `predict` reads from them
(xclp.v1.registry's model_loader; client/models.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from xclp.nn import Network
from xclp.propagation import predict as predict_labels
from xclp.v1.dbcl import DbclJobParams
from xclp.v1.fedavg import FedavgJobParams

if TYPE_CHECKING:
    from xclp.client.models import ModelFile


@dataclass(frozen=True)
class NetworkPredictor:
    """A trained network's model file as `predict` uses it: classes and confidences."""

    network: Network

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels, confidence = predict_labels(self.network.probabilities(X))
        return labels, confidence


def network_model(file: ModelFile) -> NetworkPredictor:
    p = file.params
    assert isinstance(p, (FedavgJobParams, DbclJobParams))  # the registry's schemas of the types that train one
    return NetworkPredictor(Network(p.architecture(file.dim), np.asarray(file.aggregate, dtype=np.float64)))
