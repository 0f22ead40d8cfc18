"""What an XCLP party keeps of its run to rejoin it after its process restarted (client/run_state.py
seals and writes it; client/jobs/xclp.py says when), and the job read back from it.

- In SecureHamming (from its pairs until the graph layout): the row layout, the attempt, the pairs,
  its encrypted bit slices once it has them and, on candidate pairs, the opened probe table;
  everything else is recomputed from the data and the seed. The coordinator starts the next
  attempt with it, every pair from its first piece not folded.
- From the moment its Z̄ is whole until it reveals its row sums: the row layout, the graph layout,
  Z̄ as it releases it (with label-DP, its noisy release as drawn: a restarted party masks the same
  values again, never fresh noise) and the digest of the influence columns Z̄ is a function of (its
  ledger's name for the release). The coordinator starts SecureRowSums' next attempt among the same
  parties, where it masks the same Z̄ under fresh masks. Once it has revealed, nothing is kept: a
  restarted process cannot rejoin a sum it helped open.

Between the two (the influence columns on their way) nothing is kept, and a restart is a drop.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from xclp.client.steps import xclp as steps
from xclp.privacy.label_dp import LabelDpPlan
from xclp.v1.xclp_layout import pairs_table

if TYPE_CHECKING:
    from xclp.client.context import PartyContext
    from xclp.client.jobs.xclp import XclpParty


def saved(job: XclpParty) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """`job`'s state in SecureHamming or with Z̄ whole (module docstring); None elsewhere."""
    if job.graph:
        return _row_sums_saved(job)
    hamming = job.hamming
    if not hamming.pairs:
        return None
    arrays = {"pairs": pairs_table(hamming.pairs, job.roster.party_ids)}
    if hamming.slices is not None:
        arrays["slices"] = np.frombuffer(hamming.slices, dtype=np.uint8)
    meta: dict[str, Any] = {"sizes": job.sizes, "attempt": hamming.attempt}
    if job.candidates is not None:
        table = job.candidates.opened
        if table is None:
            return None
        meta["table_members"] = list(table[1])
        arrays["table"] = table[0]
    return meta, arrays


def _row_sums_saved(job: XclpParty) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    zbar = job.zbar
    if zbar is None or job.block is None or job.row_sums.self_masks.revealed:
        return None
    meta: dict[str, Any] = {"sizes": job.sizes, "graph": [[p, n] for p, n in job.graph], "block": job.block.hex(),
                            "label_privacy": job.label_privacy, "approximation": job.approximation}
    if isinstance(zbar, steps.NoisyRowSums):
        meta["plan"] = asdict(zbar.plan)
        return meta, {"zbar": zbar.encoded}
    return meta, {"zbar": zbar}


def restored(job: XclpParty, ctx: PartyContext, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> XclpParty:
    """`job`, new, as `saved` described it: waiting for the SecureHamming attempt, or the
    SecureRowSums attempt, that its restart starts."""
    job.sizes = {str(p): int(n) for p, n in meta["sizes"].items()}
    job.since = "since this process rejoined the run"  # not the seed, which an earlier process took
    hamming = job.hamming
    if "graph" in meta:  # Z̄ whole: SecureHamming and the influence columns are behind it
        job.graph = tuple((str(p), int(n)) for p, n in meta["graph"])
        job.block = bytes.fromhex(meta["block"])
        job.label_privacy = meta["label_privacy"]
        job.approximation = meta.get("approximation")  # (a state written before sparse influence has none)
        zbar = arrays["zbar"]
        job.zbar = steps.NoisyRowSums(zbar, LabelDpPlan(**meta["plan"])) if "plan" in meta else zbar
        hamming.done = True
        return job
    hamming.codes = steps.lsh_step(job.X, ctx.seed, job.params.lsh_bits)
    hamming.on_pairs(arrays["pairs"])
    hamming.attempt = None if meta["attempt"] is None else int(meta["attempt"])
    if "slices" in arrays:
        hamming.slices = arrays["slices"].tobytes()
    if job.candidates is not None:
        job.candidates.reopen(arrays["table"], tuple(meta["table_members"]))
    return job
