"""What this party has released about each of its data sets: the ledger (issue 46, docs/privacy.md).

A coordinator that can rerun a job under another job id, another type or one changed parameter
gets the same function of the same data released among another set of parties, and the
difference of the two sums is the parties left out; one that reruns a DP job many times averages
its noise away. So a party accounts every release against its *data*, not against the job that
asked for it, as DP libraries keep one budget per data set (OpenDP, Tumult):

- **Exact releases.** Every masked sum without noise names the functions of the data it releases
  (`Release`: a 32-byte descriptor that each job type defines, e.g. the moments of column
  'age', FlyNN's counts under one hashing seed, a training update at one model digest, XCLP's row
  sums under one influence block). A later exact release of the same function among any other set
  of parties is refused before the party masks anything, whatever the job, type or run.
- **DP releases** draw on one budget per data set (`Budget`, `--privacy-budget`). A job whose
  guarantee would take the data set past it is refused before Join, with the numbers. Each charge
  keeps its mechanism's Rényi-DP curve where one is known (every mechanism here: the Skellam
  releases' from their noise, pure ε-DP ones' as ε²/2-zCDP), and the data set's charges compose
  by adding the curves and converting the sum at the budget's δ (`xclp.privacy.accounting`), or by basic
  composition (ε and δ add up) where that is tighter (a few releases) or a charge has no curve yet
  (a Skellam release whose noise depends on the run is charged at its (ε, δ) before Join and gets
  its curve once the party has planned the noise).
- **Randomised responses** (XCLP's label-DP) are drawn once per data set and ε and reused by every
  later run, sealed at rest (AES-256-GCM under a key derived from the party's identity key): a
  rerun reveals nothing new and spends nothing new.

The ledger is `ledger.json` in the party's state directory, written atomically with mode 0600
and under a file lock (an agent's runs, or two `xclp-client run` on one state directory, share it).
It holds digests, party ids, job and run ids, column names and guarantees: never a value of the
data. A ledger that cannot be read is refused with the path and the way out, never silently reset.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import math
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from xclp.crypto import aead
from xclp.crypto.kdf import hkdf_sha256
from xclp.data.party_table import PartyData
from xclp.errors import ConfigError, PolicyRefused
from xclp.privacy.accounting import ORDERS, composed_epsilon, pure_rdp
from xclp.runtime import write_atomic

LEDGER_FILE = "ledger.json"
LEGACY_FILE = "releases.json"  # the release log of earlier versions
RESPONSES_DIR = "responses"
VERSION = 1
_LOCK = threading.Lock()  # the runs of one process; the file lock covers other processes


class LedgerCorrupt(ConfigError):
    """The ledger cannot be read: refused, never reset (it is what guards the data's releases)."""


@dataclass(frozen=True)
class Budget:
    """The most a data set may spend in all, over every DP release of every run."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigError(f"a privacy budget's epsilon must be > 0, got {self.epsilon!r}")
        if not 0 <= self.delta < 1:
            raise ConfigError(f"a privacy budget's delta must be in [0, 1), got {self.delta!r}")

    @classmethod
    def parse(cls, text: str | float | Sequence[float]) -> Budget:
        """"EPS" or "EPS,DELTA" (the flag), a number, or [EPS, DELTA] (TOML)."""
        if isinstance(text, bool):
            raise ConfigError(f"--privacy-budget takes EPS or EPS,DELTA (e.g. 10 or 10,1e-5), got {text!r}")
        if isinstance(text, (int, float)):
            return cls(float(text), DEFAULT_BUDGET.delta)
        parts: list[Any] = text.split(",") if isinstance(text, str) else list(text)
        try:
            values = [float(p) for p in parts]
        except (TypeError, ValueError):
            raise ConfigError(f"--privacy-budget takes EPS or EPS,DELTA (e.g. 10 or 10,1e-5), got {text!r}") from None
        if len(values) not in (1, 2):
            raise ConfigError(f"--privacy-budget takes EPS or EPS,DELTA (e.g. 10 or 10,1e-5), got {text!r}")
        return cls(values[0], values[1] if len(values) == 2 else DEFAULT_BUDGET.delta)


# docs/privacy.md says why: ε = 10 over a data set's lifetime keeps the odds any one row changes
# what an observer believes below e^10 in the worst case, and is the order of the largest
# deployed budgets (the 2020 US Census's person file spent ε ≈ 17 on a whole country); δ = 10⁻⁵
# stays below 1/n for tables up to 100 000 rows
DEFAULT_BUDGET = Budget(10.0, 1e-5)


@dataclass(frozen=True)
class Release:
    """One function of a data set that an exact sum releases: its descriptor and what to call it
    (a column name at most, never a value)."""

    function: bytes
    what: str


def function_id(kind: str, *parts: bytes | str) -> bytes:
    """A release's descriptor: SHA-256 over its kind and what defines the function."""
    h = hashlib.sha256(b"xclp/ledger/function/v1")
    for part in (kind, *parts):
        raw = part.encode() if isinstance(part, str) else part
        h.update(len(raw).to_bytes(8, "big") + raw)
    return h.digest()


@dataclass(frozen=True)
class Spend:
    """A DP release's guarantee, charged once under `key` (a run's releases, or the randomised
    responses of one ε, which every later run reuses), with its RDP curve where known."""

    epsilon: float
    delta: float
    key: str
    what: str
    kind: str = ""
    rdp: tuple[float, ...] | None = None

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"epsilon": self.epsilon, "delta": self.delta, "what": self.what}
        if self.rdp is not None:
            out["rdp"] = list(self.rdp)
        return out


def _curve(charge: dict[str, Any]) -> list[float] | None:
    curve = charge.get("rdp")
    return curve if isinstance(curve, list) and len(curve) == len(ORDERS) else None


def _spent(charges: Iterable[dict[str, Any]], delta: float) -> tuple[float, float, str]:
    """(ε, δ, how) of a data set's charges within a budget of δ = `delta`: basic composition (ε and δ
    add up), or the charges with an RDP curve composed and converted at what the others leave of
    `delta`, plus the others' ε, whichever gives the smaller ε within `delta`."""
    charges = list(charges)
    eps, total_delta = math.fsum(c["epsilon"] for c in charges), math.fsum(c["delta"] for c in charges)
    curved = [curve for curve in map(_curve, charges) if curve is not None]
    rest = [c for c in charges if _curve(c) is None]
    rest_eps, rest_delta = math.fsum(c["epsilon"] for c in rest), math.fsum(c["delta"] for c in rest)
    if not curved or rest_delta >= delta:
        return eps, total_delta, "basic"
    rdp_eps = composed_epsilon(curved, delta - rest_delta) + rest_eps
    if total_delta <= delta and eps <= rdp_eps:
        return eps, total_delta, "basic"
    return rdp_eps, delta, "rdp"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Ledger:
    def __init__(self, directory: Path, *, budget: Budget = DEFAULT_BUDGET, allow_rerun: bool = False,
                 identity: Ed25519PrivateKey | None = None) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LEDGER_FILE
        self.budget = budget
        self.allow_rerun = allow_rerun
        self._identity = identity

    def legacy_notice(self) -> str:
        """What to tell the user when the release log of earlier versions sits beside a ledger that
        has not started yet (its entries, keyed on whole job definitions, cannot be carried over)."""
        legacy = self.directory / LEGACY_FILE
        if legacy.exists() and not self.path.exists():
            return (f"{legacy} (the release log of xclp before the privacy ledger) is not read: the ledger in "
                    f"{self.path} starts empty, so the sums that log recorded are no longer guarded against a "
                    "rerun among other parties (docs/privacy.md)")
        return ""

    # --- the file -------------------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"version": VERSION, "datasets": {}}
        except (OSError, ValueError) as exc:
            raise LedgerCorrupt(f"the privacy ledger {self.path} cannot be read ({exc}). It records what this party "
                                "released about its data; it is not reset silently. Restore it from a backup, or "
                                "move it away to start afresh, knowing that this forgets every release") from None
        if (not isinstance(raw, dict) or raw.get("version") != VERSION or not isinstance(raw.get("datasets"), dict)
                or not all(isinstance(d, dict) for d in raw["datasets"].values())):
            raise LedgerCorrupt(f"the privacy ledger {self.path} is not a version {VERSION} ledger. Restore it from a "
                                "backup, or move it away to start afresh, knowing that this forgets every release")
        return raw

    @contextlib.contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        """The ledger to change, under the locks; written back atomically (mode 0600) on success."""
        with _LOCK:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / f".{LEDGER_FILE}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                doc = self.load()
                yield doc
                write_atomic(self.path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())

    def _read(self) -> dict[str, Any]:
        with _LOCK:
            return self.load()

    @staticmethod
    def _dataset(doc: dict[str, Any], data: bytes) -> dict[str, Any]:
        entry = doc["datasets"].setdefault(data.hex(), {})
        entry.setdefault("exact", {})
        entry.setdefault("dp", {})
        return entry

    # --- exact releases ---------------------------------------------------------------------------

    def check_exact(self, data: bytes, releases: Sequence[Release], members: Iterable[str]) -> None:
        """Refuse (PolicyRefused) an exact release of a function of `data` already released among
        another set of parties, in whatever job or run."""
        if self.allow_rerun:
            return
        mine = sorted(members)
        exact = self._read()["datasets"].get(data.hex(), {}).get("exact", {})
        for release in releases:
            before = exact.get(release.function.hex())
            if before is not None and sorted(before["parties"]) != mine:
                raise PolicyRefused(
                    f"this party released {release.what} of this data exactly among {', '.join(before['parties'])} "
                    f"(job {before['job']!r}, run {before['run']}); releasing it again among {', '.join(mine)} "
                    "would let the coordinator difference the two sums into the parties between, whatever job "
                    "asks: not taking part (--allow-rerun to take part anyway; `xclp-client ledger`)")

    def record_exact(self, data: bytes, releases: Sequence[Release], members: Iterable[str], job: str,
                     run: str) -> None:
        """Before the release: the functions and the set (kept from the first release of each)."""
        with self._changing() as doc:
            exact = self._dataset(doc, data)["exact"]
            for release in releases:
                exact.setdefault(release.function.hex(), {"what": release.what, "parties": sorted(members),
                                                          "job": job, "run": run, "at": _now()})

    # --- the DP budget ------------------------------------------------------------------------------

    def _charges(self, data: bytes) -> dict[str, Any]:
        return dict(self._read()["datasets"].get(data.hex(), {}).get("dp", {}))

    def spent(self, data: bytes) -> tuple[float, float]:
        """(ε, δ) the data set has spent (`_spent`: RDP across its charges where tighter)."""
        eps, delta, _ = _spent(self._charges(data).values(), self.budget.delta)
        return eps, delta

    def standing(self, data: bytes) -> dict[str, Any]:
        """What the data set has spent and has left of the budget: {"spent": {ε, δ}, "left": {ε, δ},
        "composition": "rdp" or "basic"}."""
        return self._standing(*_spent(self._charges(data).values(), self.budget.delta))

    def _standing(self, eps: float, delta: float, how: str) -> dict[str, Any]:
        return {"spent": {"epsilon": eps, "delta": delta},
                "left": {"epsilon": max(0.0, self.budget.epsilon - eps), "delta": max(0.0, self.budget.delta - delta)},
                "composition": how}

    def check_budget(self, data: bytes, spends: Sequence[Spend], job: str) -> None:
        """Before Join: refuse (PolicyRefused) a job whose DP releases would take `data` past the budget.
        A charge already made (randomised responses reused) costs nothing again."""
        charges = self._charges(data)
        eps, delta, _ = _spent(charges.values(), self.budget.delta)
        new = [s for s in spends if s.key not in charges]
        after, after_delta, how = _spent([*charges.values(), *(s.record() for s in new)], self.budget.delta)
        if after > self.budget.epsilon + 1e-12 or after_delta > self.budget.delta + 1e-15:
            need_eps, need_delta = sum(s.epsilon for s in new), sum(s.delta for s in new)
            raise PolicyRefused(
                f"job {job!r} would spend ε = {need_eps:g}, δ = {need_delta:g} of this data set's privacy budget; it "
                f"has spent ε = {eps:g}, δ = {delta:g} of ε = {self.budget.epsilon:g}, δ = {self.budget.delta:g} "
                f"(left: ε = {max(0.0, self.budget.epsilon - eps):g}), and with this job it would have spent ε = "
                f"{after:g} ({'RDP' if how == 'rdp' else 'basic'} composition): not joining (--privacy-budget; "
                "`xclp-client ledger show`)")

    def charge(self, data: bytes, spend: Spend, job: str, run: str) -> None:
        """Charge `spend` once (by its key), before the release it pays for."""
        with self._changing() as doc:
            self._dataset(doc, data)["dp"].setdefault(spend.key, {**spend.record(), "job": job, "run": run,
                                                                 "at": _now()})

    def attach_curve(self, data: bytes, key: str, curve: Sequence[float]) -> None:
        """The RDP curve of a charge made without one (its noise was planned after the charge)."""
        if len(curve) != len(ORDERS):
            raise ValueError(f"an RDP curve has {len(ORDERS)} values, got {len(curve)}")
        with self._changing() as doc:
            charge = self._dataset(doc, data)["dp"].get(key)
            if charge is not None and _curve(charge) is None:
                charge["rdp"] = [float(v) for v in curve]

    # --- randomised responses -------------------------------------------------------------------------

    def responses(self, data: bytes, name: str, draw: Callable[[], np.ndarray]) -> np.ndarray:
        """The randomised responses `name` of `data`: drawn by `draw` the first time, sealed at rest,
        the same array every later time."""
        if self._identity is None:
            raise ConfigError("randomised responses are kept sealed under the party's identity key, which the "
                              "ledger was not given")
        path = self.directory / RESPONSES_DIR / f"{data.hex()[:32]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
        aad = b"xclp/ledger/responses\x00" + data + name.encode()
        with _LOCK:
            if path.exists():
                try:
                    raw = aead.open_sealed(self._seal_key(), path.read_bytes(), aad=aad)
                except Exception as exc:
                    raise LedgerCorrupt(f"the sealed randomised responses {path} cannot be opened with this party's "
                                        f"identity key ({type(exc).__name__}); they are not drawn again (a second "
                                        "draw would let reruns be averaged): restore the file, or forget the data "
                                        "set with `xclp-client ledger forget`") from None
                return np.frombuffer(raw, dtype="<i8").astype(np.int64)
            values = np.ascontiguousarray(draw(), dtype="<i8")
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, aead.seal(self._seal_key(), values.tobytes(), aad=aad))
            return values.astype(np.int64)

    def _seal_key(self) -> bytes:
        assert self._identity is not None
        raw = self._identity.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return hkdf_sha256(raw, salt=b"xclp/ledger", info=b"xclp/ledger/responses/v1")

    # --- the operator's view ------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Per data set: its exact releases, its DP charges, what is spent and left (`ledger show`)."""
        doc = self._read()
        out = {}
        for data, entry in sorted(doc["datasets"].items()):
            charges = entry.get("dp", {})
            out[data] = {"exact": sorted(entry.get("exact", {}).values(), key=lambda e: e["at"]),
                         "dp": sorted(({k: v for k, v in c.items() if k != "rdp"} for c in charges.values()),
                                      key=lambda c: c["at"]),
                         **self._standing(*_spent(charges.values(), self.budget.delta))}
        return out

    def forget(self, data: str | None) -> list[str]:
        """Forget one data set (a digest or a prefix of one) or all; returns the digests forgotten."""
        with self._changing() as doc:
            gone = [d for d in doc["datasets"] if data is None or d.startswith(data)]
            if data is not None and len(gone) != 1:
                raise ConfigError(f"{'no' if not gone else 'more than one'} data set in {self.path} starts with "
                                  f"{data!r}" + ("" if not gone else f": {', '.join(gone)}"))
            for d in gone:
                del doc["datasets"][d]
        for d in gone:
            for path in (self.directory / RESPONSES_DIR).glob(f"{d[:32]}-*"):
                path.unlink()
        return gone


def data_digest(data: PartyData) -> bytes:
    """A data set's name in the ledger: SHA-256 of the table as the party reads it (features,
    labels and row ids), or the data set it names (`dataset_digest`, see there)."""
    if data.dataset_digest is not None:
        return data.dataset_digest
    h = hashlib.sha256(b"xclp/data/v1")
    X = np.ascontiguousarray(data.X, dtype=np.float64)
    h.update(repr(X.shape).encode() + X.tobytes())
    if data.y is not None:
        h.update(np.ascontiguousarray(data.y, dtype=np.int64).tobytes())
    h.update("\n".join(data.ids).encode())
    return h.digest()


def default_directory() -> Path:
    """$XDG_STATE_HOME/xclp (default ~/.local/state/xclp)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "xclp"


@dataclass
class RunAccount:
    """One run's account in the ledger: the data set it reads, the job and run it charges, and the
    DP spends the job declared (charged, all at once, before its first release)."""

    ledger: Ledger
    data: bytes
    job: str
    run: str
    spends: tuple[Spend, ...] = ()
    charged: bool = False  # once per run: a training job's every round would rewrite the ledger
    curves: dict[str, tuple[float, ...]] = field(default_factory=dict)  # kind -> RDP curve, once planned

    def check_exact(self, releases: Sequence[Release], members: Iterable[str]) -> None:
        self.ledger.check_exact(self.data, releases, members)

    def record_exact(self, releases: Sequence[Release], members: Iterable[str]) -> None:
        self.ledger.record_exact(self.data, releases, members, self.job, self.run)

    def charge(self) -> None:
        if self.charged:
            return
        for spend in self.spends:
            curve = self.curves.get(spend.kind)
            self.ledger.charge(self.data, spend if curve is None else replace(spend, rdp=curve), self.job, self.run)
        self.charged = True

    def mechanism(self, kind: str, curve: Sequence[float]) -> None:
        """The RDP curve of the job's `kind` of DP release (dp_releases), once its noise is planned:
        later runs compose it by RDP rather than by its (ε, δ)."""
        self.curves[kind] = tuple(float(v) for v in curve)
        if self.charged:
            for spend in self.spends:
                if spend.kind == kind:
                    self.ledger.attach_curve(self.data, spend.key, self.curves[kind])

    def responses(self, name: str, draw: Callable[[], np.ndarray]) -> np.ndarray:
        return self.ledger.responses(self.data, name, draw)


_KINDS = {"moments": "the DP moments", "release": "the job's DP releases", "labels": "label-DP row sums",
          "responses": "randomised responses of the labels"}


def responses_name(epsilon: float, n_classes: int, hide_unlabeled: bool) -> str:
    """The randomised responses one ε draws (and the ledger's charge for them): per data set, the
    same for every run that asks for them."""
    return f"responses:epsilon={epsilon!r}:classes={n_classes}:hide_unlabeled={hide_unlabeled}"


def job_spends(params: Any, dim: int) -> tuple[Spend, ...]:
    """The charges of a job's DP releases (JobParams.dp_releases) in one run, for a table of `dim`
    feature columns. Each run's key is drawn by the party (a coordinator that reused a job id, run
    id or nonce would otherwise get a second run charged as the first); randomised responses are
    keyed by what draws them. The RDP curves known before Join go with them: a pure ε-DP
    release's, and the DP moments' (their noise depends on the table's width only); a training
    job's and label-DP's are attached once the run has planned their noise (RunAccount.mechanism)."""
    run = secrets.token_hex(16)
    out = []
    for kind, epsilon, delta in params.dp_releases:
        key = (responses_name(epsilon, params.n_classes, params.hide_label_mask) if kind == "responses"
               else f"run:{run}:{kind}")
        curve = (pure_rdp(epsilon) if delta == 0 else params.moments_plan(dim).rdp if kind == "moments" else None)
        out.append(Spend(epsilon, delta, key, _KINDS[kind], kind, curve))
    return tuple(out)
