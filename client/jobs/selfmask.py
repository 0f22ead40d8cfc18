"""A party's self masks for one masked step, and the rules it keeps before revealing one (DESIGN §6.1).

- every round of the step gets a fresh 32-byte seed b (OS CSPRNG), added as PRG(b) to what it sends;
- it reveals b only for the latest round it masked, only if the coordinator names exactly that
  round's participant set (all of them contributed), and only once;
- after revealing it takes part in no later round of the step.
So an active coordinator can unmask one round of a step, never two: claiming a dropout after a
complete round gets it a second masked sum it can never open, or the first one, not both.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import numpy as np

from xclp.errors import ProtocolError
from xclp.v1.double_masking import SEED_BYTES, pack_reveal, round_digest, self_mask


@dataclass
class SelfMasks:
    step: str
    session_id: bytes
    rounds: dict[int, tuple[bytes, tuple[str, ...]]] = field(default_factory=dict)  # round -> (seed, members)
    revealed: bool = False

    def add(self, values: np.ndarray, round: int, members: list[str] | tuple[str, ...]) -> np.ndarray:
        """values + PRG(b) in the ring of values.dtype, with a fresh b for (round, members)."""
        if self.revealed:
            raise ProtocolError(f"step {self.step!r} round {round} started after this party revealed its self "
                                "mask for the step: only one round of a step is ever unmasked")
        if round in self.rounds:
            raise ProtocolError(f"step {self.step!r} round {round} started twice")
        seed = secrets.token_bytes(SEED_BYTES)
        self.rounds[round] = (seed, tuple(sorted(members)))
        return values + self_mask(seed, values.shape, values.dtype)  # wraps in the ring

    def reveal(self, round: int, members: list[str] | tuple[str, ...]) -> bytes:
        """digest ‖ b for the coordinator, if the rules allow it (else ProtocolError)."""
        if self.revealed:
            raise ProtocolError(f"the coordinator asked twice for this party's self mask of step {self.step!r}")
        if round not in self.rounds:
            raise ProtocolError(f"the coordinator asked for the self mask of step {self.step!r} round {round}, "
                                "which this party never masked")
        if round != max(self.rounds):
            raise ProtocolError(f"the coordinator asked for the self mask of step {self.step!r} round {round}, "
                                f"abandoned for round {max(self.rounds)}")
        seed, mine = self.rounds[round]
        if tuple(sorted(members)) != mine:
            raise ProtocolError(f"the coordinator reports step {self.step!r} round {round} complete for "
                                f"{sorted(members)}, but the round was among {list(mine)}")
        self.revealed = True
        return pack_reveal(round_digest(self.session_id, self.step, round, mine), seed)
