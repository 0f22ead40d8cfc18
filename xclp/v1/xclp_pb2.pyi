from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SignedCall(_message.Message):
    __slots__ = ("signer", "call", "signature")
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    signer: str
    call: bytes
    signature: bytes
    def __init__(self, signer: _Optional[str] = ..., call: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("method", "timestamp_ms", "nonce", "body")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    method: str
    timestamp_ms: int
    nonce: bytes
    body: bytes
    def __init__(self, method: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., nonce: _Optional[bytes] = ..., body: _Optional[bytes] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("job_toml", "file_name")
    JOB_TOML_FIELD_NUMBER: _ClassVar[int]
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    job_toml: str
    file_name: str
    def __init__(self, job_toml: _Optional[str] = ..., file_name: _Optional[str] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("job_id", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ShowRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class OffersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Offer(_message.Message):
    __slots__ = ("run_id", "spec", "rejoin")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REJOIN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    spec: JobSpec
    rejoin: bool
    def __init__(self, run_id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., rejoin: _Optional[bool] = ...) -> None: ...

class OfferList(_message.Message):
    __slots__ = ("offers",)
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    offers: _containers.RepeatedCompositeFieldContainer[Offer]
    def __init__(self, offers: _Optional[_Iterable[_Union[Offer, _Mapping]]] = ...) -> None: ...

class PartyInfo(_message.Message):
    __slots__ = ("party_id", "state", "rows", "joined_at", "reason", "silent_seconds", "activity")
    PARTY_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    JOINED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SILENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    party_id: str
    state: str
    rows: int
    joined_at: float
    reason: str
    silent_seconds: float
    activity: str
    def __init__(self, party_id: _Optional[str] = ..., state: _Optional[str] = ..., rows: _Optional[int] = ..., joined_at: _Optional[float] = ..., reason: _Optional[str] = ..., silent_seconds: _Optional[float] = ..., activity: _Optional[str] = ...) -> None: ...

class StepInfo(_message.Message):
    __slots__ = ("name", "rounds", "seconds", "bytes_in", "bytes_relayed", "bytes_out", "recovered")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_RELAYED_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FIELD_NUMBER: _ClassVar[int]
    name: str
    rounds: int
    seconds: float
    bytes_in: int
    bytes_relayed: int
    bytes_out: int
    recovered: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., rounds: _Optional[int] = ..., seconds: _Optional[float] = ..., bytes_in: _Optional[int] = ..., bytes_relayed: _Optional[int] = ..., bytes_out: _Optional[int] = ..., recovered: _Optional[_Iterable[str]] = ...) -> None: ...

class RunInfo(_message.Message):
    __slots__ = ("run_id", "job_id", "job_type", "state", "reason", "created_at", "started_at", "ended_at", "parties", "step", "round", "steps", "bytes_total", "submitted_by", "progress", "privacy")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_BY_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    PRIVACY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    job_id: str
    job_type: str
    state: str
    reason: str
    created_at: float
    started_at: float
    ended_at: float
    parties: _containers.RepeatedCompositeFieldContainer[PartyInfo]
    step: str
    round: int
    steps: _containers.RepeatedCompositeFieldContainer[StepInfo]
    bytes_total: int
    submitted_by: str
    progress: str
    privacy: str
    def __init__(self, run_id: _Optional[str] = ..., job_id: _Optional[str] = ..., job_type: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., created_at: _Optional[float] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., parties: _Optional[_Iterable[_Union[PartyInfo, _Mapping]]] = ..., step: _Optional[str] = ..., round: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[StepInfo, _Mapping]]] = ..., bytes_total: _Optional[int] = ..., submitted_by: _Optional[str] = ..., progress: _Optional[str] = ..., privacy: _Optional[str] = ...) -> None: ...

class RunList(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunInfo]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunInfo, _Mapping]]] = ...) -> None: ...

class SignedBundle(_message.Message):
    __slots__ = ("bundle", "signature")
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    bundle: bytes
    signature: bytes
    def __init__(self, bundle: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class DataSummary(_message.Message):
    __slots__ = ("rows", "labeled_rows", "dim", "schema")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    LABELED_ROWS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    rows: int
    labeled_rows: int
    dim: int
    schema: bytes
    def __init__(self, rows: _Optional[int] = ..., labeled_rows: _Optional[int] = ..., dim: _Optional[int] = ..., schema: _Optional[bytes] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("job_id", "bundle", "summary", "capabilities")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    bundle: SignedBundle
    summary: DataSummary
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., bundle: _Optional[_Union[SignedBundle, _Mapping]] = ..., summary: _Optional[_Union[DataSummary, _Mapping]] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("job_id", "job_type", "params_json", "expected_parties", "min_parties", "step_deadline_seconds", "datasets", "max_run_seconds", "reconnect_seconds")
    class DatasetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_TYPE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_PARTIES_FIELD_NUMBER: _ClassVar[int]
    MIN_PARTIES_FIELD_NUMBER: _ClassVar[int]
    STEP_DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    MAX_RUN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RECONNECT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job_type: str
    params_json: str
    expected_parties: _containers.RepeatedScalarFieldContainer[str]
    min_parties: int
    step_deadline_seconds: float
    datasets: _containers.ScalarMap[str, str]
    max_run_seconds: float
    reconnect_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., job_type: _Optional[str] = ..., params_json: _Optional[str] = ..., expected_parties: _Optional[_Iterable[str]] = ..., min_parties: _Optional[int] = ..., step_deadline_seconds: _Optional[float] = ..., datasets: _Optional[_Mapping[str, str]] = ..., max_run_seconds: _Optional[float] = ..., reconnect_seconds: _Optional[float] = ...) -> None: ...

class ChallengeRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ChallengeResponse(_message.Message):
    __slots__ = ("run_nonce", "spec", "run_id")
    RUN_NONCE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_nonce: bytes
    spec: JobSpec
    run_id: str
    def __init__(self, run_nonce: _Optional[bytes] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., run_id: _Optional[str] = ...) -> None: ...

class DeclineRequest(_message.Message):
    __slots__ = ("job_id", "run_nonce", "reason")
    class Reason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REASON_UNSPECIFIED: _ClassVar[DeclineRequest.Reason]
        PRIVACY_BUDGET: _ClassVar[DeclineRequest.Reason]
        RESOURCES: _ClassVar[DeclineRequest.Reason]
        BAD_DATA: _ClassVar[DeclineRequest.Reason]
        POLICY: _ClassVar[DeclineRequest.Reason]
    REASON_UNSPECIFIED: DeclineRequest.Reason
    PRIVACY_BUDGET: DeclineRequest.Reason
    RESOURCES: DeclineRequest.Reason
    BAD_DATA: DeclineRequest.Reason
    POLICY: DeclineRequest.Reason
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_NONCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    run_nonce: bytes
    reason: DeclineRequest.Reason
    def __init__(self, job_id: _Optional[str] = ..., run_nonce: _Optional[bytes] = ..., reason: _Optional[_Union[DeclineRequest.Reason, str]] = ...) -> None: ...

class DeclineAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("session_token", "spec")
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    session_token: bytes
    spec: JobSpec
    def __init__(self, session_token: _Optional[bytes] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("job_id", "resume", "received", "restarted")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    RESTARTED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    resume: bool
    received: int
    restarted: bool
    def __init__(self, job_id: _Optional[str] = ..., resume: _Optional[bool] = ..., received: _Optional[int] = ..., restarted: _Optional[bool] = ...) -> None: ...

class Roster(_message.Message):
    __slots__ = ("bundles",)
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    bundles: _containers.RepeatedCompositeFieldContainer[SignedBundle]
    def __init__(self, bundles: _Optional[_Iterable[_Union[SignedBundle, _Mapping]]] = ...) -> None: ...

class StepStart(_message.Message):
    __slots__ = ("step", "round", "participants", "deadline_seconds")
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    step: str
    round: int
    participants: _containers.RepeatedScalarFieldContainer[str]
    deadline_seconds: float
    def __init__(self, step: _Optional[str] = ..., round: _Optional[int] = ..., participants: _Optional[_Iterable[str]] = ..., deadline_seconds: _Optional[float] = ...) -> None: ...

class JobEnd(_message.Message):
    __slots__ = ("outcome", "reason")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[JobEnd.Outcome]
        DONE: _ClassVar[JobEnd.Outcome]
        FAILED: _ClassVar[JobEnd.Outcome]
        DROPPED: _ClassVar[JobEnd.Outcome]
        REFUSED: _ClassVar[JobEnd.Outcome]
        CANCELLED: _ClassVar[JobEnd.Outcome]
        INTERRUPTED: _ClassVar[JobEnd.Outcome]
    OUTCOME_UNSPECIFIED: JobEnd.Outcome
    DONE: JobEnd.Outcome
    FAILED: JobEnd.Outcome
    DROPPED: JobEnd.Outcome
    REFUSED: JobEnd.Outcome
    CANCELLED: JobEnd.Outcome
    INTERRUPTED: JobEnd.Outcome
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    outcome: JobEnd.Outcome
    reason: str
    def __init__(self, outcome: _Optional[_Union[JobEnd.Outcome, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class JoinStatus(_message.Message):
    __slots__ = ("joined", "expected", "min_parties", "join_deadline_seconds", "waiting_for")
    JOINED_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    MIN_PARTIES_FIELD_NUMBER: _ClassVar[int]
    JOIN_DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    joined: int
    expected: int
    min_parties: int
    join_deadline_seconds: float
    waiting_for: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, joined: _Optional[int] = ..., expected: _Optional[int] = ..., min_parties: _Optional[int] = ..., join_deadline_seconds: _Optional[float] = ..., waiting_for: _Optional[_Iterable[str]] = ...) -> None: ...

class PullItem(_message.Message):
    __slots__ = ("roster", "step", "frame", "end", "status", "alive", "seq")
    ROSTER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    roster: Roster
    step: StepStart
    frame: Frame
    end: JobEnd
    status: JoinStatus
    alive: RunAlive
    seq: int
    def __init__(self, roster: _Optional[_Union[Roster, _Mapping]] = ..., step: _Optional[_Union[StepStart, _Mapping]] = ..., frame: _Optional[_Union[Frame, _Mapping]] = ..., end: _Optional[_Union[JobEnd, _Mapping]] = ..., status: _Optional[_Union[JoinStatus, _Mapping]] = ..., alive: _Optional[_Union[RunAlive, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class RunAlive(_message.Message):
    __slots__ = ("step", "seconds")
    STEP_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    step: str
    seconds: float
    def __init__(self, step: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("job_id", "step", "round", "sender", "recipient", "message_id", "chunk_index", "chunk_count", "total_bytes", "sha256", "dtype", "shape", "data")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: str
    round: int
    sender: str
    recipient: str
    message_id: int
    chunk_index: int
    chunk_count: int
    total_bytes: int
    sha256: bytes
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[str] = ..., round: _Optional[int] = ..., sender: _Optional[str] = ..., recipient: _Optional[str] = ..., message_id: _Optional[int] = ..., chunk_index: _Optional[int] = ..., chunk_count: _Optional[int] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[bytes] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("frames", "bytes")
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    frames: int
    bytes: int
    def __init__(self, frames: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...
