"""Ledgers of the previous format (version 1), migrated, never reset (docs/privacy.md, "A ledger
from an earlier version").

Version 1 named a data set by a digest of the table *as one job prepared it* (after the job's
label mapping), and guarded exact releases per function. Neither can be recomputed without the
job, so a version 1 ledger is carried over in two steps:

1. On loading, its data sets move under "legacy", keyed by their old digests (`upgrade`).
2. When a run reads its table, the party takes the old digest of the table as this job prepares
   it (`legacy_digest`); an entry found there is merged into the data set's (`merge`): its DP
   charges count against the one budget, the set of its earliest exact release becomes the
   data set's set, and randomised responses it drew (as class numbers under one job's mapping)
   are not carried over: a data set that has them refuses a new draw until the user forgets it.

A legacy entry no run has claimed stays in the file and in `xclp-client ledger export`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from xclp.data.party_table import PartyData

VERSION = 1
RELEASE_LOG = "releases.json"  # the release log of the versions before the ledger


def release_log_notice(directory: Path) -> str:
    """What to tell the user when the release log of versions before the ledger sits beside a
    ledger that has not started yet (its entries, keyed on whole job definitions, cannot be
    carried over)."""
    log, ledger = directory / RELEASE_LOG, directory / "ledger.json"
    if log.exists() and not ledger.exists():
        return (f"{log} (the release log of xclp before the privacy ledger) is not read: the ledger in {ledger} "
                "starts empty, so the sums that log recorded are no longer guarded against a rerun among other "
                "parties (docs/privacy.md)")
    return ""


def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """A version 1 document as version 2: its data sets under "legacy" until a run claims them.
    A document that is not a version 1 ledger is returned as it is (and refused by the loader)."""
    datasets = doc.get("datasets")
    if not isinstance(datasets, dict) or not all(isinstance(d, dict) for d in datasets.values()):
        return doc
    return {"version": 2, "datasets": {}, "legacy": dict(datasets)}


def legacy_digest(data: PartyData) -> bytes:
    """The digest version 1 took of a table as a job prepared it (features, class numbers, ids)."""
    h = hashlib.sha256(b"xclp/data/v1")
    X = np.ascontiguousarray(data.X, dtype=np.float64)
    h.update(repr(X.shape).encode() + X.tobytes())
    if data.y is not None:
        h.update(np.ascontiguousarray(data.y, dtype=np.int64).tobytes())
    h.update("\n".join(data.ids).encode())
    return h.digest()


def merge(entry: dict[str, Any], old: dict[str, Any]) -> None:
    """Fold a version 1 data set entry into a version 2 one (module docstring, step 2)."""
    for key, charge in old.get("dp", {}).items():
        entry["dp"].setdefault(key, charge)
        if key.startswith("responses:") and "responses" not in entry:
            entry["responses"] = {"epsilon": charge.get("epsilon"), "legacy": True, "at": charge.get("at", "")}
    releases = sorted(old.get("exact", {}).values(), key=lambda r: r.get("at", ""))
    for release in releases:
        run = f"v1:{release.get('job', '?')}:{release.get('run', '?')}"
        parties = sorted(release.get("parties", []))
        held = entry["exact"].setdefault(run, {"job": release.get("job", "?"), "run": release.get("run", "?"),
                                               "parties": parties, "what": [], "at": release.get("at", ""),
                                               "opened": True})
        if release.get("what") and release["what"] not in held["what"] and len(held["what"]) < 8:
            held["what"].append(release["what"])
    if releases and "among" not in entry:
        first = releases[0]
        entry["among"] = {"parties": sorted(first.get("parties", [])), "job": first.get("job", "?"),
                          "run": f"v1:{first.get('job', '?')}:{first.get('run', '?')}", "at": first.get("at", "")}
