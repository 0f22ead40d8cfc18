"""The party's side of liveness (server/liveness.py): while it works on what the coordinator sent
(encrypting, evaluating, decrypting, training, propagating), a short progress report at least
every `step_seconds / 4`, so that a coordinator that waits for it knows it is at work rather than
gone. A report says which step or message the party is on and for how long, nothing else: what
it prints for its own operator (estimates, its ledger, its data's size) stays with it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from xclp.v1.steps import ALIVE_MAX_BYTES

DEFAULT_INTERVAL = 30.0  # before the first step says how long the coordinator waits


class Heartbeat:
    """Reports through `send(text)` every `interval` seconds while `busy`; `send` failing (an older
    coordinator that takes no reports, a connection that is going) is not this party's problem."""

    def __init__(self, send: Callable[[bytes], object], *, interval: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send, self.interval, self._clock = send, interval, clock
        self._on: tuple[str, float] | None = None  # what it works on, since when
        self._sent = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="xclp-heartbeat", daemon=True)
        self._thread.start()

    def pace(self, step_seconds: float) -> None:
        """The coordinator waits `step_seconds` for a silent party: report four times as often."""
        if step_seconds > 0:
            self.interval = max(0.5, step_seconds / 4)

    @contextmanager
    def busy(self, what: str) -> Iterator[None]:
        self._on = (what, self._clock())
        try:
            yield
        finally:
            self._on = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(min(1.0, self.interval / 4)):
            on, now = self._on, self._clock()
            if on is None or now - max(on[1], self._sent) < self.interval:
                continue
            self._sent = now
            text = f"working on {on[0]} for {now - on[1]:.0f} s"
            with contextlib.suppress(Exception):  # a report that does not go is only a report
                self._send(text.encode()[:ALIVE_MAX_BYTES])
