"""A real `xclp-server` with SecureHamming pieces of two 512-bit ciphertexts (many per pair, as the
test's parties cut them too) and a checkpoint as often as every 0.2 s; with XCLP_TEST_SOLVE_HANGS=1
in its environment, its influence solve prints SOLVING and never ends (a test kills it there).
Everything else is the unmodified coordinator.

    python small_pieces_server.py <xclp-server arguments...>
"""

from __future__ import annotations

import os
import sys
import threading

from xclp.graph import InfluenceSolver
from xclp.server import cli, resume
from xclp.v1 import secure_hamming_wire

secure_hamming_wire.PIECE_BYTES = 2 * 128
resume.CHECKPOINT_SECONDS = resume.POLL_SECONDS = 0.2


def hangs(self, cols):
    print("SOLVING", file=sys.stderr, flush=True)
    threading.Event().wait()


if os.environ.get("XCLP_TEST_SOLVE_HANGS") == "1":
    InfluenceSolver.solve = hangs  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
