"""Step and message names on the wire, and the mask purposes they key (DESIGN §4-§6).

Both ends import these; nothing here is copied anywhere else. A *step* is something the
coordinator starts (`StepStart`) and parties contribute to; a *message* is a payload the
coordinator sends on its own (sender ""). Mask purposes go into every HKDF info string
(`xclp.crypto.kdf`), so one purpose's keys never serve another.
"""

from __future__ import annotations

# Every job (DESIGN §4.3): the leader relays the sealed common seed, every party acknowledges.
SEED_STEP = "seed"
SEED_BYTES = 32

# Data preparation before any job's first step (DESIGN §8): masked (n, Σx, Σx²) per feature.
MOMENTS_STEP = "moments"
MOMENTS_RESULT_MSG = "moments_result"

# Masked all-reduce jobs, FlyNN and RACE (DESIGN §6).
SUM_STEP = "sum"
RESULT_MSG = "result"

# XCLP (DESIGN §5), in the order they happen.
LAYOUT_MSG = "layout"
PAIRS_MSG = "pairs"
INTRA_STEP = "intra_hamming"
HAMMING_STEP = "secure_hamming"
LABELS_STEP = "labeled_sets"
GRAPH_MSG = "graph"
INFLUENCE_MSG = "influence"
ROWSUMS_STEP = "rowsums"
ROWSUMS_RESULT_MSG = "rowsums_result"

# Pairwise-mask purposes (HKDF info, DESIGN §4.2).
SEED_PURPOSE = SEED_STEP
SUM_PURPOSE = SUM_STEP
ROWSUMS_PURPOSE = ROWSUMS_STEP
MOMENTS_PURPOSE = MOMENTS_STEP
