"""What this party released, remembered across runs (DESIGN §2.8): no differencing across runs.

A sum without noise is exact: two runs of one job on the same data, the first among {a, b, c, d}
and the second among {a, b, c}, give a coordinator d's exact counts, means and variances as their
difference. So a party records, per job definition (the spec without its run nonce), data set (a
digest of the table it read) and sum, the participant set it revealed its self mask for, and
refuses a later run of the same definition on the same data whose sum has another set.

Remembered: the exact sums (the preparation's moments, FlyNN and RACE without DP). Not
remembered: DP releases (their noise is the defence), training rounds (their sets and models
differ from run to run by the common seed), XCLP's row sums (no aggregate reaches the coordinator).

The log is a JSON file (the agent's `state` directory, `xclp-client run --state`), written
atomically; only digests and party ids are in it, never data. `allow_rerun` (`--allow-rerun`,
the agent's `allow_rerun = true`) turns the refusal off, for those who accept the difference.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from xclp.errors import ConfigError, ProtocolError
from xclp.party_table import PartyData
from xclp.runtime import write_atomic

FILE_NAME = "releases.json"
_LOCK = threading.Lock()  # an agent's runs share one log


def default_path() -> Path:
    """$XDG_STATE_HOME/xclp/releases.json (default ~/.local/state/xclp/releases.json)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "xclp" / FILE_NAME


def data_digest(data: PartyData) -> bytes:
    """SHA-256 of the table as read: features, labels and row ids."""
    h = hashlib.sha256(b"xclp/data/v1")
    X = np.ascontiguousarray(data.X, dtype=np.float64)
    h.update(repr(X.shape).encode() + X.tobytes())
    if data.y is not None:
        h.update(np.ascontiguousarray(data.y, dtype=np.int64).tobytes())
    h.update("\n".join(data.ids).encode())
    return h.digest()


class ReleaseLog:
    def __init__(self, path: Path, *, allow_rerun: bool = False) -> None:
        self.path = path
        self.allow_rerun = allow_rerun

    def _load(self) -> dict[str, list[str]]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"the release log {self.path} is unreadable ({exc}); move it away to start afresh, "
                              "knowing it guards against differencing across runs") from None
        if not isinstance(raw, dict) or not all(isinstance(v, list) for v in raw.values()):
            raise ConfigError(f"the release log {self.path} is not a JSON object of party lists")
        return raw

    def check(self, key: bytes, members: Iterable[str], what: str) -> None:
        """Refuse (ProtocolError) a sum among `members` when this key was released to another set."""
        with _LOCK:
            before = self._load().get(key.hex())
        mine = sorted(members)
        if before is not None and before != mine and not self.allow_rerun:
            raise ProtocolError(f"this party released {what} of this job on this data among {', '.join(before)}; a "
                                f"run among {', '.join(mine)} would let the coordinator difference the two sums "
                                "(DESIGN §2.8): not taking part (--allow-rerun to take part anyway)")

    def record(self, key: bytes, members: Iterable[str]) -> None:
        with _LOCK:
            log = self._load()
            log.setdefault(key.hex(), sorted(members))
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, (json.dumps(log, indent=1, sort_keys=True) + "\n").encode())


def release_id(definition: bytes, data: bytes) -> bytes:
    """One job definition (the canonical spec, xclp.v1.spec) on one data set (`data_digest`)."""
    return hashlib.sha256(b"xclp/release/v1\0" + hashlib.sha256(definition).digest() + data).digest()


def release_key(release: bytes, sum_name: str) -> bytes:
    return hashlib.sha256(release + sum_name.encode()).digest()
