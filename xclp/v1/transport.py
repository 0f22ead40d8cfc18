"""How both ends talk gRPC (docs/design.md §3): call metadata and channel options.

Frames stay under `wire.GRPC_MAX_MESSAGE_BYTES`; keepalives notice dead peers on idle
connections (institutions sit behind NATs and firewalls).
"""

from __future__ import annotations

from xclp.v1.wire import GRPC_MAX_MESSAGE_BYTES

# Pull and Push carry the party's session token and its job id as call metadata.
TOKEN_METADATA = "x-xclp-token-bin"
JOB_METADATA = "x-xclp-job"
# A Push also says the highest PullItem.seq the party has (decimal): the coordinator need not keep
# those for a resumed Pull stream.
RECEIVED_METADATA = "x-xclp-received"

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
)
# The server also accepts the parties' keepalive pings this often.
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    *CHANNEL_OPTIONS,
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
)
