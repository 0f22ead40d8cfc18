"""Candidate pairs' set-up on the wire (docs/design.md §10.3): the centres, the probe table, the probes.

The centres are C directions drawn from the parties' common seed (xclp.candidates.initial_centres)
and never moved: they depend on no one's data, so no value about them is ever released. (Before
this design they were moved by federated k-means, whose exact per-round sums differed by the rows
that changed centre, so a single row could be read off two consecutive rounds.) The set-up then
pools one verifiable masked sum, the probe table (uint64[probes, C]: rows having each centre among
their first p probes), from which every side picks the same probes per row and the same public
budgets (`candidates.choose_probes`), and each party sends the coordinator its rows' probes.
"""

from __future__ import annotations

PROBE_TABLE_STEP = "probe_table"  # uint64[probes, C]: rows having each centre among their first p probes
PROBES_STEP = "probes"  # a party's first p probes per row, uint16[n_j, p], to the coordinator


def table_shape(centres: int, probes: int) -> tuple[int, int]:
    """uint64 shape of the probe table: [probes, C]."""
    return probes, centres
