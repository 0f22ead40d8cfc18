"""The job spec every party must see alike (docs/design.md §2.5): its canonical bytes and its digest.

A coordinator that shows parties different specs (another `classes` order, another learning
rate, another set of expected parties) could make their masked contributions mean different
things, or isolate one party's contribution. So every party signs the digest of the spec as it
understood it in its key bundle, and refuses a roster whose bundles sign different digests.

What is bound: the job id, the job type, the parameters in canonical form (parsed by the job
type's schema and written back by `registry.params_json`, so spelling, key order and defaults
cannot differ), the expected parties, the minimum number of parties and the run nonce. Not
bound: the step deadline and max_run_seconds (coordinator choices with no effect on what is
released) and the data set names (each party sees only its own, docs/design.md §9).
"""

from __future__ import annotations

import hashlib
import struct

from xclp.v1 import registry
from xclp.v1 import xclp_pb2 as pb

_TAG = b"xclp/job-spec/v1"
DIGEST_BYTES = 32


def canonical_spec(spec: pb.JobSpec) -> bytes:
    """The spec's bound fields, each length-prefixed; ConfigError if its parameters do not parse."""
    params = registry.params_from_json(spec.job_type, spec.params_json)
    fields = (spec.job_id.encode(), spec.job_type.encode(), registry.params_json(params).encode(),
              "\n".join(sorted(spec.expected_parties)).encode(), struct.pack(">I", spec.min_parties))
    return _TAG + b"".join(struct.pack(">I", len(f)) + f for f in fields)


def spec_digest(spec: pb.JobSpec, run_nonce: bytes) -> bytes:
    """SHA-256 over the canonical spec and the run nonce: what every party's key bundle signs."""
    return hashlib.sha256(canonical_spec(spec) + struct.pack(">I", len(run_nonce)) + run_nonce).digest()


def party_view(spec: pb.JobSpec, party_id: str) -> pb.JobSpec:
    """The spec as one party receives it: the data set name of that party only."""
    view = pb.JobSpec()
    view.CopyFrom(spec)
    view.datasets.clear()
    if party_id in spec.datasets:
        view.datasets[party_id] = spec.datasets[party_id]
    return view
