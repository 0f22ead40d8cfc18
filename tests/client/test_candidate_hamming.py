"""SecureHamming of one pair on a candidate schedule (docs/design.md §10.3, xclp.candidates), the three
roles' steps with real Paillier (512-bit test key, L = 64): A encrypts its slots (its centre lists,
padded, in full batches), B evaluates each batch against its padded lists of the batch's centres,
A decrypts, and the coordinator unmasks each batch with B's seeded masks and folds what
`candidates.folded` keeps. The graph it folds is the plaintext reference's on the same schedule."""

from __future__ import annotations

import numpy as np
import pytest

import xclp.v1.secure_hamming_wire as shw
from xclp import candidates as cd
from xclp.client.steps import xclp as party
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout, draw_mask_seed
from xclp.graph import GraphParams, knn_adjacency
from xclp.hamming import hamming_matrix
from xclp.neighbours import own_top_k
from xclp.server.steps import xclp as coordinator
from xclp.v1.xclp_layout import RowLayout

L, C, P = 64, 5, 2
SIZES = {"a": 150, "b": 90}


@pytest.mark.parametrize("piece_values", [3, 40, 400])  # slices of a batch, whole batches, several batches a piece
def test_a_candidate_pair_folds_the_reference_graph_on_its_schedule(monkeypatch, piece_values: int) -> None:
    keypair = PaillierKeypair.generate(512, allow_insecure_test_size=True)
    layout = SlotLayout(512, L)
    monkeypatch.setattr(shw, "PIECE_BYTES", piece_values * layout.ciphertext_bytes)
    rng = np.random.default_rng(piece_values)
    codes = {q: rng.integers(0, 2**20, size=(n, 1), dtype=np.uint64) for q, n in SIZES.items()}  # ties are common
    probes = {q: np.argsort(rng.random((n, C)), axis=1)[:, :P] for q, n in SIZES.items()}
    pooled = np.sum([cd.probe_table(probes[q], C)[P - 1] for q in SIZES], axis=0)
    budgets = {q: cd.row_budgets(pooled, n, sum(SIZES.values()), 1.0) for q, n in SIZES.items()}
    lists = {q: cd.centre_lists(probes[q], P, budgets[q]) for q in SIZES}
    members = {q: cd.membership(lists[q], SIZES[q], P) for q in SIZES}
    schedule = cd.PairSchedule.of(budgets["a"], budgets["b"], layout.slots)
    assert schedule.batches > 1 and len(set(schedule.counts().tolist())) > 1  # uneven batches

    # A: its slots' codes, encrypted; B: parses them against the schedule's public slot count
    slots = cd.a_slots(schedule, lists["a"])
    occupied = int(np.count_nonzero(schedule.slot_centre != cd.DUMMY))
    sealed = party.hamming_encrypt(keypair, party.slot_codes(codes["a"], slots.ravel()[:occupied]), L)
    slices = party.received_slices(keypair.public, sealed, L, occupied)
    seed = draw_mask_seed()

    own = {q: own_top_k(codes[q], L, GraphParams(k=4)) for q in SIZES}
    graph = coordinator.NeighbourGraph(RowLayout(tuple(SIZES), tuple(SIZES.values())),
                                       {q: (c.astype(np.int64), d) for q, (c, d) in own.items()}, L, GraphParams(k=4))
    folded: list[tuple[int, int, int]] = []
    for piece in shw.pieces(layout, schedule.counts().tolist()):
        evaluated = party.evaluate_scheduled(keypair.public, slices, codes["b"], schedule, lists["b"], piece, seed)
        t = party.decrypt_piece(keypair, evaluated, piece.values)
        for g, entries, H in coordinator.scheduled_piece(t, seed, int(keypair.public.n), piece, schedule, L):
            every = cd.b_rows(schedule, lists["b"], g)
            keep = cd.folded(schedule, g, slots[g], every, members["a"], members["b"])[entries.start : entries.stop]
            rows, batch = every[entries.start : entries.stop], slots[g][: H.shape[1]]
            graph.fold_scheduled("a", "b", batch, rows, H, keep[:, : H.shape[1]])
            x, s = np.nonzero(keep[:, : H.shape[1]])
            folded += list(zip(batch[s].tolist(), rows[x].tolist(), H[x, s].tolist()))
    graph.pair_done("a", "b")

    plain = hamming_matrix(np.vstack([codes["a"], codes["b"]]))
    mask = cd.candidate_mask(lists, SIZES)
    expected = {(int(i), int(j), int(plain[i, 150 + j])) for i, j in zip(*np.nonzero(mask[:150, 150:]))}
    assert len(folded) == len(set(folded)) and set(folded) == expected  # each candidate pair once, its distance
    reference = knn_adjacency(plain, L, GraphParams(k=4), mask)
    assert (graph.adjacency() != reference).nnz == 0
