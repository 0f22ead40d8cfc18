"""The streamed SecureHamming between two real parties (docs/design.md §10.1, xclp.v1.secure_hamming_wire).

The test plays the coordinator: it carries the sealed relays between party a (A of the pair) and
party b (B), takes their uploads, and unmasks each piece as the coordinator does
(`server.steps.xclp.cross_piece`, B's masks regenerated from its seed). The pieces put together
must be the plaintext Hamming block exactly; a coordinator that drops, replays or reorders a piece
or an acknowledgement is caught by the party that expected another index; B never runs more than
its window ahead of A.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest

import xclp.v1.secure_hamming_wire as shw
from xclp.client.context import PartyContext
from xclp.client.jobs.xclp import XclpParty
from xclp.client.jobs.xclp_state import Laid
from xclp.client.steps import xclp as steps
from xclp.crypto.identity import KeyBundle, Roster
from xclp.crypto.masking import PairwiseMasker
from xclp.crypto.paillier import PaillierKeypair
from xclp.data.party_table import PartyData
from xclp.errors import ProtocolError
from xclp.hamming import hamming_matrix
from xclp.server.steps.xclp import cross_piece
from xclp.v1.bundles import paillier_fields
from xclp.v1.secure_hamming_wire import HammingUpload, Upload, all_pairs, open_relay
from xclp.v1.wire import Message
from xclp.v1.xclp import PAIRS_FROM_MSG, XclpJobParams
from xclp.v1.xclp_layout import PairTask

L = 64
PARAMS = XclpJobParams(n_classes=2, lsh_bits=L, key_bits=512, insecure_test_keys=True, pair_budget=1.0,
                       influence_tolerance=0.0)
ROWS = {"a": 160, "b": 5}  # K = 72 slots at L = 64 and |N| = 512: A's 160 rows are 3 batches


class Wire:
    """What both parties push, in order: (sender, payload, round, recipient)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object, int, str]] = []

    def push(self, payload, *, sender: str, step: str, round: int, recipient: str = "") -> int:
        self.sent.append((sender, payload, round, recipient))
        return 0

    def take(self) -> list[tuple[str, object, int, str]]:
        out, self.sent = self.sent, []
        return out


@pytest.fixture(scope="module")
def keys() -> dict[str, PaillierKeypair]:
    return {p: PaillierKeypair.generate(512, allow_insecure_test_size=True) for p in ("a", "b", "c")}


def build(keys, rows: dict[str, int], pairs: tuple[PairTask, ...]) -> tuple[dict[str, XclpParty], Wire]:
    """Parties with LSH codes, the given pairs, and the wire between them."""
    rng = np.random.default_rng(7)
    bundles = tuple(KeyBundle(p, "j", secrets.token_bytes(32), secrets.token_bytes(32), bytes(16), rows=n,
                              **paillier_fields(keys[p].public)) for p, n in rows.items())
    roster, link = Roster(bundles, bytes(32)), Wire()
    secret = {frozenset((p, q)): secrets.token_bytes(32) for p in rows for q in rows if p < q}
    parties = {}
    for p, n in rows.items():
        data = PartyData(rng.normal(size=(n, 4)), np.zeros(n, dtype=np.int64), tuple(f"r{i}" for i in range(n)))
        masker = PairwiseMasker(p, {q: secret[frozenset((p, q))] for q in rows if q != p}, b"session")
        ctx = PartyContext(p, PARAMS, data, roster, bytes(32), masker, link, lambda m: None, keypair=keys[p])
        party = XclpParty(ctx)
        party.stage, party.hamming.pairs = Laid(dict(rows)), pairs
        party.hamming.codes = steps.lsh_step(data.X, bytes(32), L)
        parties[p] = party
    return parties, link


@pytest.fixture
def pair(keys, monkeypatch, request):
    """Parties a and b with LSH codes and pairs [(a, b)], and the wire between them. Pieces of one
    batch × B's 5 rows (5 ciphertexts of 128 bytes), or with param "slices" of one batch × 1-2 rows."""
    monkeypatch.setattr(shw, "PIECE_BYTES", 2 * 128 if getattr(request, "param", "") == "slices" else 5 * 128)
    return build(keys, ROWS, (PairTask("a", "b"),))


def deliver(parties, sender: str, payload, round: int, recipient: str) -> None:
    parties[recipient].on_message(Message("j", "secure_hamming", round, sender, recipient, payload))


def run_honestly(parties, link: Wire) -> dict[str, list[HammingUpload]]:
    """Carry every relay until nothing moves; the uploads by sender."""
    uploads: dict[str, list[HammingUpload]] = {p: [] for p in parties}
    for p in sorted(parties, reverse=True):
        parties[p].hamming.start(0, tuple(sorted(parties)))
    while (batch := link.take()):
        for sender, payload, round, recipient in batch:
            if recipient:
                deliver(parties, sender, payload, round, recipient)
            else:
                uploads[sender].append(HammingUpload.from_array(payload))
    return uploads


def unmasked(uploads: list[HammingUpload], seed: HammingUpload, keys, layout, parts) -> np.ndarray:
    """H[b rows, a rows] as the coordinator unmasks A's uploaded t of each piece with B's seed."""
    H = np.full((ROWS["b"], ROWS["a"]), -1, dtype=np.int64)
    for upload, piece in zip(uploads, parts):
        block = cross_piece(upload.data, seed.data, int(keys["a"].public.n), piece, ROWS["a"], ROWS["b"], L)
        rows = piece.b_rows(ROWS["b"])
        H[rows.start : rows.stop, piece.a_rows(layout, ROWS["a"])] = block
    return H


def test_a_pair_cut_finely_by_the_pairs_message_gives_the_same_distances(keys) -> None:
    """FINE_PIECES: the pairs message's third column cuts each pair into pieces of that many
    ciphertexts (here 2: each batch of B's 5 rows in 3 slices, 9 pieces where PIECE_BYTES makes 1);
    both sides cut alike, and the unmasked pieces are the plaintext distances exactly."""
    parties, link = build(keys, ROWS, (PairTask("a", "b", piece_values=2),))
    uploads = run_honestly(parties, link)
    layout = steps.slot_layout(keys["a"].public, L)
    parts = all_pairs(layout, ROWS["a"], ROWS["b"], 2)
    assert len(parts) == 9 and len(all_pairs(layout, ROWS["a"], ROWS["b"])) == 1
    [seed] = uploads["b"]
    assert [u.piece for u in uploads["a"]] == list(range(9))
    np.testing.assert_array_equal(unmasked(uploads["a"], seed, keys, layout, parts),
                                  hamming_matrix(parties["b"].hamming.codes, parties["a"].hamming.codes))
    assert shw.fine_piece_values(layout, 3 * 5) == shw.MIN_FINE_VALUES  # a small pair: pieces of at least 64 ...
    assert shw.fine_piece_values(layout, 10**5) == -(-10**5 // shw.PIECES_PER_PAIR)  # ... a larger one in 16 ...
    assert shw.fine_piece_values(layout, 10**9) == shw.piece_values(layout)  # ... within PIECE_BYTES a piece


@pytest.mark.parametrize("pair", ["batches", "slices"], indirect=True)
def test_b_evaluates_one_piece_at_a_time_with_every_worker_on_it(pair, keys, monkeypatch) -> None:
    """A fault costs a piece, not a pair (docs/operating.md, "Long runs"): B evaluates its pieces one
    at a time, every worker on the one piece, so they finish and fold one after another. Before, B
    took as many pieces at once as it had workers, one worker each: with few pieces per pair they
    all finished near the end together, and a crash half-way kept none (0 of 9 at 3 x 2 000 rows)."""
    import xclp.client.phases.secure_hamming as party_side

    parties, link = pair
    monkeypatch.setattr(party_side, "worker_count", lambda executor: 2)
    calls: list[tuple[range, int]] = []
    evaluate = steps.evaluate_piece

    def counted(a_key, slices, codes, batches, first, seed, executor=None, *, split=1):  # type: ignore[no-untyped-def]
        calls.append((batches, split))
        return evaluate(a_key, slices, codes, batches, first, seed, executor, split=split)

    monkeypatch.setattr(steps, "evaluate_piece", counted)
    uploads = run_honestly(parties, link)
    parts = all_pairs(steps.slot_layout(keys["a"].public, L), ROWS["a"], ROWS["b"])
    assert [batches for batches, _ in calls] == [piece.batches for piece in parts]  # one call per piece, in order
    assert all(split == 2 for _, split in calls)  # each with both workers
    assert [u.piece for u in uploads["a"]] == list(range(len(parts)))


@pytest.mark.parametrize("pair", ["batches", "slices"], indirect=True)
def test_pieces_unmasked_with_bs_seed_are_the_plaintext_distances_exactly(pair, keys) -> None:
    parties, link = pair
    uploads = run_honestly(parties, link)
    assert all(p.hamming.done for p in parties.values())
    [seed] = uploads["b"]  # B sends its seed, never its masks
    assert (seed.kind, seed.pair, len(seed.data)) == (Upload.SEED, 0, 32)
    layout = steps.slot_layout(keys["a"].public, L)
    parts = all_pairs(layout, ROWS["a"], ROWS["b"])
    assert len(parts) in (3, 9)  # 3 batches, each whole or in 3 slices of B's rows (1, 2, 2)
    assert [(u.kind, u.piece) for u in uploads["a"]] == [(Upload.T, i) for i in range(len(parts))]
    np.testing.assert_array_equal(unmasked(uploads["a"], seed, keys, layout, parts),
                                  hamming_matrix(parties["b"].hamming.codes, parties["a"].hamming.codes))


def test_b_stays_within_its_window_of_as_acknowledgements(pair) -> None:
    parties, link = pair
    for p in ("b", "a"):
        parties[p].hamming.start(0, ("a", "b"))
    [(_, slices, _, _)] = [m for m in link.take() if m[3] == "b"]
    deliver(parties, "a", slices, 0, "b")
    sent = [m for m in link.take() if m[3] == "a"]
    window = parties["b"].hamming._window()
    assert window == 2 and len(sent) == window  # 3 pieces, 2 ahead of any acknowledgement
    deliver(parties, "b", sent[0][1], 0, "a")  # a decrypts piece 0, acknowledges it
    ack = [m for m in link.take() if m[3] == "b"]
    deliver(parties, "a", ack[0][1], 0, "b")
    assert [open_relay(parties["a"].hamming._open(m[1], 0, "b"))[1] for m in link.take() if m[3] == "a"] == [2]


@pytest.mark.parametrize("attack", ["replay", "skip", "swap"])
def test_a_refuses_a_piece_the_coordinator_replayed_skipped_or_reordered(pair, attack: str) -> None:
    """Attack: the coordinator relays B's pieces out of order (a replayed piece would be decrypted
    twice; a skipped one leaves a gap the coordinator could fill with another attempt's). The index
    is sealed with the piece, so A sees it."""
    parties, link = pair
    for p in ("b", "a"):
        parties[p].hamming.start(0, ("a", "b"))
    deliver(parties, "a", [m for m in link.take() if m[3] == "b"][0][1], 0, "b")
    first, second = [m[1] for m in link.take() if m[3] == "a"]
    order = {"replay": [first, first], "skip": [second], "swap": [second, first]}[attack]
    with pytest.raises(ProtocolError, match="where piece .* was due: dropped, replayed or reordered"):
        for payload in order:
            deliver(parties, "b", payload, 0, "a")


def test_b_refuses_an_acknowledgement_replayed_or_before_the_slices(pair) -> None:
    parties, link = pair
    for p in ("b", "a"):
        parties[p].hamming.start(0, ("a", "b"))
    slices = [m for m in link.take() if m[3] == "b"][0][1]
    deliver(parties, "a", slices, 0, "b")
    piece = [m for m in link.take() if m[3] == "a"][0][1]
    deliver(parties, "b", piece, 0, "a")
    ack = [m for m in link.take() if m[3] == "b"][0][1]
    deliver(parties, "a", ack, 0, "b")
    with pytest.raises(ProtocolError, match="where acknowledgement 1 of 3 sent pieces was due"):
        deliver(parties, "a", ack, 0, "b")
    fresh = XclpParty(parties["b"].ctx)  # a new b: the acknowledgement before any slices
    fresh.stage, fresh.hamming.pairs = Laid(dict(ROWS)), (PairTask("a", "b"),)
    fresh.hamming.codes = parties["b"].hamming.codes
    fresh.hamming.start(0, ("a", "b"))
    with pytest.raises(ProtocolError, match="sent a ACK before its bit slices"):
        fresh.on_message(Message("j", "secure_hamming", 0, "a", "b", ack))


@pytest.mark.parametrize("pair", ["slices"], indirect=True)
def test_each_party_tells_each_pair_and_the_whole_in_lines_when_not_on_a_terminal(pair) -> None:
    parties, link = pair
    lines: dict[str, list[str]] = {"a": [], "b": []}
    for p in parties:
        parties[p].progress = parties[p].hamming.progress = lines[p].append
    run_honestly(parties, link)
    for p, what in (("a", "decrypted"), ("b", "evaluated")):  # 9 pieces: a line per quarter, one at the end
        pair_lines = [line for line in lines[p] if line.startswith("SecureHamming pair a->b:")]
        assert [line.split(" (")[0] for line in pair_lines[:-1]] == [
            f"SecureHamming pair a->b: {k}/9 pieces {what}" for k in (3, 5, 7)]
        assert pair_lines[-1].startswith(f"SecureHamming pair a->b: 9 pieces {what} in ")
        whole = [line for line in lines[p] if line.startswith("SecureHamming, 1 pair:")]
        # a line whenever the count passes a tenth of the 9 pieces (B sends in waves), then the last line
        done = [int(line.split(": ")[1].split("/")[0]) for line in whole[:-1]]
        assert len(done) >= 4 and done == sorted(set(done)) and "about" in whole[0]
        assert whole[-1].startswith("SecureHamming, 1 pair: 9 pieces in")
        assert lines[p][-1].startswith("SecureHamming done (")


@pytest.mark.parametrize("pair", ["slices"], indirect=True)
def test_on_a_terminal_a_bar_for_the_whole_and_one_line_per_pair(pair) -> None:
    import io

    from xclp.progress import CLEAR_LINE, Console

    parties, link = pair
    out = {p: io.StringIO() for p in parties}
    for p in parties:
        parties[p].progress = parties[p].hamming.progress = Console("", out[p], interactive=True, width=300)
    run_honestly(parties, link)
    text = out["b"].getvalue()
    assert CLEAR_LINE + "SecureHamming, 1 pair [" in text  # the bar, drawn in place
    assert text.count("SecureHamming pair a->b") == 1  # the pair's line once it is done, above the bar
    assert text.endswith("SecureHamming done (" + text.rsplit("SecureHamming done (", 1)[1])
    assert CLEAR_LINE + "SecureHamming, 1 pair: 9 pieces in" in text  # the bar gives way to the last line


def test_a_sends_its_slices_to_one_b_at_a_time(keys, monkeypatch) -> None:
    """docs/design.md §10.1: a, A of (a, b) and (a, c), sends its slices to c only once b has answered with
    its first piece, so the coordinator's mailboxes never hold two copies of a's slices. Every
    distance still comes out exact."""
    monkeypatch.setattr(shw, "PIECE_BYTES", 5 * 128)
    rows = {"a": 160, "b": 5, "c": 5}
    parties, link = build(keys, rows, (PairTask("a", "b"), PairTask("a", "c")))
    for p in ("c", "b", "a"):
        parties[p].hamming.start(0, ("a", "b", "c"))
    first = link.take()
    assert [m[3] for m in first if m[0] == "a" and m[3]] == ["b"]  # the slices to b only
    for sender, payload, round, recipient in first:
        if recipient:
            deliver(parties, sender, payload, round, recipient)
    from_b = [m for m in link.take() if m[0] == "b" and m[3] == "a"]
    assert from_b and not [m for m in link.sent if m[0] == "a" and m[3] == "c"]
    deliver(parties, "b", from_b[0][1], 0, "a")  # b's first piece: now c's turn
    opened = [open_relay(parties["c"].hamming._open(m[1], 0, "a"))[0] for m in link.take() if m[3] == "c"]
    assert opened == [shw.Relay.SLICES]


def test_pairs_sharing_an_a_are_exact(keys, monkeypatch) -> None:
    monkeypatch.setattr(shw, "PIECE_BYTES", 5 * 128)
    rows = {"a": 160, "b": 5, "c": 5}
    parties, link = build(keys, rows, (PairTask("a", "b"), PairTask("a", "c")))
    uploads = run_honestly(parties, link)
    assert all(p.hamming.done for p in parties.values())
    layout = steps.slot_layout(keys["a"].public, L)
    t = [u for u in uploads["a"] if u.kind == Upload.T]
    for b, index in (("b", 0), ("c", 1)):
        [seed] = uploads[b]
        H = np.full((5, 160), -1, dtype=np.int64)
        for upload in (u for u in t if u.pair == index):
            piece = all_pairs(layout, 160, 5)[upload.piece]
            H[:, piece.a_rows(layout, 160)] = cross_piece(upload.data, seed.data, int(keys["a"].public.n), piece,
                                                           160, 5, L)
        np.testing.assert_array_equal(H, hamming_matrix(parties[b].hamming.codes, parties["a"].hamming.codes))


def test_a_restart_goes_on_from_the_piece_the_pairs_from_message_names(pair, keys) -> None:
    """Attempt 1 after a pairs-from message starting the pair at piece 1: B evaluates, and A decrypts
    and uploads, only pieces 1.. (under B's fresh seed), each the plaintext distances of its piece."""
    parties, link = pair
    run_honestly(parties, link)
    layout = steps.slot_layout(keys["a"].public, L)
    parts = all_pairs(layout, ROWS["a"], ROWS["b"])
    for p in ("a", "b"):
        parties[p].hamming.on_from(np.array([1], dtype=np.uint64), 1)
    for p in ("b", "a"):
        parties[p].hamming.start(1, ("a", "b"))
    uploads: dict[str, list[HammingUpload]] = {"a": [], "b": []}
    while (batch := link.take()):
        for sender, payload, round, recipient in batch:
            assert round == 1
            if recipient:
                deliver(parties, sender, payload, round, recipient)
            else:
                uploads[sender].append(HammingUpload.from_array(payload))
    [seed] = uploads["b"]
    assert [u.piece for u in uploads["a"]] == list(range(1, len(parts)))
    assert all(p.hamming.done for p in parties.values())
    H = hamming_matrix(parties["b"].hamming.codes, parties["a"].hamming.codes)
    for upload in uploads["a"]:
        piece = parts[upload.piece]
        block = cross_piece(upload.data, seed.data, int(keys["a"].public.n), piece, ROWS["a"], ROWS["b"], L)
        rows = piece.b_rows(ROWS["b"])
        np.testing.assert_array_equal(block, H[rows.start : rows.stop, piece.a_rows(layout, ROWS["a"])])


@pytest.mark.parametrize("message, attempt, error", [
    (np.array([1], dtype=np.uint8), 1, "must be uint64\\[1\\]"),
    (np.array([1, 0], dtype=np.uint64), 1, "must be uint64\\[1\\]"),
    (np.array([1], dtype=np.uint64), 0, "before a restart"),
    (np.array([99], dtype=np.uint64), 1, "starts pair a->b at piece 99 of 3"),
])
def test_a_pairs_from_message_that_does_not_fit_the_pairs_is_refused(pair, message, attempt, error) -> None:
    parties, _ = pair
    with pytest.raises(ProtocolError, match=error):
        parties["a"].hamming.on_from(message, attempt)
        parties["a"].hamming.start(attempt, ("a", "b"))


def test_each_restart_has_its_own_pairs_from_message_in_the_transcript(pair) -> None:
    """Two restarts (two parties lost one after the other, or a party restarted twice) each send a
    pairs-from message, with other pieces: both are accepted as public values, each under its
    attempt (one label for all of them refused the second as a second value of the first)."""
    parties, _ = pair
    b = parties["b"]
    for attempt, first in ((1, 1), (2, 2)):
        b.on_message(Message("j", PAIRS_FROM_MSG, attempt, "", "", np.array([first], dtype=np.uint64)))
    assert b.hamming.kept == (2, {0: 2})
    with pytest.raises(ProtocolError, match="two different values"):  # one attempt, two values: refused
        b.on_message(Message("j", PAIRS_FROM_MSG, 2, "", "", np.array([1], dtype=np.uint64)))


def test_once_a_later_attempt_has_begun_what_is_queued_for_the_earlier_is_skipped(pair) -> None:
    """The restart's StepStart, seen on the stream's thread (`superseded`), ends the earlier attempt
    at once: its messages still queued before that StepStart are not evaluated or decrypted (before,
    each party evaluated and decrypted them all, for nothing, before it began the next attempt)."""
    from xclp.v1 import xclp_pb2 as pb
    from xclp.v1.xclp import HAMMING_STEP

    parties, link = pair
    for p in ("b", "a"):
        parties[p].hamming.start(0, ("a", "b"))
    queued = link.take()  # b's seed, a's slices to b
    slices = [(s, m, r, to) for s, m, r, to in queued if to == "b"]
    assert slices
    parties["b"].hamming.superseded(pb.StepStart(step=HAMMING_STEP, round=1, participants=["a", "b"]))
    for sender, payload, round, recipient in slices:
        deliver(parties, sender, payload, round, recipient)
    assert link.take() == []  # no piece evaluated for the attempt that is over
    parties["b"].hamming.start(1, ("a", "b"))  # the next attempt goes on as ever
    assert link.take()
