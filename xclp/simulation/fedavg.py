"""Federated training (docs/design.md §7, Scott et al. 2023 Alg. 2) with every party in one process.

`run_fedavg` runs the rounds of a `type = "fedavg"` job as the service does — the same public
sample of parties, the same θ₀, each party's batch order from the same generator, the same
pseudo-labels — without the masking: the update sum is formed in float64 (the service sums fixed
point, so the two agree within 2^-frac_bits per party and parameter). It is the oracle of the
service's parity test and what benchmarks/fedavg_xclp.py measures.

XCLP pseudo-labels come from one of two places (`xclp=`):
- "secure": `run_xclp_inprocess`, the real protocol (Paillier SecureHamming, masked SecureRowSums);
- "reference": `xclp.reference.xclp_reference`, the plaintext oracle that the secure protocol
  equals (tests/service/test_xclp_steps.py) — fast enough for benchmarks over many rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from xclp.data.validation import UNLABELED
from xclp.errors import InvalidInput
from xclp.fedavg import (
    PseudoLabels,
    client_update,
    initial_network,
    local_pseudo_labels,
    local_rng,
    private_client_update,
    round_seed,
    sample_parties,
    server_update,
    training_set,
)
from xclp.nn import Network
from xclp.privacy.dpsgd import RoundNoise
from xclp.reference import xclp_reference
from xclp.simulation.xclp import run_xclp_inprocess
from xclp.v1.fedavg import FedavgJobParams


@dataclass(frozen=True)
class RoundRecord:
    """One round: who took part, θ before it, each party's pseudo-labels (None: none that round),
    θ after it, and seconds spent on pseudo-labels and on training."""

    round: int
    participants: tuple[str, ...]
    model_in: np.ndarray
    pseudo: Mapping[str, PseudoLabels | None]
    model_out: np.ndarray
    pseudo_seconds: float
    train_seconds: float


@dataclass
class FedavgRun:
    model: Network
    rounds: list[RoundRecord] = field(default_factory=list)


def run_fedavg(
    parties: Mapping[str, tuple[np.ndarray, np.ndarray]],
    params: FedavgJobParams,
    *,
    seed: bytes,
    xclp: str = "reference",
    executor: Executor | None = None,
    on_round: Callable[[RoundRecord, Network], None] | None = None,
) -> FedavgRun:
    """Train over parties = {id: (X float[n_j, d] prepared, y int[n_j], −1 = unlabeled)}.

    seed: the job's common seed (the service's `JobResult.seed`); it keys each party's batch order
    and each round's XCLP LSH. `on_round(record, model)` is called after every round.
    """
    if xclp not in ("secure", "reference"):
        raise InvalidInput(f"xclp must be 'secure' or 'reference', got {xclp!r}")
    if not parties:
        raise InvalidInput("no parties")
    dims = {np.asarray(X).shape[1] for X, _ in parties.values()}
    if len(dims) != 1:
        raise InvalidInput(f"the parties' data have different numbers of columns: {sorted(dims)}")
    data = {pid: (np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64)) for pid, (X, y) in parties.items()}
    net = initial_network(params.architecture(dims.pop()), params.seed)
    run = FedavgRun(net)
    for t in range(params.rounds):
        members = sample_parties(params.seed, t, list(data), params.fraction)
        started = time.perf_counter()
        pseudo = _pseudo_labels(net, {p: data[p] for p in members}, params, params.pseudo_labels_in(t),
                                round_seed(seed, t), xclp, executor)
        trained = time.perf_counter()
        dp = params.dp_plan(net.arch.n_params)
        total = np.zeros_like(net.flat)
        noisy = np.zeros(net.arch.n_params, dtype=np.int64)
        rows = 0
        for pid in members:
            X, y = data[pid]
            rng = local_rng(seed, pid, t)
            if dp is None:
                delta, n = client_update(net, training_set(X, y, pseudo[pid]), params.optimiser, rng)
                total += delta
            else:
                q, n = private_client_update(net, training_set(X, y, pseudo[pid]), params.learning_rate,
                                             params.batch_size, params.dp_local_steps, dp, rng)
                noisy += q + (RoundNoise(dp, q.shape[0]).for_members(len(members)) if dp.distributed else 0)
            rows += n
        if dp is not None:
            # FedavgJobParams.weighted_delta of the opened sum
            total = np.asarray(-params.learning_rate * noisy / dp.scale, dtype=np.float64)
        new = server_update(net, total, rows)
        record = RoundRecord(t, members, net.flat.copy(), pseudo, new.flat.copy(), trained - started,
                             time.perf_counter() - trained)
        run.rounds.append(record)
        net = new
        if on_round is not None:
            on_round(record, net)
    run.model = net
    return run


def _pseudo_labels(net: Network, data: Mapping[str, tuple[np.ndarray, np.ndarray]], params: FedavgJobParams,
                   kind: str, seed: bytes, xclp: str, executor: Executor | None) -> dict[str, PseudoLabels | None]:
    if kind != "xclp":
        return {pid: local_pseudo_labels(kind, net, X, y, params.n_classes, params.graph_params,
                                         params.pseudo_label_space)
                for pid, (X, y) in data.items()}
    embedded = {pid: (params.neighbour_space(net, X), y) for pid, (X, y) in data.items()}
    if xclp == "secure":
        result = run_xclp_inprocess(embedded, params.n_classes, seed=seed, L=params.lsh_bits,
                                    key_bits=params.key_bits, params=params.graph_params, executor=executor,
                                    insecure_test_keys=params.insecure_test_keys)
        return {pid: PseudoLabels(out.labels[y == UNLABELED], out.confidence[y == UNLABELED])
                for pid, out in result.outputs.items() for y in [data[pid][1]]}
    order = sorted(embedded)
    ref = xclp_reference([embedded[p] for p in order], seed, params.n_classes, params.lsh_bits, params.graph_params)
    out: dict[str, PseudoLabels | None] = {}
    for j, pid in enumerate(order):
        rows = ref.party_rows(j)
        unlabeled = data[pid][1] == UNLABELED
        out[pid] = PseudoLabels(ref.labels[rows][unlabeled], ref.confidence[rows][unlabeled])
    return out
