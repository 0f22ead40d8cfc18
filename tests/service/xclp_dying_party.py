"""A real `xclp-client run` process that kills itself (SIGKILL) in one XCLP step: a crashed party.

    XCLP_TEST_GO_FILE=<path> python xclp_dying_party.py <step> <xclp-client run arguments...>

<step> is "secure_hamming" (dies right after sending its encrypted slices, mid-SecureHamming)
or "rowsums" (on the SecureRowSums start it pushes nothing and dies once the test creates the
file XCLP_TEST_GO_FILE, which the test does when the coordinator holds the others' round-0
payloads, so both attempts are observed). Everything else is the unmodified client.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from xclp.client import cli
from xclp.client.jobs.xclp import XclpParty

STEP = sys.argv[1]
GO_WAIT_SECONDS = 120.0
_on_step = XclpParty.on_step


def wait_for_go() -> None:
    go = Path(os.environ["XCLP_TEST_GO_FILE"])
    deadline = time.monotonic() + GO_WAIT_SECONDS
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def dying_on_step(self: XclpParty, step) -> None:
    if step.step == STEP == "rowsums":
        wait_for_go()
        os.kill(os.getpid(), signal.SIGKILL)
    _on_step(self, step)
    if step.step == STEP:
        os.kill(os.getpid(), signal.SIGKILL)


XclpParty.on_step = dying_on_step  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[2:]))
