"""A real `xclp-client run` process that kills itself (SIGKILL) when a masked sum's reveal starts:
a party lost after its masked contribution is held and confirmed, before it reveals its seed.

    python reveal_dying_party.py <wire name of the reveal step> <xclp-client run arguments...>

e.g. "sum_reveal" (FlyNN, RACE), "moments_reveal", "rowsums_reveal" (XCLP), "r0.update_reveal"
(FedAvg, DBCL). Everything else is the unmodified client.
"""

from __future__ import annotations

import os
import signal
import sys

from xclp.client import cli
from xclp.client.phases.masked_sum import MaskedSumParty

STEP = sys.argv[1]
_on_step = MaskedSumParty.on_step


def dying_on_step(self: MaskedSumParty, step) -> int:
    if self.ctx.prefix + step.step == STEP:
        os.kill(os.getpid(), signal.SIGKILL)
    return _on_step(self, step)


MaskedSumParty.on_step = dying_on_step  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[2:]))
