"""The README's claim about the demo data, checked without Docker or a network: on the bundled
three-hospital split, XCLP (plaintext reference, the demo's k, α, p, L and one-hot labels) labels
every hospital's unlabeled rows better than label propagation on that hospital's rows alone.

The secure run equals this reference (tests/service/test_xclp_job.py), so the claim about the
reference is the claim about `xclp-client demo` and `docker compose up`, whose common seed is
drawn fresh each run; here three fixed seeds stand in for it.
"""

from __future__ import annotations

import numpy as np
import pytest

from xclp import demo
from xclp.baselines import per_client_lp
from xclp.data import tables as party_data
from xclp.reference import xclp_reference

SEEDS = (b"readme-claim-1".ljust(32, b"\0"), b"readme-claim-2".ljust(32, b"\0"), b"readme-claim-3".ljust(32, b"\0"))


@pytest.fixture(scope="module")
def hospitals() -> list[tuple[str, object, np.ndarray]]:
    out = []
    for party in demo.PARTIES:
        data = party_data.load(demo.DEMO_DATA / f"{party}.csv", id_column="row_id")
        out.append((party, data, demo.truth(demo.DEMO_DATA / f"{party}.truth.csv", data.ids)))
    return out


@pytest.mark.parametrize("seed", SEEDS, ids=["seed1", "seed2", "seed3"])
def test_xclp_beats_every_hospital_alone_on_the_demo_data(hospitals, seed: bytes) -> None:
    ref = xclp_reference([(d.X, d.y) for _, d, _ in hospitals], seed, demo.N_CLASSES, 1024, demo.GRAPH,
                         normalise_labels=demo.LABEL_NORM)
    for j, (party, data, truth) in enumerate(hospitals):
        unlabeled = ~data.labeled
        together = np.mean(ref.labels[ref.party_rows(j)][unlabeled] == truth[unlabeled])
        alone = np.mean(per_client_lp(data.X, data.y, demo.N_CLASSES, demo.GRAPH, demo.LABEL_NORM).labels[unlabeled]
                        == truth[unlabeled])
        # README: "Every hospital gains 9-19 points"; demand at least 5 on every seed.
        assert together >= alone + 0.05, (party, together, alone)
