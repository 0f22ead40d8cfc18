"""Meters and the console (xclp.progress): lines at the right fractions with an ETA from the rate so
far, a bar redrawn in place on a terminal that log lines never tear, one line when done."""

from __future__ import annotations

import io

import pytest

from xclp.progress import CLEAR_LINE, Console, Meter, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_duration_reads_as_a_person_would_say_it() -> None:
    assert [duration(s) for s in (0, 44.6, 89, 90, 7199, 7200, 7500)] == \
        ["0 s", "45 s", "89 s", "1 min", "119 min", "2 h 0 min", "2 h 5 min"]


def test_lines_at_every_tenth_with_the_eta_of_the_rate_so_far() -> None:
    lines: list[str] = []
    clock = Clock()
    meter = Meter("SecureHamming", 200, lines.append, clock=clock)
    for done in range(1, 201):
        clock.now += 3.0  # 3 s a piece
        meter.update(done)
    assert len(lines) == 10  # 9 tenths on the way, then the end
    assert lines[0] == "SecureHamming: 20/200 pieces (10%), 60 s so far, about 9 min left"
    assert lines[4] == "SecureHamming: 100/200 pieces (50%), 5 min so far, about 5 min left"
    assert lines[-1] == "SecureHamming: 200 pieces in 10 min"
    meter.update(200)  # done is done: no second last line
    assert len(lines) == 10


def test_a_jump_past_several_fractions_says_one_line_and_quarters_say_four() -> None:
    lines: list[str] = []
    meter = Meter("pair a->b", 8, lines.append, unit="pieces decrypted", lines=4, clock=Clock())
    for done in (1, 2, 3, 7, 8):
        meter.update(done)
    assert [line.split(" (")[0] for line in lines] == [
        "pair a->b: 2/8 pieces decrypted", "pair a->b: 7/8 pieces decrypted"] + lines[2:]
    assert lines[2] == "pair a->b: 8 pieces decrypted in 0 s" and len(lines) == 3


def test_a_meter_of_nothing_says_it_is_done_at_once() -> None:
    lines: list[str] = []
    Meter("influence columns", 0, lines.append, unit="columns received", clock=Clock()).update(0)
    assert lines == ["influence columns: 0 columns received in 0 s"]


def test_a_bar_is_redrawn_in_place_and_lines_go_above_it() -> None:
    out, clock = io.StringIO(), Clock()
    console = Console("xclp-client: ", out, interactive=True, width=200)
    bar = Meter("SecureHamming", 4, console, bar=True, clock=clock)
    quiet = Meter("pair a->b", 4, console, lines=4, clock=clock)  # not the bar: one line when done
    bar.update(1)
    console("a message")
    clock.now += 1.0
    bar.update(2)
    quiet.update(2)
    quiet.update(4)
    clock.now += 1.0
    bar.update(4)
    text = out.getvalue()
    first = "SecureHamming [######..................] 1/4 pieces (25%), 0 s so far, about 0 s left"
    assert text.startswith(CLEAR_LINE + first)
    # the line clears the bar, is written whole, and the bar comes back under it
    assert (CLEAR_LINE + "xclp-client: a message\n" + first) in text
    assert "SecureHamming [############............] 2/4 pieces (50%)" in text
    assert text.count("pair a->b") == 1 and "xclp-client: pair a->b: 4 pieces in 1 s\n" in text
    # done: the bar is taken away and the last line stays
    assert text.endswith(CLEAR_LINE + "xclp-client: SecureHamming: 4 pieces in 2 s\n")
    assert console._status == ""


def test_a_bar_is_cut_to_the_terminals_width() -> None:
    out = io.StringIO()
    Console("", out, interactive=True, width=30).status("x" * 100)
    assert out.getvalue() == CLEAR_LINE + "x" * 29


def test_a_bar_is_redrawn_at_most_five_times_a_second() -> None:
    out, clock = io.StringIO(), Clock()
    bar = Meter("x", 1000, Console("", out, interactive=True), bar=True, clock=clock)
    for done in range(1, 1000):
        clock.now += 0.001  # a second in all
        bar.update(done)
    assert 5 <= out.getvalue().count("x [") <= 6


def test_no_bar_and_no_control_characters_when_not_a_terminal() -> None:
    out = io.StringIO()
    console = Console("xclp-client: ", out)  # StringIO is not a tty
    assert not console.interactive
    meter = Meter("SecureHamming", 10, console, bar=True, clock=Clock())
    for done in range(1, 11):
        meter.update(done)
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert out.getvalue().count("\n") == 10


def test_a_meter_refuses_a_negative_total() -> None:
    with pytest.raises(ValueError, match="total >= 0"):
        Meter("x", -1, print)
