"""A real `xclp-server` whose influence solve never ends (a block that takes forever): at the
solve it prints SOLVING and waits. Everything else is the unmodified coordinator.

    python slow_solve_server.py <xclp-server arguments...>
"""

from __future__ import annotations

import sys
import threading

from xclp.graph import InfluenceSolver
from xclp.server import cli


def solve(self, cols):
    print("SOLVING", file=sys.stderr, flush=True)
    threading.Event().wait()


InfluenceSolver.solve = solve  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
