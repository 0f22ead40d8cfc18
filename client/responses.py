"""Randomised responses drawn once per row of a data set (XCLP's label-DP by randomised response;
docs/privacy.md, docs/threat-model.md).

A fresh draw per run lets a coordinator average draws into the labels (41 runs gave a majority
vote 97 % of a party's labels), and a draw keyed by what a job says gives it fresh draws for the
asking: ε = 1 − i·10⁻⁹ and six orderings of `classes` gave 60 draws of one table. So the first
draw of a data set is kept, sealed in the ledger, in the labels' own values (class names as
written, never a job's class numbers) and by row id, and every later job reuses it:

- whatever its `classes` order: the responses map through its names;
- whatever its ε, when it is at least the ε they were drawn with (they give that job a stronger
  guarantee than it asked, and are charged once, at the draw's ε); a job asking a *smaller* ε
  is refused before Join: these responses cannot give it, and a second draw would let the two
  be combined;
- the same classes and the same treatment of unlabeled rows (`hide_label_mask`), else refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from xclp.client.ledger import Ledger, LedgerCorrupt
from xclp.errors import PolicyRefused

NAME = "responses"  # the ledger entry's key and the sealed file's suffix

_EPS = 1e-12


def check(ledger: Ledger, data: bytes, epsilon: float, hide_unlabeled: bool) -> None:
    """Before Join: refuse a job whose randomised responses this data set's draw cannot give."""
    drawn = ledger.response_draw(data)
    if drawn is None:
        return
    if drawn.get("legacy"):
        raise PolicyRefused(
            "this data set's randomised responses were drawn by an earlier version of xclp, as class numbers under "
            "one job's classes, and cannot be carried over; a new draw would let the two be combined: not drawing "
            f"again (forget the data set with `xclp-client ledger forget {data.hex()[:16]}` to start it afresh, "
            "knowing that this forgets every release; docs/privacy.md)")
    if epsilon < float(drawn["epsilon"]) - _EPS:
        raise PolicyRefused(
            f"this data set's randomised responses were drawn once, at ε = {float(drawn['epsilon']):g}, and every job "
            f"reuses them; they cannot give this job's ε = {epsilon:g}, and a second draw would let the two be "
            "combined: not joining (a job with label_dp_epsilon at least the draw's reuses it; docs/privacy.md)")
    if bool(drawn["hide_unlabeled"]) != hide_unlabeled:
        raise PolicyRefused(
            f"this data set's randomised responses were drawn {'with' if drawn['hide_unlabeled'] else 'without'} "
            f"hide_label_mask and every job reuses them; this job asks the other: not joining (docs/privacy.md)")


def released_labels(ledger: Ledger, data: bytes, ids: Sequence[str], classes: Sequence[str], epsilon: float,
                    hide_unlabeled: bool, draw: Callable[[], np.ndarray]) -> np.ndarray:
    """int64[n]: the data set's randomised responses as this job numbers its `classes` (−1
    unlabeled), drawn by `draw` (in this job's numbering) the first time."""
    check(ledger, data, epsilon, hide_unlabeled)
    names, domain = list(classes), sorted(classes)
    order = np.argsort(np.asarray(ids, dtype=object).astype(str), kind="stable")

    def make() -> tuple[bytes, dict[str, Any]]:
        to_domain = np.array([domain.index(n) for n in names] + [-1], dtype=np.int64)  # −1 stays −1
        stored = to_domain[np.asarray(draw(), dtype=np.int64)][order]
        header = {"domain": domain, "hide_unlabeled": hide_unlabeled, "epsilon": epsilon}
        return (json.dumps(header).encode() + b"\n" + stored.astype("<i8").tobytes(),
                {"epsilon": epsilon, "hide_unlabeled": hide_unlabeled, "classes": len(domain)})

    raw = ledger.sealed(data, NAME, make)
    head, _, body = raw.partition(b"\n")
    try:
        meta = json.loads(head)
        stored = np.frombuffer(body, dtype="<i8").astype(np.int64)
    except ValueError:
        raise LedgerCorrupt("the sealed randomised responses of this data set are not readable: restore them, or "
                            f"forget the data set with `xclp-client ledger forget {data.hex()[:16]}`") from None
    if stored.shape != (len(ids),) or stored.max(initial=-1) >= len(meta["domain"]):
        raise LedgerCorrupt(f"the sealed randomised responses of this data set hold {stored.shape[0]} rows for a "
                            f"table of {len(ids)}: restore them, or forget the data set")
    if sorted(meta["domain"]) != domain:
        raise PolicyRefused(
            f"this data set's randomised responses were drawn over the classes {', '.join(meta['domain'])} and every "
            f"job reuses them; this job's classes are {', '.join(domain)}: not releasing them (docs/privacy.md)")
    from_domain = np.array([names.index(d) for d in meta["domain"]] + [-1], dtype=np.int64)
    out = np.empty(len(ids), dtype=np.int64)
    out[order] = from_domain[stored]
    return out


def class_names(params: Any) -> tuple[str, ...]:
    """A job's classes by name: the declared `classes`, else the class numbers as written."""
    classes = getattr(params, "classes", None)
    return tuple(classes) if classes else tuple(str(i) for i in range(params.n_classes))
