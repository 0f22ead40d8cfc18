"""The command-line tools cap glibc's malloc arenas (xclp.memory.limit_malloc_arenas): measured by
`benchmarks/xclp_scale.py`, a coordinator's threads otherwise kept each step's peak resident."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")

# eight threads allocate at once (blocks of 20 kB: malloc's, not Python's small-object allocator
# nor mmap), then glibc's malloc_info tells how many arenas (<heap nr=...>) the process has
COUNT_ARENAS = textwrap.dedent("""
    import ctypes, re, sys, tempfile, threading
    from xclp.memory import limit_malloc_arenas
    applied = limit_malloc_arenas() if sys.argv[1] == "limit" else False
    start = threading.Barrier(8)
    def allocate():
        start.wait()
        held = [bytearray(20000) for _ in range(50)]
        start.wait()
    threads = [threading.Thread(target=allocate) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile() as f:
        stream = ctypes.c_void_p(libc.fopen(f.name.encode(), b"w"))
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        print(applied, len(re.findall("<heap nr=", open(f.name).read())))
""")


def arenas(how: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    out = subprocess.run([sys.executable, "-c", COUNT_ARENAS, how], capture_output=True, text=True, check=True,
                         env=environ).stdout.split()
    return out[0], int(out[1])


def test_the_tools_keep_two_malloc_arenas_where_threads_would_take_one_each() -> None:
    applied, default = arenas("none")
    assert default > 2  # glibc's own choice: an arena per thread allocating at once
    assert arenas("limit") == ("True", 2)


def test_an_operators_malloc_arena_max_is_left_as_it_is() -> None:
    assert arenas("limit", MALLOC_ARENA_MAX="4") == ("False", 4)
