"""What this party has released about each of its data sets: the ledger (docs/privacy.md,
docs/threat-model.md, "Every release is accounted against the data").

A coordinator that can rerun a job under another job id, another type or one changed parameter
gets the same data released among another set of parties, and the difference of the two sums is
the parties left out; one that reruns a DP job many times averages its noise away. So a party
accounts every release against its *data*, as DP libraries keep one budget per data set (OpenDP,
Tumult), and names both the data and the release from what it holds, never from what a job says:

- **The data set** is the table as read, before any job's `classes`, categorical encoding,
  standardisation or imputation (xclp.data.identity): every job on it charges the one data set.
- **Exact releases of a data set happen among one party set.** The first exact release fixes the
  set S; every later one — any function, job, type, setting, round or run — must be among exactly
  S, or the party refuses before masking (`reserve_exact`). "The same function" cannot be decided
  from descriptors (a full batch is the same update at any larger batch size, an update is linear
  in the learning rate, a model chain can be replayed), and two sums over one set never isolate a
  party. The reservation is made, under the ledger's lock, before the first masked value leaves
  the party, and kept if the run ends before its reveal; a sum whose set shrank (a dropout) before
  anything of its run opened takes the smaller set, since the attempt it left is dead to it.
  Moving a data set to another set is the institution's explicit choice (`move`).
- **DP releases** draw on one budget per data set (`Budget`, `--privacy-budget`), checked before
  Join and charged, checked again under the lock, before the first masked push. A data set once
  refused for its budget declines every later DP offer alike, so that offers near the limit cannot
  locate what it spent. Each charge keeps its mechanism's Rényi-DP curve where one is known (the
  Skellam releases' from their noise, pure ε-DP ones' as ε²/2-zCDP), and the data set's charges
  compose by adding the curves and converting the sum at the budget's δ
  (`xclp.privacy.accounting`), or by basic composition where that is tighter or a charge has no
  curve yet.
- **Randomised responses** (XCLP's label-DP) are drawn once per row of a data set, kept in raw
  label values and reused by every job whatever its ε or `classes` (client/responses.py).

The ledger is `ledger.json` in the party's state directory, written atomically with mode 0600
and under a file lock (an agent's runs, or two `xclp-client run` on one state directory, share it).
It holds digests, party ids, job and run ids, column names and guarantees: never a value of the
data. A ledger that cannot be read is refused with the path and the way out, never silently reset;
one of the previous format is migrated (client/ledger_v1.py).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from xclp.client.budget import DEFAULT_BUDGET, Budget, Spend, curve_of
from xclp.client.budget import spent as spent_of
from xclp.crypto import aead
from xclp.crypto.kdf import hkdf_sha256
from xclp.data.identity import data_set_digest
from xclp.errors import ConfigError, PolicyRefused
from xclp.privacy.accounting import ORDERS
from xclp.runtime import write_atomic

__all__ = ["DEFAULT_BUDGET", "Budget", "Ledger", "LedgerCorrupt", "Release", "RunAccount", "Spend", "data_digest",
           "function_id"]

LEDGER_FILE = "ledger.json"
RESPONSES_DIR = "responses"
VERSION = 2
_LOCK = threading.Lock()  # the runs of one process; the file lock covers other processes


class LedgerCorrupt(ConfigError):
    """The ledger cannot be read: refused, never reset (it is what guards the data's releases)."""


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

    # --- the file -------------------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        """The ledger as a version 2 document (one of version 1 migrated: client/ledger_v1.py)."""
        from xclp.client import ledger_v1

        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"version": VERSION, "datasets": {}}
        except (OSError, ValueError) as exc:
            raise LedgerCorrupt(f"the privacy ledger {self.path} cannot be read ({exc}). It records what this party "
                                "released about its data; it is not reset silently. Restore it from a backup, or "
                                "move it away to start afresh, knowing that this forgets every release") from None
        if isinstance(raw, dict) and raw.get("version") == ledger_v1.VERSION:
            raw = ledger_v1.upgrade(raw)
        if (not isinstance(raw, dict) or raw.get("version") != VERSION or not isinstance(raw.get("datasets"), dict)
                or not all(isinstance(d, dict) for d in raw["datasets"].values())
                or not isinstance(raw.get("legacy", {}), dict)):
            raise LedgerCorrupt(f"the privacy ledger {self.path} is not a version {VERSION} ledger (nor one of version "
                                f"{ledger_v1.VERSION}, which is migrated). Restore it from a backup, or move it away "
                                "to start afresh, knowing that this forgets every release")
        return raw

    @contextlib.contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        """The ledger to change, under the locks; written back atomically (mode 0600) if it changed."""
        with _LOCK:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / f".{LEDGER_FILE}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                doc = self.load()
                before = json.dumps(doc, sort_keys=True)
                yield doc
                if json.dumps(doc, sort_keys=True) != before or not self.path.exists():
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

    def adopt_legacy(self, data: bytes, legacy: bytes) -> bool:
        """Carry the entry a version 1 ledger kept under `legacy` (the digest it took of this table as
        one job prepared it: client/ledger_v1.py) over to the data set `data`; True if there was one."""
        from xclp.client import ledger_v1

        if legacy.hex() not in self._read().get("legacy", {}):
            return False
        with self._changing() as doc:
            old = doc.get("legacy", {}).pop(legacy.hex(), None)
            if old is not None:
                ledger_v1.merge(self._dataset(doc, data), old)
            if not doc.get("legacy"):
                doc.pop("legacy", None)
        return True

    # --- exact releases: one set of parties per data set ---------------------------------------------

    def reserve_exact(self, data: bytes, releases: Sequence[Release], members: Iterable[str], job: str, run: str,
                      *, shrunk: bool = False) -> None:
        """Before the first masked value of an exact release leaves the party: refuse (PolicyRefused) a
        set of parties other than the one this data set released exactly among, else record the
        release under the run. `shrunk`: the party left an earlier attempt of this very sum among
        more parties (a dropout): if nothing of its run has opened and no other run holds the data
        set's set, the smaller set becomes the data set's."""
        mine = sorted(set(members))
        with self._changing() as doc:
            entry = self._dataset(doc, data)
            among, runs = entry.get("among"), entry["exact"]
            this = runs.get(run)
            if among is not None and among["parties"] != mine and not self.allow_rerun:
                others = [k for k, r in runs.items() if k != run and not r.get("retired")]
                if not (shrunk and this is not None and not this.get("opened") and not others
                        and set(mine) < set(among["parties"])):
                    raise PolicyRefused(self._refusal(entry, mine, data))
                among = None
            if among is None:
                entry["among"] = {"parties": mine, "job": job, "run": run, "at": _now()}
            if this is None:
                this = runs[run] = {"job": job, "run": run, "parties": mine, "what": [], "at": _now()}
            if not self.allow_rerun:
                this["parties"] = mine
            for release in releases:
                if release.what not in this["what"]:
                    if len(this["what"]) < MAX_WHATS:
                        this["what"].append(release.what)
                    else:
                        this["more"] = True

    def _refusal(self, entry: dict[str, Any], mine: list[str], data: bytes) -> str:
        among = entry["among"]
        first = entry["exact"].get(among["run"], {})
        what = "; ".join(first.get("what", [])[:2]) or "an exact release"
        return (f"this party released this data set exactly among {', '.join(among['parties'])} (job "
                f"{among['job']!r}, run {among['run']}: {what}); every exact release of a data set is among that one "
                f"set of parties, whatever the job, type, setting, round or run, since two sums over different sets "
                f"difference into the parties between: not releasing it among {', '.join(mine)} (`xclp-client "
                f"ledger move {data.hex()[:16]} --to PARTIES` moves the data set to another set on purpose; DP "
                "releases are not bound; --allow-rerun takes part anyway; docs/privacy.md)")

    def opened(self, data: bytes, run: str) -> None:
        """The run revealed a sum: from now on a dropout cannot hand its data set to a smaller set."""
        if self._read()["datasets"].get(data.hex(), {}).get("exact", {}).get(run, {}).get("opened"):
            return
        with self._changing() as doc:
            this = self._dataset(doc, data)["exact"].get(run)
            if this is not None:
                this["opened"] = True

    def move(self, data: str, parties: Sequence[str]) -> str:
        """The institution's explicit choice: the data set (a digest or a unique prefix) releases
        exactly among `parties` from now on; its earlier exact releases are kept, retired. Returns
        the digest moved."""
        parties = sorted({p.strip() for p in parties if p.strip()})
        if len(parties) < 2:
            raise ConfigError(f"ledger move --to names the parties of the new set (at least two), got {parties}")
        with self._changing() as doc:
            digest = self._one(doc, data)
            entry = self._dataset(doc, bytes.fromhex(digest))
            before = (entry.get("among") or {}).get("parties")
            for release in entry["exact"].values():
                release["retired"] = True
            entry["among"] = {"parties": parties, "job": "(ledger move)", "run": "-", "at": _now()}
            entry.setdefault("moves", []).append({"from": before, "to": parties, "at": _now()})
        return digest

    def reopen(self, data: str) -> str:
        """Clear a data set's budget refusal (`check_budget`): DP jobs are weighed against what is left
        again, and an operator can learn one more crossing. Returns the digest."""
        with self._changing() as doc:
            digest = self._one(doc, data)
            doc["datasets"][digest].pop("declined", None)
        return digest

    def _one(self, doc: dict[str, Any], prefix: str) -> str:
        found = [d for d in doc["datasets"] if d.startswith(prefix)]
        if len(found) != 1:
            raise ConfigError(f"{'no' if not found else 'more than one'} data set in {self.path} starts with "
                              f"{prefix!r}" + ("" if not found else f": {', '.join(found)}"))
        return found[0]

    # --- the DP budget ------------------------------------------------------------------------------

    def _charges(self, data: bytes) -> dict[str, Any]:
        return dict(self._read()["datasets"].get(data.hex(), {}).get("dp", {}))

    def spent(self, data: bytes) -> tuple[float, float]:
        """(ε, δ) the data set has spent (`_spent`: RDP across its charges where tighter)."""
        eps, delta, _ = spent_of(self._charges(data).values(), self.budget.delta)
        return eps, delta

    def standing(self, data: bytes) -> dict[str, Any]:
        """What the data set has spent and has left of the budget: {"spent": {ε, δ}, "left": {ε, δ},
        "composition": "rdp" or "basic"}."""
        return self._standing(*spent_of(self._charges(data).values(), self.budget.delta))

    def _standing(self, eps: float, delta: float, how: str) -> dict[str, Any]:
        return {"spent": {"epsilon": eps, "delta": delta},
                "left": {"epsilon": max(0.0, self.budget.epsilon - eps), "delta": max(0.0, self.budget.delta - delta)},
                "composition": how}

    def check_budget(self, data: bytes, spends: Sequence[Spend], job: str) -> None:
        """Before Join: refuse (PolicyRefused) a job whose DP releases would take `data` past the budget.
        A charge already made (randomised responses reused) costs nothing again. The first refusal
        is kept: every later job with a new DP release on the data set is refused alike (no budget
        oracle: near-identical offers cannot locate what is spent)."""
        entry = self._read()["datasets"].get(data.hex(), {})
        charges = dict(entry.get("dp", {}))
        new = [s for s in spends if s.key not in charges]
        if not new:
            return
        declined = entry.get("declined")
        if declined is not None:
            raise PolicyRefused(
                f"this data set declined job {declined['job']!r} for its privacy budget ({declined['at']}), and so "
                f"declines every later job with a DP release, {job!r} too, whatever its ε: answering each offer by "
                "what is left would let offers near the limit locate what it has spent (docs/privacy.md; "
                "`xclp-client ledger show`)")
        message = self._over(charges, new, job)
        if message:
            with self._changing() as doc:
                self._dataset(doc, data)["declined"] = {"job": job, "at": _now()}
            raise PolicyRefused(message)

    def _over(self, charges: dict[str, Any], new: Sequence[Spend], job: str) -> str:
        """Why `new` charges would take a data set's `charges` past the budget; "" if they fit."""
        eps, delta, _ = spent_of(charges.values(), self.budget.delta)
        after, after_delta, how = spent_of([*charges.values(), *(s.record() for s in new)], self.budget.delta)
        if after <= self.budget.epsilon + 1e-12 and after_delta <= self.budget.delta + 1e-15:
            return ""
        need_eps, need_delta = sum(s.epsilon for s in new), sum(s.delta for s in new)
        return (f"job {job!r} would spend ε = {need_eps:g}, δ = {need_delta:g} of this data set's privacy budget; it "
                f"has spent ε = {eps:g}, δ = {delta:g} of ε = {self.budget.epsilon:g}, δ = {self.budget.delta:g} "
                f"(left: ε = {max(0.0, self.budget.epsilon - eps):g}), and with this job it would have spent ε = "
                f"{after:g} ({'RDP' if how == 'rdp' else 'basic'} composition): not joining (--privacy-budget; "
                "`xclp-client ledger show`)")

    def charge(self, data: bytes, spends: Sequence[Spend], job: str, run: str) -> None:
        """Before the first masked push of a run: charge its spends (each once, by its key), checked
        against the budget again under the lock, with whatever other runs charged since Join."""
        with self._changing() as doc:
            charges = self._dataset(doc, data)["dp"]
            new = [s for s in spends if s.key not in charges]
            message = self._over(charges, new, job)
            if message:
                raise PolicyRefused(message.replace("not joining", "not releasing (another run charged the data set "
                                                                   "since this one joined)"))
            for spend in new:
                charges[spend.key] = {**spend.record(), "job": job, "run": run, "at": _now()}

    def attach_curve(self, data: bytes, key: str, curve: Sequence[float]) -> None:
        """The RDP curve of a charge made without one (its noise was planned after the charge)."""
        if len(curve) != len(ORDERS):
            raise ValueError(f"an RDP curve has {len(ORDERS)} values, got {len(curve)}")
        with self._changing() as doc:
            charge = self._dataset(doc, data)["dp"].get(key)
            if charge is not None and curve_of(charge) is None:
                charge["rdp"] = [float(v) for v in curve]

    # --- what is kept sealed: randomised responses (client/responses.py) ---------------------------

    def response_draw(self, data: bytes) -> dict[str, Any] | None:
        """What the data set's randomised responses were drawn with (ε, hide_unlabeled), if drawn."""
        draw = self._read()["datasets"].get(data.hex(), {}).get("responses")
        return dict(draw) if isinstance(draw, dict) else None

    def sealed(self, data: bytes, name: str, make: Callable[[], tuple[bytes, dict[str, Any]]]) -> bytes:
        """The sealed blob `name` of `data`: made by `make` (its bytes, and what the ledger entry
        records of it under `name`) the first time, sealed at rest (AES-256-GCM under a key derived
        from the party's identity key), the same bytes every later time."""
        if self._identity is None:
            raise ConfigError("randomised responses are kept sealed under the party's identity key, which the "
                              "ledger was not given")
        path = self.directory / RESPONSES_DIR / f"{data.hex()[:32]}-{name}"
        aad = b"xclp/ledger/sealed/v2\x00" + data + name.encode()
        with self._changing() as doc:
            if path.exists():
                try:
                    return aead.open_sealed(self._seal_key(), path.read_bytes(), aad=aad)
                except Exception as exc:
                    raise LedgerCorrupt(f"the sealed {path} cannot be opened with this party's identity key "
                                        f"({type(exc).__name__}); it is not made again (a second draw would let "
                                        "reruns be averaged): restore the file, or forget the data set with "
                                        "`xclp-client ledger forget`") from None
            raw, record = make()
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, aead.seal(self._seal_key(), raw, aad=aad))
            self._dataset(doc, data)[name] = {**record, "at": _now()}
            return raw

    def _seal_key(self) -> bytes:
        assert self._identity is not None
        raw = self._identity.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return hkdf_sha256(raw, salt=b"xclp/ledger", info=b"xclp/ledger/responses/v1")

    # --- the operator's view ------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Per data set: the set its exact releases are among, each run's exact releases, its DP
        charges, what is spent and left (`ledger show`)."""
        doc = self._read()
        out = {}
        for data, entry in sorted(doc["datasets"].items()):
            charges = entry.get("dp", {})
            out[data] = {"among": (entry.get("among") or {}).get("parties"),
                         "exact": sorted(entry.get("exact", {}).values(), key=lambda e: e["at"]),
                         "dp": sorted(({k: v for k, v in c.items() if k != "rdp"} for c in charges.values()),
                                      key=lambda c: c["at"]),
                         "declined": entry.get("declined"), "moves": entry.get("moves", []),
                         **self._standing(*spent_of(charges.values(), self.budget.delta))}
        return out

    def forget(self, data: str | None) -> list[str]:
        """Forget one data set (a digest or a prefix of one) or all; returns the digests forgotten."""
        with self._changing() as doc:
            gone = list(doc["datasets"]) if data is None else [self._one(doc, data)]
            for d in gone:
                del doc["datasets"][d]
        for d in gone:
            for path in (self.directory / RESPONSES_DIR).glob(f"{d[:32]}-*"):
                path.unlink()
        return gone


MAX_WHATS = 8  # a run's exact releases named in the ledger (the rest are counted by the set alone)


# A data set's name in the ledger: the table as read, before any job's preparation (xclp.data.identity)
data_digest = data_set_digest


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
    opened: bool = False  # a sum of this run was revealed (Ledger.opened)

    def reserve_exact(self, releases: Sequence[Release], members: Iterable[str], *, shrunk: bool = False) -> None:
        self.ledger.reserve_exact(self.data, releases, members, self.job, self.run, shrunk=shrunk)

    def revealing(self) -> None:
        if not self.opened:
            self.ledger.opened(self.data, self.run)
            self.opened = True

    def charge(self) -> None:
        if self.charged:
            return
        spends = [spend if (curve := self.curves.get(spend.kind)) is None else replace(spend, rdp=curve)
                  for spend in self.spends]
        self.ledger.charge(self.data, spends, self.job, self.run)
        self.charged = True

    def mechanism(self, kind: str, curve: Sequence[float]) -> None:
        """The RDP curve of the job's `kind` of DP release (dp_releases), once its noise is planned:
        later runs compose it by RDP rather than by its (ε, δ)."""
        self.curves[kind] = tuple(float(v) for v in curve)
        if self.charged:
            for spend in self.spends:
                if spend.kind == kind:
                    self.ledger.attach_curve(self.data, spend.key, self.curves[kind])
