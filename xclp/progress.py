"""How far a long step has got, and how long it has left (docs/design.md §10).

A `Meter` counts a step's units of work (SecureHamming pieces, influence columns) and reports
them with an ETA from the rate so far: redrawn in place as a bar when it speaks to an interactive
`Console` (a terminal), as a plain line at every tenth (or whatever `lines` says) otherwise, and
always one line when the step is done. The party's progress (client/jobs/xclp.py) and the
coordinator's live progress in `xclp-server job show` (server/jobs/xclp.py) both use it.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

Say = Callable[[str], None]
CLEAR_LINE = "\r\x1b[K"  # back to the line's start, erase to its end
REDRAW_SECONDS = 0.2  # a bar is redrawn at most this often


def duration(seconds: float) -> str:
    """'45 s', '9 min', '2 h 5 min'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 90:
        return f"{seconds} s"
    minutes = seconds // 60
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


class Console:
    """Where a command's messages go (stderr unless told): a line per message, each after `prefix`;
    on a terminal also one status line kept below them and redrawn in place (a `Meter`'s bar)."""

    def __init__(self, prefix: str = "", stream: TextIO | None = None, *, interactive: bool | None = None,
                 width: int | None = None) -> None:
        self.prefix = prefix
        self._stream, self._interactive, self._width = stream, interactive, width
        self._status = ""
        self._lock = threading.Lock()  # a party's messages come from more than one thread

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr  # stderr as it is now (pytest swaps it)

    @property
    def interactive(self) -> bool:
        if self._interactive is not None:
            return self._interactive
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):  # a closed or odd stream
            return False

    def __call__(self, message: str) -> None:
        with self._lock:
            out = self.stream
            if self._status:
                out.write(CLEAR_LINE)
            out.write(f"{self.prefix}{message}\n")
            if self._status:
                out.write(self._status)
            out.flush()

    def status(self, text: str) -> None:
        """Show `text` as the status line (cut to the terminal's width); "" takes it away. Nothing
        when not interactive."""
        if not self.interactive:
            return
        width = self._width if self._width is not None else shutil.get_terminal_size().columns
        text = text[: max(20, width - 1)]
        with self._lock:
            self.stream.write(CLEAR_LINE + text)
            self.stream.flush()
            self._status = text


class Meter:
    """`total` units of a step: `update(done)` as they are done.

    With `bar`, on an interactive Console, a bar is redrawn (at most every REDRAW_SECONDS);
    elsewhere a line at every 1/`lines` of the way. A meter that is not the bar says nothing on
    a terminal until it is done (its lines would push the bar away). When done: one line."""

    def __init__(self, what: str, total: int, say: Say, *, unit: str = "pieces", lines: int = 10,
                 bar: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        if total < 0 or lines < 1:
            raise ValueError(f"a meter needs total >= 0 and lines >= 1, not {total} and {lines}")
        self.what, self.total, self.say, self.unit, self.lines, self.bar = what, total, say, unit, lines, bar
        self.clock = clock
        self.started = clock()
        self.done = 0
        self.finished = False
        self._next_line = 1  # the next 1/lines of the way that earns a line
        self._drawn = float("-inf")

    @property
    def console(self) -> Console | None:
        """The terminal this meter draws on, if it speaks to one."""
        return self.say if isinstance(self.say, Console) and self.say.interactive else None

    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float | None:
        """Seconds left at the rate so far (None before the first unit)."""
        if self.done <= 0:
            return None
        return self.elapsed() * (self.total - self.done) / self.done

    def describe(self) -> str:
        """'12/40 pieces (30%), 1 min so far, about 2 min left'."""
        pct = 100 * self.done // self.total if self.total else 100
        left = self.left()
        eta = f", about {duration(left)} left" if left is not None and self.done < self.total else ""
        return f"{self.done}/{self.total} {self.unit} ({pct}%), {duration(self.elapsed())} so far{eta}"

    def update(self, done: int) -> None:
        self.done = min(done, self.total)
        if self.finished:
            return
        console = self.console
        if self.done >= self.total:
            self.finished = True
            if console is not None and self.bar:
                console.status("")
            self.say(f"{self.what}: {self.total} {self.unit} in {duration(self.elapsed())}")
            return
        if console is not None:
            now = self.clock()
            if self.bar and now - self._drawn >= REDRAW_SECONDS:
                self._drawn = now
                console.status(self._bar_text())
            return
        if self.done * self.lines >= self._next_line * self.total:
            self._next_line = self.done * self.lines // self.total + 1
            self.say(f"{self.what}: {self.describe()}")

    def _bar_text(self, width: int = 24) -> str:
        filled = width * self.done // self.total if self.total else width
        return f"{self.what} [{'#' * filled}{'.' * (width - filled)}] {self.describe()}"
