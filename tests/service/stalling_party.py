"""A real `xclp-client run` process that stalls in one XCLP step: a party that takes part in the
run and then, at the start of <step>, prints STALLING and never answers (a slow or hung peer).

    python stalling_party.py <step> <xclp-client run arguments...>

Everything else is the unmodified client; the test kills the process when it is done with it.
"""

from __future__ import annotations

import sys
import threading

from xclp.client import cli
from xclp.client.jobs.xclp import XclpParty

STEP = sys.argv[1]
_on_step = XclpParty.on_step


def stalling_on_step(self: XclpParty, step) -> None:
    if step.step == STEP:
        print("STALLING", file=sys.stderr, flush=True)
        threading.Event().wait()
    _on_step(self, step)


XclpParty.on_step = stalling_on_step  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[2:]))
