"""What one party's run takes and gives (client/session.py runs it): its configuration, the
table as the job takes it, the stages of the session, and the result."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from xclp.client.connection import ConnectionConfig
from xclp.client.jobs.estimate import DEFAULT_MAX_WORK_MINUTES
from xclp.client.ledger import Ledger
from xclp.client.policy import PartyPolicy
from xclp.crypto import identity
from xclp.crypto.paillier import PaillierKeypair
from xclp.data.party_table import PartyData
from xclp.data.prep import Scaling
from xclp.errors import InvalidInput, NotAuthorized
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.params import JobParams
from xclp.workers import WorkerSpec

if TYPE_CHECKING:
    from xclp.client.jobs.training import RoundRecord


class PartyStage(enum.Enum):
    JOINED = "joined"
    KEYED = "keyed"
    SEEDED = "seeded"
    DONE = "done"


@dataclass(frozen=True)
class RunConfig:
    job_id: str
    party_id: str
    identity: Ed25519PrivateKey
    connection: ConnectionConfig
    join_wait_seconds: float = 60.0
    idle_seconds: float = 900.0  # give up if the coordinator sends nothing for this long
    roster_wait_seconds: float | None = None  # give up if the roster has not come this long after Join
    paillier: PaillierKeypair | None = None  # published in the key bundle; XCLP jobs need one (docs/design.md §4.1)
    paillier_bits: int = 0  # without `paillier`: a key of this size is made when a job that needs one is joined
    # The pinned allow-list (party id -> Ed25519 identity key, `--peers`): the only keys this party
    # accepts on a roster (docs/design.md §2.1). Required: without it a coordinator could swap a peer's key.
    peers: Mapping[str, bytes] | None = None
    policy: PartyPolicy = PartyPolicy()  # this party's own minimums (docs/design.md §2.3)
    workers: WorkerSpec | int | None = None  # where XCLP's Paillier work runs (xclp/workers.py)
    # XCLP size limits, checked before the work (client/jobs/estimate.py); 0 = no limit
    max_memory_bytes: int | None = None  # None: three quarters of the RAM
    max_work_seconds: float = DEFAULT_MAX_WORK_MINUTES * 60  # --max-work-minutes (0: no limit)
    run_id: str = ""  # an agent joins the run it was offered; if set, the Challenge must name it
    accepted_spec: pb.JobSpec | None = None  # an agent: the offered spec its policy accepted; the Challenge must match
    ledger: Ledger | None = None  # what this party released about its data sets (client/ledger.py); None: nowhere

    def check_identity(self) -> None:
        """This party is on its own pinned allow-list (--peers), with this identity key."""
        if not self.peers:
            raise InvalidInput("pinned peers are required: pass --peers with the job's allow-list (the operator's "
                               "allow.toml), so that no coordinator can swap a peer's key")
        pinned_self = self.peers.get(self.party_id)
        if pinned_self is None:
            raise NotAuthorized(f"party {self.party_id!r} is not on the job's allow-list (--peers): send the "
                                "operator the line `xclp-client keygen` printed")
        if pinned_self != identity.public_bytes(self.identity):
            raise NotAuthorized(f"the identity key of {self.party_id!r} differs from the one on the job's "
                                "allow-list (--peers): is --identity the right key?")


@dataclass(frozen=True)
class JobResult:
    """What the job gave this party: the decoded aggregate and what is needed to use it.

    For xclp the aggregate is this party's rows of the propagated scores Z, float64[n_j, C].
    """

    job_type: str
    params: JobParams
    dim: int  # features the model works on (after preparation)
    seed: bytes  # the job's common seed (secret from the coordinator)
    aggregate: np.ndarray
    participants: tuple[str, ...]
    scaling: Scaling | None = None  # the pooled preparation (docs/design.md §8), for predictions on new rows
    columns: tuple[str, ...] = ()  # the table's feature columns, as read
    rounds: tuple[RoundRecord, ...] = ()  # fedavg, dbcl: what this party saw of each round it took part in
    privacy: dict[str, Any] | None = None  # with DP: what its rows (privacy.dpsgd) or labels (privacy.label_dp) spent
    # xclp with sparse influence (docs/design.md §10.7): the tolerance and the share of a column's mass left out
    approximation: dict[str, Any] | None = None


def checked_table(data: PartyData, params: JobParams) -> PartyData:
    """A party's table as the job takes it, checked before joining (here and in xclp.simulation):
    rows, labels as class numbers (docs/design.md §8: names map by the declared order) in range, missing
    cells only if the job imputes, a width the job can use."""
    if data.X.shape[0] == 0:
        raise InvalidInput("the party's data has no rows")
    check_schema(data, params)
    data = data.with_classes(params.classes)
    data.check_missing(impute=params.impute == "mean")
    n_classes = params.label_classes
    if n_classes and data.y is not None:
        bad = data.y >= n_classes
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise InvalidInput(f"label {int(data.y[row])} at row {row} is out of range for a {n_classes}-class job")
    params.check_table(data.X.shape[1])
    return data


def check_schema(data: PartyData, params: JobParams) -> None:
    """InvalidInput if the table's feature columns are not the job's schema (`columns`), saying
    which are missing, which the job does not list, or that the order differs; or if its ids were
    not read from the job's `id_column`."""
    if params.id_column is not None and data.id_column != params.id_column:
        read = f"from {data.id_column!r}" if data.id_column else "as row numbers (no id column named)"
        raise InvalidInput(f"the job names {params.id_column!r} as the id column, but this party read its ids {read}: "
                           f"name it with --id-column {params.id_column} (id_column in run.toml or a catalogue)")
    want = params.feature_columns
    if want is None or data.columns == want:
        return
    if not data.columns:
        raise InvalidInput(f"the job lists its feature columns ({', '.join(params.columns or ())}), but this party's "
                           "table has no column names (arrays, or a .npz without 'columns'): give it as a CSV, "
                           "Parquet or DataFrame with named columns")
    missing = [c for c in want if c not in data.columns]
    extra = [c for c in data.columns if c not in want]
    said = "; ".join(x for x in (f"missing {', '.join(map(repr, missing))}" if missing else "",
                                 f"not in the job {', '.join(map(repr, extra))}" if extra else "") if x)
    raise InvalidInput(f"this party's feature columns are not the job's (columns = [...] in the job file): "
                       f"{said or 'the same names in another order'}; the job's are {', '.join(want)} (every "
                       "column but the label and id columns is a feature: drop or rename columns, or name the "
                       "label and id columns with --label-column and --id-column)")


def privacy_report(privacy: dict[str, Any] | None, prep: Any, account: Any,
                   progress: Callable[[str], None]) -> dict[str, Any] | None:
    """What the job's releases spent (JobResult.privacy: the job's `privacy`), with the DP
    moments' (the preparation's) as "moments" and the data set's budget after the run (its
    RunAccount) as "ledger", said on `progress`."""
    moments = prep.privacy() if prep is not None else None
    if moments is not None:
        privacy = {**(privacy or {}), "moments": moments}
    if account is not None and account.spends:
        book, name = account.ledger, account.data.hex()[:16]
        standing = book.standing(account.data)
        privacy = {**(privacy or {}), "ledger": {"data_set": name, **standing}}
        spent = standing["spent"]
        progress(f"privacy ledger: data set {name} has spent ε = {spent['epsilon']:.4g}, "
                 f"δ = {spent['delta']:.3g} of its budget (ε = {book.budget.epsilon:g}, "
                 f"δ = {book.budget.delta:g}) over all its runs"
                 + (" (RDP composition)" if standing["composition"] == "rdp" else ""))
    return privacy
