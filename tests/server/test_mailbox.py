"""A party's mailbox on the coordinator: items in order, each once, across a lost Pull stream
(server/mailbox.py)."""

from __future__ import annotations

import threading

import pytest

from xclp.errors import ProtocolError
from xclp.server.mailbox import REDELIVERY_MAX_BYTES, Mailbox, Superseded
from xclp.v1 import xclp_pb2 as pb


def frame(i: int, size: int = 10) -> pb.PullItem:
    return pb.PullItem(frame=pb.Frame(step=f"s{i}", data=bytes(size)))


def drain(box: Mailbox, stream: int) -> list[str]:
    out = []
    while (item := box.get(0, stream)) is not None:
        out.append(item.frame.step)
    return out


def resumable() -> Mailbox:
    box = Mailbox()
    box.keeps_sent = True
    return box


def test_items_are_numbered_in_the_order_queued_and_a_resume_sends_again_only_what_came_after_received() -> None:
    box = resumable()
    stream, _ = box.attach()
    for i in range(1, 6):
        box.put(frame(i))
    taken = [box.get(0, stream) for _ in range(4)]  # s1..s4 went out on the stream; s5 still waits
    assert [t.seq for t in taken if t is not None] == [1, 2, 3, 4]
    # the stream is lost: the party had got s1 and s2 only (s3, s4 were in flight)
    resumed, again = box.attach(resume=True, received=2)
    assert again == 2 and resumed == stream + 1
    assert drain(box, resumed) == ["s3", "s4", "s5"]  # in their order, before what waited, none twice
    assert box.queued_bytes == 0


def test_items_the_party_confirmed_are_not_kept_and_not_sent_again() -> None:
    box = resumable()
    stream, _ = box.attach()
    for i in range(1, 4):
        box.put(frame(i))
    assert drain(box, stream) == ["s1", "s2", "s3"]
    box.confirm(3)  # a Push said it has them all
    resumed, again = box.attach(resume=True, received=1)  # an older number cannot bring them back
    assert again == 0 and drain(box, resumed) == []


def test_the_lost_stream_takes_nothing_once_a_resumed_one_opened() -> None:
    box = resumable()
    old, _ = box.attach()
    box.put(frame(1))
    taken: list[object] = []

    def lost_stream() -> None:  # the old handler, blocked waiting for an item when the resume comes
        try:
            taken.append(box.get(5.0, old))
        except Superseded:
            taken.append("superseded")

    waiter = threading.Thread(target=lost_stream)
    assert box.get(0, old) is not None  # s1 went out on the old stream
    waiter.start()
    new, again = box.attach(resume=True, received=0)
    waiter.join(5.0)
    assert taken == ["superseded"] and again == 1
    box.put(frame(2))
    assert drain(box, new) == ["s1", "s2"]
    with pytest.raises(Superseded):
        box.get(0, old)


def test_a_resume_from_before_what_was_kept_or_past_what_was_sent_is_refused() -> None:
    box = resumable()
    stream, _ = box.attach()
    big = REDELIVERY_MAX_BYTES // 4 + 1
    for i in range(1, 6):
        box.put(frame(i, big))
    assert len(drain(box, stream)) == 5  # more than REDELIVERY_MAX_BYTES taken and not confirmed
    assert box.forgotten == 2
    with pytest.raises(ProtocolError, match="cannot resume from item 1: items up to 2 were not kept"):
        box.attach(resume=True, received=1)
    with pytest.raises(ProtocolError, match="says it has item 9; only 5 were queued"):
        box.attach(resume=True, received=9)
    resumed, again = box.attach(resume=True, received=2)  # from what was kept, it goes on
    assert again == 3 and drain(box, resumed) == ["s3", "s4", "s5"]


def test_a_party_that_cannot_resume_has_nothing_kept() -> None:
    box = Mailbox()
    stream, _ = box.attach()
    box.put(frame(1, 1000))
    assert drain(box, stream) == ["s1"] and box.queued_bytes == 0
    _, again = box.attach(resume=True, received=0)
    assert again == 0


def test_a_message_pushed_again_after_a_lost_connection_is_delivered_once() -> None:
    box = Mailbox()
    assert box.first_delivery(7) and not box.first_delivery(7) and box.first_delivery(8)


def test_a_place_read_back_after_the_coordinators_restart_numbers_what_it_queued_after_what_the_party_had() -> None:
    """The restarted coordinator has none of the items the party had (their numbers went with the old
    process): what it queued before the party came back goes out numbered after the party's last,
    so the party takes every one of them, none dropped as one it already had."""
    box = resumable()
    box.streaming = box.renumber = True  # server/resume.py
    box.put(frame(1))
    box.put(frame(2))
    stream, again = box.attach(resume=True, received=57)
    assert again == 0 and not box.renumber
    box.put(frame(3))
    taken = [box.get(0, stream) for _ in range(3)]
    assert [(t.frame.step, t.seq) for t in taken if t is not None] == [("s1", 58), ("s2", 59), ("s3", 60)]
    # a later resume of that stream is an ordinary one
    resumed, again = box.attach(resume=True, received=58)
    assert again == 2 and drain(box, resumed) == ["s2", "s3"]


def test_a_restarted_party_gets_nothing_of_before_and_its_message_ids_count_again() -> None:
    """PullRequest.restarted: the process that comes back holds nothing of the items queued or sent
    for the one killed, and numbers its messages from 1 again (before, its first messages were
    skipped as already delivered)."""
    box = Mailbox()
    box.keeps_sent = True
    first, _ = box.attach()
    for i in range(3):
        box.put(pb.PullItem(alive=pb.RunAlive(step=f"s{i}")))
    assert box.get(0.1, first) is not None  # taken by the stream of the process killed, not confirmed
    assert box.first_delivery(1) and not box.first_delivery(1)
    stream = box.restart()
    assert stream == first + 1
    with pytest.raises(Superseded):
        box.get(0.1, first)
    assert box.get(0.05, stream) is None  # neither what was queued nor what was sent comes
    assert box.first_delivery(1)
    box.put(pb.PullItem(alive=pb.RunAlive(step="new")))
    item = box.get(0.1, stream)
    assert item is not None and item.alive.step == "new" and item.seq == 4
