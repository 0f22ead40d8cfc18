"""The party does not trust what the coordinator sends in an XCLP job (docs/design.md §2, §5).

Each malformed coordinator message — a row layout of the wrong type or that changes a row count,
a pair table that repeats a pair or names a stranger, an influence block of the wrong shape or
with NaNs, a result for a round never sent or of the wrong type — is refused with a
ProtocolError that says what was wrong, before the party acts on it.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp

from xclp.client.context import PartyContext
from xclp.client.jobs.xclp import XclpParty
from xclp.client.jobs.xclp_state import Laid
from xclp.crypto.identity import KeyBundle, Roster
from xclp.crypto.masking import PairwiseMasker
from xclp.crypto.paillier import PaillierKeypair
from xclp.data.party_table import PartyData
from xclp.errors import ProtocolError, ReplayRefused
from xclp.sparse_influence import SparseColumns
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.influence import pack_pieces
from xclp.v1.wire import Message
from xclp.v1.xclp import XclpJobParams

IDS = ("a", "b", "c")
ROWS = {"a": 3, "b": 2, "c": 4}


class Sink:
    def __init__(self) -> None:
        self.pushed: list[tuple[str, int]] = []

    def push(self, payload, *, sender: str, step: str, round: int, recipient: str = "") -> int:
        self.pushed.append((step, round))
        return 0

    def push_all(self, messages, *, sender: str) -> int:
        return sum(self.push(m.payload, sender=sender, step=m.step, round=m.round, recipient=m.recipient)
                   for m in messages)


PARAMS = XclpJobParams(n_classes=2, lsh_bits=64, key_bits=512, insecure_test_keys=True, pair_budget=1.0,
                       influence_tolerance=0.0)
DATA = PartyData(np.eye(3), np.array([0, -1, 1]), ("r0", "r1", "r2"))


@pytest.fixture(scope="module")
def keypair() -> PaillierKeypair:
    return PaillierKeypair.generate(512, allow_insecure_test_size=True)


def context(keypair: PaillierKeypair, params: XclpJobParams = PARAMS, data: PartyData = DATA,
            sink: Sink | None = None, b_secret: bytes = bytes(32)) -> PartyContext:
    """Party a's context in a job of a, b, c (what the session makes once the seed is agreed)."""
    bundles = tuple(KeyBundle(p, "j", secrets.token_bytes(32), secrets.token_bytes(32), bytes(16), rows=ROWS[p])
                    for p in IDS)
    masker = PairwiseMasker("a", {"b": b_secret, "c": bytes(32)}, b"session")
    return PartyContext("a", params, data, Roster(bundles, bytes(32)), bytes(32), masker, sink or Sink(),
                        lambda m: None, keypair=keypair)


@pytest.fixture
def party(keypair: PaillierKeypair) -> XclpParty:
    return XclpParty(context(keypair))


def from_coordinator(party: XclpParty, step: str, payload, round: int = 0) -> None:
    party.on_message(Message("j", step, round, "", "a", payload))


def rows(*counts: int) -> np.ndarray:
    return np.array(counts, dtype=np.uint64)


@pytest.mark.parametrize(("payload", "message"), [
    (np.array([3, 2, 4], dtype=np.int64), r"layout message must be uint64\[3\]"),
    (rows(3, 2), r"layout message must be uint64\[3\]"),
    (b"\x00" * 24, r"layout message must be uint64\[3\]"),
    (rows(5, 2, 4), "gives this party 5 rows, not 3"),
])
def test_party_refuses_a_malformed_layout(party: XclpParty, payload, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        from_coordinator(party, "layout", payload)


def test_party_refuses_a_layout_other_than_the_row_counts_its_peers_signed(party: XclpParty) -> None:
    """Attack (docs/design.md §2.5): a is told b has 3 rows, while b signed 2 and hears 2; the row a
    places after b's would belong to nobody in a's view, and a would mask it."""
    with pytest.raises(ProtocolError, match="gives 'b' 3 rows, but 'b' signed 2 in its key bundle"):
        from_coordinator(party, "layout", rows(3, 3, 4))


def test_party_takes_the_graph_and_influence_only_after_its_secure_hamming_pairs(party: XclpParty) -> None:
    """Attack: the coordinator skips SecureHamming (it made up H) and sends the graph and an
    influence block of its choosing; the party never noticed."""
    from_coordinator(party, "layout", rows(3, 2, 4))
    with pytest.raises(ProtocolError, match="graph layout before this party's SecureHamming pairs were done"):
        from_coordinator(party, "graph", rows(3, 2, 4))
    # (a party holding a graph layout without its SecureHamming done is a state its stages cannot hold)
    with pytest.raises(ProtocolError, match="influence block before the graph layout, which comes once this "
                                            "party's SecureHamming pairs are done"):
        from_coordinator(party, "influence", np.full((9, 2), 0.1))


def test_party_refuses_a_graph_that_changes_a_row_count(party: XclpParty) -> None:
    from_coordinator(party, "layout", rows(3, 2, 4))
    assert party.sizes == ROWS
    party.hamming.done = True  # (its SecureHamming pairs done)
    with pytest.raises(ProtocolError, match="gives 'c' 5 rows, but 'c' signed 4"):
        from_coordinator(party, "graph", rows(3, 2, 5))
    from_coordinator(party, "graph", rows(3, 0, 4))  # b left after the layout: allowed
    assert party.graph == (("a", 3), ("c", 4))


@pytest.mark.parametrize(("table", "message"), [
    (np.array([[0, 1, 2, 3]], dtype=np.uint64), r"must be uint64\[m, 2\] or \[m, 3\]"),
    (np.array([[0, 1]], dtype=np.int64), r"must be uint64\[m, 2\]"),
    (np.array([[0, 1, 0]], dtype=np.uint64), "cuts a pair into pieces of other than 1 to 32768 ciphertexts"),
    (np.array([[0, 1, 40_000]], dtype=np.uint64), "cuts a pair into pieces of other than 1 to 32768 ciphertexts"),
    (np.array([[0, 3, 5]], dtype=np.uint64), "outside the roster"),
    (np.array([[0, 3]], dtype=np.uint64), "outside the roster"),
    (np.array([[0, 1], [1, 0]], dtype=np.uint64), "repeats a pair"),
    (np.array([[2, 2]], dtype=np.uint64), "pairs a party with itself"),
])
def test_party_refuses_a_malformed_pair_table(party: XclpParty, table: np.ndarray, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        from_coordinator(party, "pairs", table)


def test_party_refuses_a_pair_with_a_party_the_layout_gives_no_rows(party: XclpParty) -> None:
    """B has no rows in the layout, and the pairs message pairs a with b (it crashed the
    party with a KeyError)."""
    from_coordinator(party, "layout", rows(3, 0, 4))
    from_coordinator(party, "pairs", np.array([[0, 1], [0, 2]], dtype=np.uint64))
    party.hamming.codes = np.zeros((3, 1), dtype=np.uint64)
    with pytest.raises(ProtocolError, match="pairs this party with b, to which the layout gives no rows"):
        party.on_step(pb.StepStart(step="secure_hamming", round=0, participants=list(IDS)))


def test_party_refuses_a_malformed_influence_block(party: XclpParty) -> None:
    with pytest.raises(ProtocolError, match="before the graph layout"):
        from_coordinator(party, "influence", np.zeros((9, 2)))
    from_coordinator(party, "layout", rows(3, 2, 4))
    party.hamming.done = True  # (its SecureHamming pairs done)
    from_coordinator(party, "graph", rows(3, 2, 4))
    with pytest.raises(ProtocolError, match=r"influence piece must be float64\[9, \.\.\.\]"):
        from_coordinator(party, "influence", np.zeros((8, 2)))
    with pytest.raises(ProtocolError, match=r"influence piece must be float64\[9, \.\.\.\]"):
        from_coordinator(party, "influence", np.zeros((9, 2), dtype=np.uint64))
    with pytest.raises(ProtocolError, match=r"malformed influence block: influence pieces for 3 columns, but this "
                                            r"party has 2"):
        from_coordinator(party, "influence", np.zeros((9, 3)))  # a has 2 labeled rows
    bad = np.zeros((9, 2))
    bad[4, 1] = np.nan
    with pytest.raises(ProtocolError, match="malformed influence block"):
        from_coordinator(party, "influence", bad)
    for value in (-0.01, 1 / (1 - PARAMS.alpha) + 0.01):  # S is non-negative and at most 1/(1 − α)
        with pytest.raises(ProtocolError, match="values outside"):
            from_coordinator(party, "influence", np.full((9, 2), value))
    from_coordinator(party, "influence", np.full((9, 1), 0.1))  # in pieces (docs/design.md §10.2): Z̄ once all are in
    assert party.zbar is None
    from_coordinator(party, "influence", np.full((9, 1), 0.2))
    assert party.zbar is not None and party.zbar.shape == (9, 2)
    labels = party.y[party.y >= 0]
    np.testing.assert_allclose(party.zbar, np.hstack([np.full((9, 1), 0.1), np.full((9, 1), 0.2)]) @ np.eye(2)[labels])
    with pytest.raises(ProtocolError, match="more influence columns than this party has"):
        from_coordinator(party, "influence", np.full((9, 1), 0.1))


def sparse_party(keypair: PaillierKeypair, tolerance: float = 1e-4) -> XclpParty:
    party = XclpParty(context(keypair, replace(PARAMS, influence_tolerance=tolerance)))
    from_coordinator(party, "layout", rows(3, 2, 4))
    party.hamming.done = True  # (its SecureHamming pairs done)
    from_coordinator(party, "graph", rows(3, 2, 4))
    return party


def sparse(dense: np.ndarray, dropped: float = 0.25) -> SparseColumns:
    S = sp.csc_matrix(dense)
    return SparseColumns(n=dense.shape[0], indptr=S.indptr.astype(np.int64), indices=S.indices.astype(np.int64),
                         values=S.data, dropped=np.full(dense.shape[1], dropped))


def test_sparse_influence_pieces_fold_into_the_zbar_of_the_same_dense_columns(keypair: PaillierKeypair) -> None:
    """docs/design.md §10.7: with influence_tolerance the columns come pushed and sparse; Z̄ is the one
    the same columns would give dense, and the party reports what the push left out."""
    columns = np.zeros((9, 2))
    columns[[0, 4, 8], 0] = (0.5, 0.25, 0.125)
    columns[[1, 2], 1] = (2.0, 0.75)
    party = sparse_party(keypair)
    for j in range(2):  # one column per piece
        (piece,) = pack_pieces(sparse(columns[:, j : j + 1], dropped=0.25 * (j + 1)))
        from_coordinator(party, "influence", piece)
    labels = party.y[party.y >= 0]
    assert isinstance(party.zbar, np.ndarray)
    np.testing.assert_array_equal(party.zbar, columns @ np.eye(2)[labels])
    assert party.approximation == {"influence_tolerance": 1e-4, "columns": 2, "dropped_max": 0.5,
                                   "dropped_mean": 0.375}


@pytest.mark.parametrize("label_dp", [None, "response"])
def test_once_zbar_is_whole_the_columns_it_was_folded_from_are_unreachable(keypair: PaillierKeypair,
                                                                           label_dp: str | None) -> None:
    """STYLE 15: the party's state is one staged value (client/jobs/xclp_state.py), each stage holding
    only what is valid there. Once the last influence column is in, the stage is Whole: Z̄ as it is
    released, nothing of the running sums it was folded from (with randomised response, the exact
    labels' Z̄ beside the released labels' one). Before, `influence` and `released` stayed on the
    party for the rest of the run, beside the Z̄ they had made."""
    from tests.client.test_phases import reachable
    from xclp.client.steps.influence import InfluenceScores

    params = PARAMS if label_dp is None else replace(PARAMS, label_dp_epsilon=1.0, label_dp_mechanism=label_dp)
    party = XclpParty(context(keypair, params))
    from_coordinator(party, "layout", rows(3, 2, 4))
    party.hamming.done = True  # (its SecureHamming pairs done)
    from_coordinator(party, "graph", rows(3, 2, 4))
    skip = frozenset({"ctx", "roster", "progress"})

    def folding() -> list[object]:
        return [o for o in reachable(party, skip) if isinstance(o, InfluenceScores)]

    assert len(folding()) == (1 if label_dp is None else 2)
    from_coordinator(party, "influence", np.full((9, 2), 0.1))
    assert party.zbar is not None and party.zbar.shape == (9, 2)
    assert folding() == []


def test_party_refuses_a_malformed_sparse_influence_piece(keypair: PaillierKeypair) -> None:
    """Attack: the coordinator sends dense columns where the job says sparse, rows beyond the graph,
    values no influence matrix has, or more columns than the party has; each is refused."""
    party = sparse_party(keypair)
    with pytest.raises(ProtocolError, match="malformed influence piece: a sparse influence piece must be"):
        from_coordinator(party, "influence", np.full((9, 2), 0.1))
    (beyond,) = pack_pieces(sparse(np.full((9, 1), 0.1)))
    beyond[1 + 2 + 8] = 9  # the last row of the column: 9 is past the graph's 9 rows
    with pytest.raises(ProtocolError, match="rows beyond the graph's 9"):
        from_coordinator(party, "influence", beyond)
    for value in (-0.01, 1 / (1 - PARAMS.alpha) + 0.01):
        (bad,) = pack_pieces(sparse(np.full((9, 1), value)))
        with pytest.raises(ProtocolError, match="values outside"):
            from_coordinator(party, "influence", bad)
    (three,) = pack_pieces(sparse(np.full((9, 3), 0.1)))
    with pytest.raises(ProtocolError, match="influence pieces for 3 columns, but this party has 2"):
        from_coordinator(party, "influence", three)
    assert party.zbar is None and party.influence is not None and party.influence.received == 0


def test_an_exact_job_refuses_sparse_pieces(party: XclpParty) -> None:
    from_coordinator(party, "layout", rows(3, 2, 4))
    party.hamming.done = True
    from_coordinator(party, "graph", rows(3, 2, 4))
    (piece,) = pack_pieces(sparse(np.full((9, 2), 0.1)))
    with pytest.raises(ProtocolError, match=r"influence piece must be float64\[9, \.\.\.\]"):
        from_coordinator(party, "influence", piece)


def test_party_refuses_a_result_for_a_round_it_never_sent_or_of_the_wrong_type(party: XclpParty) -> None:
    from_coordinator(party, "layout", rows(3, 2, 4))
    party.hamming.done = True  # (its SecureHamming pairs done)
    from_coordinator(party, "graph", rows(3, 2, 4))
    from_coordinator(party, "influence", np.full((9, 2), 0.1))
    with pytest.raises(ProtocolError, match="attempt 0, which this party never sent"):
        from_coordinator(party, "rowsums_result", np.zeros((3, 2), np.uint64))
    party.on_step(pb.StepStart(step="rowsums", round=0, participants=list(IDS)))
    # Z comes back for a's one unlabeled row only (docs/design.md §5.5), never for all its rows
    with pytest.raises(ProtocolError, match=r"must be uint64\[1, 2\]"):
        from_coordinator(party, "rowsums_result", np.zeros((3, 2), np.uint64))
    with pytest.raises(ProtocolError, match=r"must be uint64\[1, 2\]"):
        from_coordinator(party, "rowsums_result", np.zeros((1, 2), np.int64))
    with pytest.raises(ProtocolError, match="must be an array"):
        from_coordinator(party, "rowsums_result", b"\x00" * 16)
    assert party.result is None
    from_coordinator(party, "rowsums_result", np.zeros((1, 2), np.uint64))
    assert party.result is not None and party.result[[0, 2]].tolist() == [[1.0, 0.0], [0.0, 1.0]]  # own labels


def test_party_refuses_a_repeated_rowsums_attempt(party: XclpParty) -> None:
    """Attack (mask reuse): the same SecureRowSums attempt twice would let the coordinator difference
    two arrays under the same pairwise masks; the masker refuses the second (docs/design.md §4.2)."""
    from_coordinator(party, "layout", rows(3, 2, 4))
    party.hamming.done = True  # (its SecureHamming pairs done)
    from_coordinator(party, "graph", rows(3, 2, 4))
    from_coordinator(party, "influence", np.full((9, 2), 0.1))
    party.on_step(pb.StepStart(step="rowsums", round=0, participants=list(IDS)))
    with pytest.raises(ReplayRefused):
        party.on_step(pb.StepStart(step="rowsums", round=0, participants=list(IDS)))
    party.on_step(pb.StepStart(step="rowsums", round=1, participants=["a", "b"]))  # a restart: fresh masks


def test_party_refuses_to_send_its_labeled_rows_when_the_job_hides_them(keypair: PaillierKeypair) -> None:
    """Attack (any schedule accepted): a labeled_sets step in a job that hides the label mask."""
    from dataclasses import replace

    sink = Sink()
    hidden = XclpParty(context(keypair, replace(PARAMS, hide_label_mask=True), sink=sink))
    with pytest.raises(ProtocolError, match="labeled rows of a job that hides the label mask"):
        hidden.on_step(pb.StepStart(step="labeled_sets", round=0, participants=list(IDS)))
    assert sink.pushed == []
    shown = XclpParty(context(keypair, sink=sink))
    shown.on_step(pb.StepStart(step="labeled_sets", round=0, participants=list(IDS)))
    assert sink.pushed == [("labeled_sets", 0)]


def test_party_refuses_unknown_messages_and_peer_messages_outside_secure_hamming(party: XclpParty) -> None:
    with pytest.raises(ProtocolError, match="unknown 'gossip' message"):
        from_coordinator(party, "gossip", b"")
    with pytest.raises(ProtocolError, match="'b' sent a 'influence' message, which peers never send"):
        party.on_message(Message("j", "influence", 0, "b", "a", np.zeros((9, 2))))


def test_party_a_refuses_to_decrypt_what_the_coordinator_passes_off_as_bs_evaluation(keypair: PaillierKeypair) -> None:
    """Attack (decryption oracle): the coordinator relays A's own bit-slice ciphertexts back to A,
    repackaged as B's evaluation; A would decrypt them and its t would hand the coordinator A's code
    bits. Relays are sealed end to end (docs/design.md §2.2): what the coordinator makes does not open."""
    from xclp.client.steps import xclp as steps
    from xclp.crypto.secure_hamming import EncryptedSlices, EvaluatedDistances
    from xclp.v1.xclp_layout import PairTask

    data = PartyData(np.random.default_rng(0).normal(size=(3, 4)), np.array([0, -1, 1]), ("r0", "r1", "r2"))
    sink = Sink()
    a = XclpParty(context(keypair, data=data, sink=sink, b_secret=bytes(range(32))))
    a.stage, a.hamming.pairs = Laid(dict(ROWS)), (PairTask("a", "b"), PairTask("c", "a"))
    a.hamming.codes = steps.lsh_step(data.X, bytes(32), 64)
    a.hamming.start(0, IDS)
    assert ("secure_hamming", 0) in sink.pushed and a.hamming.slices is not None
    slices = EncryptedSlices.from_bytes(a.hamming.slices)
    width = 2 * slices.layout.value_bytes
    forged = EvaluatedDistances(slices.layout, 3, 2, slices.ciphertexts[: 2 * width]).to_bytes()
    with pytest.raises(ProtocolError, match="said to come from 'b' does not open"):
        a.on_message(Message("j", "secure_hamming", 0, "b", "a", forged))
    assert a.hamming.as_a["b"].received == 0  # nothing was decrypted


@pytest.mark.parametrize("hide", [False, True], ids=["labeled-columns", "hidden-mask"])
@pytest.mark.parametrize("normalise", [False, True], ids=["one-hot", "class-normalised"])
def test_influence_in_pieces_gives_the_scores_of_the_whole_block(hide: bool, normalise: bool) -> None:
    """docs/design.md §10.2: Z̄ accumulated piece by piece equals select_influence + local_scores on the whole S_L."""
    from xclp.client.steps import xclp as steps

    rng = np.random.default_rng(4)
    y = np.where(rng.random(12) < 0.5, rng.integers(0, 3, 12), -1)
    S = rng.random((20, 12 if hide else int((y >= 0).sum())))
    whole = steps.local_scores(steps.select_influence(S, y, 3, hide_label_mask=hide), y, 3, normalise_labels=normalise)
    acc = steps.InfluenceScores(y, 3, 20, hide_label_mask=hide, normalise_labels=normalise)
    for cut in np.array_split(np.arange(S.shape[1]), 3):
        assert not acc.complete
        acc.add(S[:, cut])
    assert acc.complete
    np.testing.assert_allclose(acc.zbar, whole, rtol=0, atol=1e-12)
