"""Benchmark pairwise masking (docs/design.md §5.6, §6) against the raw AES-CTR keystream it is built on.

    python benchmarks/masking.py [--quick | --smoke] [--elements N] [--peers P] [--repeats R]

Measures, best of R runs (the machine is shared, so the minimum is the honest estimate):
- mask: `PairwiseMasker.apply` on a uint64[N] array for P peers (HKDF per peer, keystream, sum);
- keystream: P raw AES-256-CTR keystreams of 8·N bytes each straight from `cryptography`
  (`aes_only`: the same bytes written into one reused cache-sized buffer, the AES cost alone);
- masked vs plain summation over P parties: every party masks its array, then `ring_sum`,
  against `ring_sum` of the raw arrays.
Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from xclp.crypto.masking import PairwiseMasker, ring_sum

SESSION = b"benchmark-session"


def best_of(repeats: int, fn: Callable[[int], object]) -> float:
    """Minimum wall time of `fn(attempt)` over `repeats` attempts (attempt feeds fresh rounds)."""
    times = []
    for attempt in range(repeats):
        start = time.perf_counter()
        fn(attempt)
        times.append(time.perf_counter() - start)
    return min(times)


def raw_keystreams(keys: list[bytes], n_bytes: int) -> None:
    zeros = bytes(n_bytes)
    for key in keys:
        Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(zeros)


def raw_keystreams_into_cache(keys: list[bytes], n_bytes: int, chunk: int = 1 << 17) -> None:
    """AES-CTR cost alone: keystream written into one reused cache-sized buffer (a lower bound)."""
    zeros = bytes(chunk)
    buf = bytearray(chunk + 15)
    for key in keys:
        enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        for start in range(0, n_bytes, chunk):
            enc.update_into(zeros[: min(chunk, n_bytes - start)], buf)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10^5 elements, 3 repeats")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run through every part, for CI: proves the benchmark runs; "
                        "its figures mean nothing")
    parser.add_argument("--elements", type=int, default=None, help="array length (default 10^6)")
    parser.add_argument("--peers", type=int, default=4, help="peers per party / parties summed (default 4)")
    parser.add_argument("--repeats", type=int, default=None, help="timing repeats (default 7)")
    args = parser.parse_args(argv)
    n = args.elements or (1000 if args.smoke else 10**5 if args.quick else 10**6)
    repeats = args.repeats or (1 if args.smoke else 3 if args.quick else 7)
    peers = args.peers
    if n < 1 or peers < 1 or repeats < 1:
        parser.error("--elements, --peers and --repeats must be >= 1")

    # Party "p0" masks against peers p1..pP; the secrets are random stand-ins for X25519 outputs.
    ids = [f"p{i}" for i in range(peers + 1)]
    pair_secret = {(a, b): os.urandom(32) for a in ids for b in ids if a < b}

    def masker(me: str, members: list[str]) -> PairwiseMasker:
        secrets = {o: pair_secret[(min(me, o), max(me, o))] for o in members if o != me}
        return PairwiseMasker(me, secrets, SESSION)

    rng = np.random.default_rng(0)
    values = rng.integers(0, 2**64, size=n, dtype=np.uint64)
    elem_bytes = values.dtype.itemsize

    print(f"masking uint64[{n}] for {peers} peers, best of {repeats}", file=sys.stderr)
    me = masker("p0", ids)
    mask_s = best_of(repeats, lambda r: me.apply(values, purpose="bench", attempt=r, participants=ids))
    keys = [os.urandom(32) for _ in range(peers)]
    keystream_s = best_of(repeats, lambda _: raw_keystreams(keys, n * elem_bytes))
    aes_only_s = best_of(repeats, lambda _: raw_keystreams_into_cache(keys, n * elem_bytes))
    print(
        f"  mask {mask_s * 1e3:.2f} ms, raw keystream {keystream_s * 1e3:.2f} ms, "
        f"AES-CTR into a cached buffer {aes_only_s * 1e3:.2f} ms",
        file=sys.stderr,
    )

    # Summation over `peers` parties, each masking against the others.
    parties = ids[:peers]
    party_maskers = {p: masker(p, parties) for p in parties}
    arrays = {p: rng.integers(0, 2**64, size=n, dtype=np.uint64) for p in parties}

    def masked_sum(r: int) -> np.ndarray:
        masked = [party_maskers[p].apply(arrays[p], purpose="sum", attempt=r, participants=parties) for p in parties]
        return ring_sum(masked)

    print(f"summing {peers} parties' uint64[{n}], masked vs plain", file=sys.stderr)
    plain_sum_s = best_of(repeats, lambda _: ring_sum(arrays.values()))
    masked_sum_s = best_of(repeats, masked_sum)
    assert np.array_equal(masked_sum(repeats), ring_sum(arrays.values())), "masks did not cancel"
    print(f"  plain {plain_sum_s * 1e3:.2f} ms, masked {masked_sum_s * 1e3:.2f} ms", file=sys.stderr)

    result = {
        "benchmark": "masking",
        "elements": n,
        "peers": peers,
        "repeats": repeats,
        "dtype": "uint64",
        "bytes_per_element": elem_bytes,  # masking adds no expansion: wire size = plain size
        "mask_s": mask_s,
        "keystream_s": keystream_s,
        "keystream_bytes": peers * n * elem_bytes,
        "mask_vs_keystream_ratio": mask_s / keystream_s,
        "aes_only_s": aes_only_s,
        "mask_vs_aes_only_ratio": mask_s / aes_only_s,
        "mask_throughput_MBps": peers * n * elem_bytes / mask_s / 1e6,
        "plain_sum_s": plain_sum_s,
        "masked_sum_s": masked_sum_s,
        "masked_vs_plain_sum_ratio": masked_sum_s / plain_sum_s,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
