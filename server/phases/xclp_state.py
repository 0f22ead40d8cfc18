"""What one XCLP run on the coordinator holds between its phases (server/jobs/xclp.py runs them):
the roster, sizes and Paillier moduli, who is still in the graph and the labels, the graph once
folded, the candidate pairs' schedule; and the meter that reports a long part of a step."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from xclp.candidates import PairSchedule, membership
from xclp.crypto.secure_hamming import SlotLayout
from xclp.graph import SolveStats
from xclp.progress import Meter
from xclp.server.mailbox import Party
from xclp.server.phases.base import Scope
from xclp.server.steps import xclp as steps
from xclp.v1.xclp import (
    ROWS_DTYPE,
    XclpJobParams,
)
from xclp.v1.xclp_layout import PairTask

log = logging.getLogger("xclp.server")
Dump = Callable[[str, np.ndarray], None]  # test hook: what the coordinator saw, by file name


@dataclass
class CandidateRun:
    """Candidate pairs of one run (docs/design.md §10.3): the probes per row the pooled table allows, every
    party's public budgets, and, as they arrive, each party's centre lists and centre sets."""

    probes: int
    budgets: dict[str, np.ndarray]
    fraction: float
    lists: dict[str, list[np.ndarray]] = field(default_factory=dict)
    members: dict[str, np.ndarray] = field(default_factory=dict)

    def schedule(self, a: str, b: str, slots: int) -> PairSchedule:
        return PairSchedule.of(self.budgets[a], self.budgets[b], slots)


@dataclass
class XclpState:
    """What one XCLP run holds between its phases."""

    params: XclpJobParams
    roster: tuple[str, ...]  # every party that joined, sorted: layouts and pairs index it
    sizes: dict[str, int]  # rows per roster party
    moduli: dict[str, int]  # each roster party's Paillier N, from its signed bundle
    membership: steps.Membership
    pairs: tuple[PairTask, ...] = ()  # roles drawn once, at the first secure_hamming attempt
    own: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # each party's nearest rows
    graph_layout: steps.RowLayout | None = None  # the rows of the graph, once SecureHamming is done
    W: sp.csr_matrix | None = None  # the kNN adjacency (docs/design.md §5.4): n·k entries, never H
    solve: SolveStats | None = None  # how the influence columns were solved (docs/design.md §10.2)
    labeled: dict[str, np.ndarray] = field(default_factory=dict)
    dump: Dump | None = None
    dim: int = 0  # the prepared features' dimension (candidate pairs' centres)
    candidates: CandidateRun | None = None  # docs/design.md §10.3, once the probe table is pooled

    @classmethod
    def of(cls, params: XclpJobParams, parties: Mapping[str, Party], members: list[str],
           dump: Dump | None = None, dim: int = 0) -> XclpState:
        roster = tuple(sorted(parties))
        return cls(params, roster, {p: int(parties[p].summary.rows) for p in roster},
                   {p: int.from_bytes(parties[p].bundle.paillier_n, "big") for p in roster},
                   steps.start_membership(tuple(members)), dump=dump, dim=dim)

    @property
    def layout(self) -> SlotLayout:
        """The slot layout of every pair: A's key has the job's key_bits (checked at join)."""
        return SlotLayout(self.params.key_bits, self.params.lsh_bits)

    def saved(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """What a restarted coordinator needs of this state to go on with SecureHamming (server/resume.py):
        the membership, the pairs' roles, each party's own nearest rows and the candidate schedule
        (all public sizes, or what the coordinator holds anyway); sizes and moduli come from the roster."""
        m = self.membership
        meta: dict[str, Any] = {"graph": list(m.graph), "labels": list(m.labels), "rowsums_attempt": m.rowsums_attempt,
                                "pairs": [[t.a, t.b, t.piece_values] for t in self.pairs], "dim": self.dim,
                                "params": self.params.resolved()}  # as check_start resolved them, never again
        arrays = {f"own.{p}.{i}": part for p, both in self.own.items() for i, part in enumerate(both)}
        if (run := self.candidates) is not None:
            meta["candidates"] = {"probes": run.probes, "fraction": run.fraction, "lists": sorted(run.lists)}
            arrays |= {f"budgets.{p}": b for p, b in run.budgets.items()}
            for p, lists in run.lists.items():
                arrays[f"lists.{p}"] = np.concatenate([np.asarray(x, np.int64) for x in lists] or [np.zeros(0, int)])
                arrays[f"lengths.{p}"] = np.array([len(x) for x in lists], dtype=np.int64)
        return meta, arrays

    @classmethod
    def restored(cls, params: XclpJobParams, parties: Mapping[str, Party], meta: Mapping[str, Any],
                 arrays: Mapping[str, np.ndarray], dump: Dump | None = None) -> XclpState:
        """The state `saved` wrote, with the roster's sizes and moduli."""
        state = cls.of(params, parties, list(meta["graph"]), dump, int(meta["dim"]))
        state.membership = steps.Membership(tuple(meta["graph"]), tuple(meta["labels"]), int(meta["rowsums_attempt"]))
        state.pairs = tuple(PairTask(str(a), str(b), int(v)) for a, b, v in meta["pairs"])
        state.own = {p: (arrays[f"own.{p}.0"], arrays[f"own.{p}.1"]) for p in meta["graph"]}
        if (c := meta.get("candidates")) is not None:
            budgets = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("budgets.")}
            run = state.candidates = CandidateRun(int(c["probes"]), budgets, float(c["fraction"]))
            for p in c["lists"]:
                cuts = np.cumsum([0, *arrays[f"lengths.{p}"].tolist()])
                run.lists[p] = [arrays[f"lists.{p}"][a:b] for a, b in itertools.pairwise(cuts)]
                run.members[p] = membership(run.lists[p], state.sizes[p], run.probes)
        return state

    def graph_saved(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """After SecureHamming and the labeled sets: the graph's rows, its kNN adjacency W (n·k entries)
        and each party's labeled row numbers, what the influence solve starts from (server/resume.py)."""
        assert self.W is not None and self.graph_layout is not None
        meta = {"graph_layout": list(self.graph_layout.parties), "labeled": sorted(self.labeled)}
        arrays = {f"W.{part}": getattr(self.W, part).copy() for part in ("data", "indices", "indptr")}
        return meta, arrays | {f"labeled.{p}": idx.copy() for p, idx in self.labeled.items()}

    def graph_restored(self, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """What `graph_saved` wrote, checked against the roster's sizes."""
        parties = tuple(meta["graph_layout"])
        self.graph_layout = steps.RowLayout(parties, tuple(self.sizes[p] for p in parties))
        n = self.graph_layout.n
        self.W = sp.csr_matrix((arrays["W.data"], arrays["W.indices"], arrays["W.indptr"]), shape=(n, n))
        self.W.check_format(full_check=True)  # ValueError: the restore fails, and the run is interrupted
        self.labeled = {p: arrays[f"labeled.{p}"] for p in meta["labeled"]}

    def drop(self, parties: set[str], stage: steps.XclpStage) -> None:
        for pid in sorted(parties):
            self.membership = steps.drop_party(self.membership, pid, stage)  # PeerDropped: nobody left
        log.info("XCLP: %s dropped in %s; graph: %s; labels: %s", ", ".join(sorted(parties)), stage.value,
                 ", ".join(self.membership.graph), ", ".join(self.membership.labels))

    def frame(self, participants: tuple[str, ...]) -> steps.RowLayout:
        """The rows of SecureRowSums among `participants`, in the graph's order (docs/design.md §5.6)."""
        assert self.graph_layout is not None
        return steps.rowsums_frame(self.graph_layout, participants)

    def rows(self, parties: tuple[str, ...]) -> np.ndarray:
        """uint64[P] rows per roster party, 0 for those not in `parties` (messages "layout", "graph")."""
        return np.array([self.sizes[p] if p in parties else 0 for p in self.roster], dtype=ROWS_DTYPE)


def step_meter(scope: Scope, what: str, total: int, unit: str, *, work: str = "") -> Meter:
    """A meter of the coordinator's part of a long step: its progress in `xclp-server job show`
    (the current step's, or `work`'s between steps), a log line at every tenth."""
    job_id = scope.run.config.job_id
    meter = Meter(what, total, lambda line: log.info("job %s: %s", job_id, line), unit=unit,
                  clock=scope.run.clock)
    scope.report(meter.describe, work=work)
    return meter
