"""Masked vs plain all-reduce through the real coordinator over localhost gRPC with TLS (docs/design.md §6).

Three party processes each push a 10^6-element uint32 count array (shape 2 x 500000, job type
flynn). "masked" is the product path: pairwise AES-CTR masks and the party's self mask added
before the push, then the self-mask reveal round (double masking, docs/design.md §6.1). "plain" is the
same service, same session code, with the pairwise masks skipped (a baseline only; the self mask
and its reveal round stay, as the protocol has them). Each run's time is the slowest party's
sum-step latency: from the coordinator's StepStart("sum") to the JobEnd after the aggregate came
back, reveal round included. Setup (join,
roster, seed) is excluded: it is the same for both.

bytes_on_wire_per_element: payload bytes moved through the coordinator per array element per
party (upload + the aggregate's download; TLS/HTTP-2 framing not counted); upload_bytes_per_element:
the upload alone (exact counts travel as uint32: 4 bytes each way).

Usage: python benchmarks/allreduce.py [--quick | --smoke] [--elements N] [--repeats K]
Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PARTIES = ("p1", "p2", "p3")


def party_main(address: str, ca: str, job_id: str, party: str, key_pem: bytes, elements: int, masked: bool,
               out: mp.Queue, peers: dict[str, bytes]) -> None:
    import dataclasses

    from cryptography.hazmat.primitives import serialization

    from xclp.client.connection import ConnectionConfig
    from xclp.client.context import PartyContext
    from xclp.client.jobs.allreduce import AllReduceParty
    from xclp.client.policy import PartyPolicy
    from xclp.client.run_config import RunConfig
    from xclp.client.session import PartySession
    from xclp.data.party_table import PartyData
    from xclp.v1 import registry

    key = serialization.load_pem_private_key(key_pem, password=None)
    counts = np.random.default_rng(PARTIES.index(party)).integers(0, 1000, size=(2, elements // 2)).astype(np.uint32)

    class BenchRelease:  # the same counts every run, whatever the data
        def wire(self, dim):
            return counts.dtype, counts.shape

        def contribution(self, data, seed, n_parties):
            return counts

        def decode(self, aggregate):
            return aggregate

    class PlainMasker:  # the baseline: the pairwise masks skipped
        def __init__(self, masker):
            self.session_id, self.secrets, self.my_id = masker.session_id, masker.secrets, masker.my_id

        def apply(self, values, **_):
            return values.copy()

    def bench_party(ctx: PartyContext) -> AllReduceParty:
        if not masked:
            ctx = dataclasses.replace(ctx, masker=PlainMasker(ctx.masker))
        return AllReduceParty(ctx, BenchRelease())


    class Bench(PartySession):
        t_step = 0.0
        t_end = 0.0

        def on_step(self, step):
            if step.step == "sum":
                self.t_step = time.perf_counter()
            super().on_step(step)

        def on_end(self, end):
            self.t_end = time.perf_counter()
            super().on_end(end)

    data = PartyData(np.zeros((4, 4)), np.array([0, 1, 0, 1]), ("0", "1", "2", "3"))
    session = Bench(RunConfig(job_id, party, key, ConnectionConfig(address, ca_cert=Path(ca)), peers=peers,
                              policy=PartyPolicy(min_parties=3)), data,
                    progress=lambda m: None)
    # the flynn entry stands in for the benchmark's party while the session runs (the context must
    # stay open: a registration left to the garbage collector is undone at once)
    with registry.registered(dataclasses.replace(registry.get("flynn"), party=bench_party), replacing=True):
        session.run()
    out.put((party, session.t_end - session.t_step, session.conn.bytes_sent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run of each (default: 3)")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run through every part, for CI: proves the benchmark runs; "
                    "its figures mean nothing")
    ap.add_argument("--elements", type=int, default=1_000_000, help="array elements per party (even)")
    ap.add_argument("--repeats", type=int, help="runs of each variant")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick or args.smoke else 3)
    if args.smoke:
        args.elements = 2000
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    from cryptography.hazmat.primitives import serialization

    from xclp.crypto import identity
    from xclp.server import dev_ca
    from xclp.server.config import JobConfig, TlsFiles
    from xclp.server.coordinator import Coordinator
    from xclp.server.service import build_server
    from xclp.v1.registry import parse_params

    tmp = Path(tempfile.mkdtemp(prefix="xclp-bench-"))
    dev_ca.init_ca(tmp)
    server_files = dev_ca.issue(tmp, tmp, "server", server=True, dns_names=("localhost",))
    keys = {p: identity.generate_identity() for p in PARTIES}
    pems = {p: k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption()) for p, k in keys.items()}
    params = parse_params("flynn", {"n_classes": 2, "m": args.elements // 2, "s": 1, "rho": 1})
    variants = [("masked", True), ("plain", False)]
    jobs = [JobConfig(f"{name}-{r}", "flynn", params, PARTIES, 3, 120, 300)
            for r in range(repeats) for name, _ in variants]
    allow = {p: identity.public_bytes(k) for p, k in keys.items()}
    coordinator = Coordinator(allow, jobs)
    server, port = build_server(coordinator, "127.0.0.1:0", tls=TlsFiles(server_files.cert_path, server_files.key_path))
    server.start()
    coordinator.start()
    ctx = mp.get_context("spawn")
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    sent: dict[str, int] = {}
    try:
        for r in range(repeats):
            for name, masked in variants:
                out = ctx.Queue()
                ca = str(tmp / dev_ca.CA_CERT)
                procs = [ctx.Process(target=party_main, args=(f"localhost:{port}", ca, f"{name}-{r}",
                                                              p, pems[p], args.elements, masked, out, allow))
                         for p in PARTIES]
                for proc in procs:
                    proc.start()
                results = [out.get(timeout=600) for _ in PARTIES]
                for proc in procs:
                    proc.join()
                slowest = max(t for _, t, _ in results)
                times[name].append(slowest)
                sent[name] = sum(b for _, _, b in results)
                print(f"{name} run {r}: {slowest:.3f} s", file=sys.stderr)
    finally:
        coordinator.stop()
        server.stop(0)
    masked_s, plain_s = statistics.median(times["masked"]), statistics.median(times["plain"])
    per_element = (sent["masked"] + len(PARTIES) * 4 * args.elements) / (len(PARTIES) * args.elements)
    print(json.dumps({
        "benchmark": "allreduce", "parties": len(PARTIES), "elements": args.elements, "repeats": repeats,
        "transport": "grpc+tls localhost", "masked_seconds": round(masked_s, 4), "plain_seconds": round(plain_s, 4),
        "overhead_ratio": round(masked_s / plain_s, 3), "bytes_on_wire_per_element": round(per_element, 3),
        "upload_bytes_per_element": round(sent["masked"] / (len(PARTIES) * args.elements), 3),
    }))


if __name__ == "__main__":
    main()
