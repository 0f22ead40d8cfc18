"""Step and message names of the phases every job runs before its own (docs/design.md §4.3, §8), and the
mask purposes they key.

Both ends import these; nothing here is copied anywhere else. A *step* is something the
coordinator starts (`StepStart`) and parties contribute to; a *message* is a payload the
coordinator sends on its own (sender ""). Mask purposes go into every HKDF info string
(`xclp.crypto.kdf`), so one purpose's keys never serve another. Each job type's own names live
in its contract module (xclp.v1.allreduce, xclp.v1.xclp, xclp.v1.training, xclp.v1.fedavg, xclp.v1.dbcl).
"""

from __future__ import annotations

# Every job (docs/design.md §4.3): the leader relays the sealed common seed, every party acknowledges.
SEED_STEP = "seed"
# a party's progress report during long local work, at any time after Join (server/liveness.py):
# a line of UTF-8 text saying what it is doing
ALIVE_MSG = "alive"
ALIVE_MAX_BYTES = 256
# the other way: the capability (JoinRequest.capabilities) of a party that understands the
# coordinator's RunAlive items, sent to it while a run goes on (server/liveness.py)
RUN_ALIVE = "run-alive"
# A party whose connection is lost mid-run comes back on a new Pull stream (PullRequest.resume)
# within the job's reconnect_seconds; a party that stops on its own says so first (a `leave`
# message: a line of UTF-8 text, why), and is dropped at once. The capability of a party that does both.
RESUMES = "resumes"
LEAVE_MSG = "leave"
SEED_RELAY_MAX_BYTES = 1024  # a sealed 32-byte seed is 60 bytes; both ends bound the seed step by this
SEED_BYTES = 32
SEED_PURPOSE = SEED_STEP

# Data preparation before any job's first step (docs/design.md §8): masked (n, Σx, Σx²) per feature.
MOMENTS_STEP = "moments"
MOMENTS_PURPOSE = MOMENTS_STEP
MOMENTS_RESULT_MSG = "moments_result"
