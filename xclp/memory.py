"""How much memory this machine has, for the before-work estimates of parties and coordinator (docs/design.md §10.5)."""

from __future__ import annotations

import ctypes
import os

INT_OVERHEAD = 40  # a Python int's header beyond its digits (a Paillier value held as an int)


MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt parameter


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas, as MALLOC_ARENA_MAX=2 would, unless the environment sets it.

    glibc gives threads that allocate at once arenas of their own (up to eight per core), and memory
    freed in one stays with it: the gRPC threads of a party or the coordinator kept each step's
    peak resident into the next (measured with `benchmarks/xclp_scale.py` at 3 × 2 000 rows: the
    coordinator's peak 421 MB with glibc's default, 330 MB with two arenas; a party's 419 and 399
    MB; the same speed). Called first thing by the command-line tools; whether it applied (glibc only).
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


def physical_memory() -> int:
    """Bytes of RAM on this machine (0 if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def default_max_memory() -> int:
    """Three quarters of the RAM, or no limit (0) when it cannot be read."""
    return physical_memory() * 3 // 4


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
