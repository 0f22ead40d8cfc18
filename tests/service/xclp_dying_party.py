"""A real `xclp-client run` process that kills itself (SIGKILL) in one XCLP step: a crashed party.

    python xclp_dying_party.py <step> <xclp-client run arguments...>

<step> is "secure_hamming" (dies right after sending its encrypted slices, mid-SecureHamming)
or "rowsums" (on the SecureRowSums start it waits PAUSE seconds without pushing — long enough for
the others to push their round-0 payloads, so a test sees both attempts — and dies). Everything
else is the unmodified client.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from xclp.client import cli
from xclp.client.jobs.xclp import XclpParty

STEP = sys.argv[1]
PAUSE = 3.0
_on_step = XclpParty.on_step


def dying_on_step(self: XclpParty, step) -> None:  # noqa: ANN001 - pb.StepStart
    if step.step == STEP == "rowsums":
        time.sleep(PAUSE)
        os.kill(os.getpid(), signal.SIGKILL)
    _on_step(self, step)
    if step.step == STEP:
        os.kill(os.getpid(), signal.SIGKILL)


XclpParty.on_step = dying_on_step  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[2:]))
