"""Double-blind collaborative learning (docs/design.md §7, Zhang & Wang 2021 §4.2) with every party in one process.

`run_dbcl` runs the rounds of a `type = "dbcl"` job as the service does — the same public sample
of parties, the same W₀, each party's batches from the same generator, the same sketches from
the same round seeds, the same coordinator optimiser — without the masking: the gradient sum is
formed in float64 (the service sums fixed point, so the two agree within 2^-frac_bits per party
and parameter). With dp_epsilon it runs the parties' DP release as they do (clipped, rounded,
with their noise: not comparable run to run, since the noise is fresh). It is the oracle of the
service's parity test and what benchmarks/dbcl.py measures.

The service draws each round's seed at random; give `round_seeds` (e.g. the seeds a party of a
secure run recorded) to replay those rounds, or let the simulation derive them from `seed`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from xclp.dbcl import RoundView, client_gradient, draw_sketches, private_client_gradient, server_step
from xclp.errors import InvalidInput
from xclp.fedavg import initial_network, local_rng, sample_parties
from xclp.nn import Network
from xclp.privacy.dpsgd import RoundNoise
from xclp.v1.dbcl import DbclJobParams


@dataclass(frozen=True)
class DbclRound:
    """One round: who took part, its seed, what was released, the rows trained on, W after it."""

    round: int
    participants: tuple[str, ...]
    seed: bytes
    released: np.ndarray
    rows: int
    model_out: np.ndarray
    seconds: float


@dataclass
class DbclRun:
    model: Network
    rounds: list[DbclRound] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


def simulated_round_seed(seed: bytes, round: int) -> bytes:
    """A round seed for simulations (the service draws fresh random ones)."""
    return hashlib.sha256(b"xclp/simulation/dbcl-round/" + seed + round.to_bytes(8, "big")).digest()


def run_dbcl(
    parties: Mapping[str, tuple[np.ndarray, np.ndarray]],
    params: DbclJobParams,
    *,
    seed: bytes,
    round_seeds: Sequence[bytes] | None = None,
    on_round: Callable[[DbclRound, Network], None] | None = None,
) -> DbclRun:
    """Train over parties = {id: (X float[n_j, d] prepared, y int[n_j], −1 = unlabeled)}.

    seed: the job's common seed (the service's `JobResult.seed`), which keys each party's batches.
    """
    if not parties:
        raise InvalidInput("no parties")
    dims = {np.asarray(X).shape[1] for X, _ in parties.values()}
    if len(dims) != 1:
        raise InvalidInput(f"the parties' data have different numbers of columns: {sorted(dims)}")
    if round_seeds is not None and len(round_seeds) < params.rounds:
        raise InvalidInput(f"{len(round_seeds)} round seeds for {params.rounds} rounds")
    data = {pid: (np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64)) for pid, (X, y) in parties.items()}
    dim = dims.pop()
    net = initial_network(params.architecture(dim), params.seed)
    sizes = params.sizes(dim)
    optimiser = params.server_optimiser()
    run = DbclRun(net)
    for t in range(params.rounds):
        started = time.perf_counter()
        members = sample_parties(params.seed, t, list(data), params.fraction)
        round_seed = round_seeds[t] if round_seeds is not None else simulated_round_seed(seed, t)
        sketches = draw_sketches(net.arch, params.layers, params.sketch, sizes, round_seed)
        view = RoundView.release(net, sketches)
        dp = params.dp_plan(view.size)
        total = np.zeros(view.size)
        noisy = np.zeros(view.size, dtype=np.int64)
        rows = 0
        for pid in members:
            X, y = data[pid]
            if dp is None:
                g, b = client_gradient(view, X, y, params.batch_size, params.local_steps, params.learning_rate,
                                       local_rng(seed, pid, t))
                total += g
            else:
                q, b = private_client_gradient(view, X, y, params.batch_size, params.local_steps,
                                               params.learning_rate, dp, local_rng(seed, pid, t))
                noisy += q + (RoundNoise(dp, view.size).for_members(len(members)) if dp.distributed else 0)
            rows += b
        if dp is not None:
            total = noisy / dp.scale  # what the coordinator opens (xclp.v1.training.PrivateTraining.decode_sum)
        if rows == 0:
            run.skipped.append(t)
            continue
        net = server_step(net, sketches, total, rows, optimiser)
        record = DbclRound(t, members, round_seed, view.flat(), rows, net.flat.copy(), time.perf_counter() - started)
        run.rounds.append(record)
        if on_round is not None:
            on_round(record, net)
    run.model = net
    return run
