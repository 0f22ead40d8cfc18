"""How much memory this machine has, for the before-work estimates of parties and coordinator (DESIGN §10.5)."""

from __future__ import annotations

import os

INT_OVERHEAD = 40  # a Python int's header beyond its digits (a Paillier value held as an int)


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
