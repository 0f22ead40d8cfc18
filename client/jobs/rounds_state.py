"""What a party keeps of its training run to rejoin it after its process restarted (client/run_state.py
seals and writes it; client/jobs/training.py says when): the round and its model as released, the
rounds' samples, the model chain's head, the models whose sums it revealed, the round's public
values (its transcript), and, once trained, the round's update with its DP noise. In a round that
runs XCLP before its update nothing is kept until the party has its update (its pseudo-labels are
not kept); from then on the update is all the round needs. A restarted process rejoins the
round's update sum with them and masks the same update again under fresh masks (or, if the
round's sum was opened here, waits for the next round). Past rounds keep their numbers in the
party's result, not their models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from xclp.privacy.dpsgd import RoundNoise

if TYPE_CHECKING:
    from xclp.client.jobs.training import RoundsParty


def saved(job: RoundsParty) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """`job`'s state from the rounds' samples on; None before them, or in a round the trainer cannot
    rejoin until the party has its update (one that runs XCLP: its pseudo-labels are not kept)."""
    state = job.trainer.state()
    if state is None and job.update is not None:  # the update is all the round needs from here on
        state = {}
    if job.samples is None or state is None:
        return None
    masks = job.update_sum.self_masks.revealed_attempt if job.update_sum is not None else None
    meta: dict[str, Any] = {
        "round": job.round, "samples": [list(s) for s in job.samples], "trainer": state,
        "head": job.head.hex() if job.head is not None else None, "head_round": job.head_round,
        "released": {d.hex(): [t, sorted(m)] for d, (t, m) in job.released.items()},
        "revealed": None if masks is None else [masks[0], list(masks[1])],
        "rows": None if job.update is None else job.update[1],
        # the round's public values (its model; in an XCLP round, its layouts and pairs too)
        "round_transcript": None if job.update_sum is None else job.update_sum.ctx.transcript.state(),
        "noise_variance": None if job.noise is None else job.noise.variance,
        "history": [{"round": r.round, "rows": r.rows, "pseudo_seconds": r.pseudo_seconds,
                     "train_seconds": r.train_seconds, "seed": r.seed.hex()} for r in job.history]}
    arrays: dict[str, np.ndarray] = {}
    if isinstance(job.model_payload, np.ndarray):
        arrays["model"] = job.model_payload
    if job.update is not None:
        arrays["update"] = job.update[0]
    if job.noise is not None and job.noise.share is not None:
        arrays["noise"] = job.noise.share
    return meta, arrays


def restore(job: RoundsParty, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> RoundsParty:
    """`job`, new, as `saved` described it: in its round again, waiting for the coordinator to
    start the round's sum again with it (it sends the round's model again, which must be this one)."""
    from xclp.client.jobs.training import RoundRecord

    job.trainer.restore(meta["trainer"])
    job.samples = tuple(tuple(s) for s in meta["samples"])
    job.released = {bytes.fromhex(d): (int(t), frozenset(m)) for d, (t, m) in meta["released"].items()}
    job.history = [RoundRecord(h["round"], np.zeros(0), None, h["rows"], h["pseudo_seconds"], h["train_seconds"],
                               bytes.fromhex(h["seed"])) for h in meta["history"]]
    job.head = None if meta["head"] is None else bytes.fromhex(meta["head"])
    t, job.head_round = int(meta["round"]), int(meta["head_round"])
    if t >= 0 and job.head_round < t:  # the round's sum was not opened here: the round again, as it was
        job._open_round(t, arrays["model"])
        if meta.get("round_transcript") is not None:
            assert job.update_sum is not None
            job.update_sum.ctx.transcript.take(meta["round_transcript"])
        if meta["rows"] is not None:
            job.update = (arrays["update"], int(meta["rows"]))
        if meta["noise_variance"] is not None and job.dp is not None:
            job.noise = RoundNoise(job.dp, arrays["update"].shape[0])
            job.noise.share, job.noise.variance = arrays["noise"], float(meta["noise_variance"])
        if meta["revealed"] is not None:
            assert job.update_sum is not None
            job.update_sum.self_masks.revealed_attempt = (int(meta["revealed"][0]), tuple(meta["revealed"][1]))
    job.round = t
    return job
