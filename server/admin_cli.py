"""`xclp-server job ...` and `xclp-server operator keygen`: the operator's side of the Admin API.

    xclp-server operator keygen --name alice --out keys/     # add the printed line to [operators]
    xclp-server job submit flynn.toml [--wait]                # queue a run; prints its id
    xclp-server job list [--job flynn-demo] [--limit 20]
    xclp-server job show 12 [--wait]
    xclp-server job cancel 12 [--reason "wrong data set"]

Each signs its call with the operator key (`--operator`, `--operator-key`, or XCLP_OPERATOR and
XCLP_OPERATOR_KEY) and talks to `--admin` (default 127.0.0.1:50052, or XCLP_ADMIN; an address off
the host needs `--ca-cert` or XCLP_ADMIN_CA, for TLS); `--json` prints the runs as JSON for scripts.
Their parser is server/cli.py's (it must not import this module: gRPC and the protobufs load
only when a command runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from xclp.crypto import identity
from xclp.errors import ConfigError, XclpError
from xclp.runtime import read_bytes, write_atomic, write_private
from xclp.server.defaults import FINAL
from xclp.v1 import calls
from xclp.v1 import xclp_pb2 as pb
from xclp.v1 import xclp_pb2_grpc as pb_grpc
from xclp.v1.status import EXIT_OK, error_from_rpc

WAIT_POLL_SECONDS = 1.0


def operator_keygen(args: argparse.Namespace) -> int:
    identity.check_party_id(args.name)
    args.out.mkdir(parents=True, exist_ok=True)
    key = identity.generate_identity()
    path = write_private(args.out / f"{args.name}.key", identity.private_key_pem(key))
    public = identity.public_key_text(key)
    write_atomic(args.out / f"{args.name}.pub", f"{public}\n".encode(), mode=0o644)  # as a party's keygen does
    print(f'{args.name} = "{public}"')
    print(f"xclp-server: operator key {path} (keep private); public key: {args.out / (args.name + '.pub')}; add "
          "the line above to [operators] in the server config", file=sys.stderr)
    return EXIT_OK


class AdminClient:
    def __init__(self, args: argparse.Namespace) -> None:
        if not args.operator or not args.operator_key:
            raise ConfigError("the Admin API needs --operator and --operator-key (or XCLP_OPERATOR and "
                              "XCLP_OPERATOR_KEY)")
        self.operator = args.operator
        self.key = identity.load_private_key(read_bytes(args.operator_key, "operator key"),
                                             source=str(args.operator_key))
        if args.ca_cert is None:
            self.channel = grpc.insecure_channel(args.admin)
        else:
            options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
            self.channel = grpc.secure_channel(args.admin, grpc.ssl_channel_credentials(_read(args.ca_cert)),
                                               options=options)
        self.stub = pb_grpc.AdminStub(self.channel)

    def call(self, method: str, body: Message) -> Any:
        signed = calls.sign_call(self.key, self.operator, method, body)
        rpc = getattr(self.stub, method.rsplit("/", 1)[1])
        try:
            return rpc(signed, timeout=30)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, where="coordinator's Admin API") from None


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def job_command(args: argparse.Namespace) -> int:
    client = AdminClient(args)
    try:
        if args.job_command == "submit":
            texts = []
            for path in args.file:  # read them all first: a typo in the last submits nothing
                try:
                    texts.append((path.read_text(), str(path)))
                except (OSError, UnicodeDecodeError) as exc:
                    raise ConfigError(f"cannot read {path}: {exc}") from None
            infos = [client.call(calls.ADMIN_SUBMIT, pb.SubmitRequest(job_toml=text, file_name=name))
                     for text, name in texts]
            for info in infos:
                if not args.json:
                    print(f"submitted run {info.run_id} of job {info.job_id} ({info.state})", file=sys.stderr)
            return _maybe_wait(client, args, *infos)
        if args.job_command == "list":
            runs = client.call(calls.ADMIN_LIST, pb.ListRequest(job_id=args.job, limit=max(1, args.limit))).runs
            if args.json:
                print(json.dumps([_as_dict(r) for r in runs], indent=2))
            else:
                print(format_list(runs))
            return EXIT_OK
        if args.job_command == "show":
            info = client.call(calls.ADMIN_SHOW, pb.ShowRequest(run_id=args.run))
            return _maybe_wait(client, args, info)
        info = client.call(calls.ADMIN_CANCEL, pb.CancelRequest(run_id=args.run, reason=args.reason))
        _print(info, args.json)
        return EXIT_OK
    finally:
        client.channel.close()


def _maybe_wait(client: AdminClient, args: argparse.Namespace, *infos: pb.RunInfo) -> int:
    """Print the runs (with --wait: once each is over); exit 0 unless a waited-for run is not done."""
    runs = list(infos)
    if args.wait:
        give_up = time.monotonic() + args.timeout if args.timeout else None
        while any(info.state not in FINAL for info in runs):
            if give_up is not None and time.monotonic() > give_up:
                _print(runs, args.json)
                late = [f"{i.run_id} ({i.state})" for i in runs if i.state not in FINAL]
                raise XclpError(f"run(s) {', '.join(late)} not over after {args.timeout:.0f} s")
            time.sleep(WAIT_POLL_SECONDS)
            runs = [info if info.state in FINAL else client.call(calls.ADMIN_SHOW, pb.ShowRequest(run_id=info.run_id))
                    for info in runs]
    _print(runs, args.json)
    return EXIT_OK if not args.wait or all(info.state == "done" for info in runs) else 1


def _as_dict(info: pb.RunInfo) -> dict[str, Any]:
    data = MessageToDict(info, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    data["duration_seconds"] = round(_duration(info), 3)
    return _numbers(data, info.DESCRIPTOR)


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def _numbers(data: dict[str, Any], descriptor: Descriptor) -> dict[str, Any]:
    """Protobuf's JSON writes 64-bit integers as strings (for JavaScript); a script reading
    `job show --json` wants numbers, and Python's JSON keeps them exact."""
    for field in descriptor.fields:
        value = data.get(field.name)
        if value is None:
            continue
        if field.type in _INT64:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value if isinstance(value, list) else [value]:
                _numbers(item, field.message_type)
    return data


def _print(runs: pb.RunInfo | list[pb.RunInfo], as_json: bool) -> None:
    """One run as a JSON object, several as a JSON list; or the human form, one after another."""
    if isinstance(runs, pb.RunInfo):
        runs = [runs]
    if as_json:
        print(json.dumps(_as_dict(runs[0]) if len(runs) == 1 else [_as_dict(r) for r in runs], indent=2))
    else:
        print("\n\n".join(format_run(r) for r in runs))


def _duration(info: pb.RunInfo) -> float:
    if not info.started_at:
        return 0.0
    return (info.ended_at or time.time()) - info.started_at


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError


def format_run(info: pb.RunInfo) -> str:
    step = f", step {info.step} round {info.round}" if info.step else ""
    lines = [f"run {info.run_id}: job {info.job_id} ({info.job_type}), {info.state}{step}"]
    if info.progress:
        lines.append(f"  progress:  {info.progress}")
    if info.reason:
        lines.append(f"  reason:    {info.reason}")
    if info.privacy:
        lines.append(f"  privacy:   {info.privacy}")
    lines.append(f"  created:   {_when(info.created_at)}" + (f" by {info.submitted_by}" if info.submitted_by else ""))
    lines.append(f"  started:   {_when(info.started_at)}    ended: {_when(info.ended_at)}    "
                 f"duration: {_duration(info):.1f} s")
    lines.append(f"  bytes:     {_bytes(info.bytes_total)}")
    if info.parties:
        lines.append("  parties:")
        for p in info.parties:
            extra = f"{p.rows} rows" if p.rows else ""
            if p.silent_seconds or p.activity:  # a live run: its last sign of life
                extra += f", heard {p.silent_seconds:.0f} s ago" + (f" ({p.activity})" if p.activity else "")
            lines.append(f"    {p.party_id:<20} {p.state:<13} {extra}" + (f"  ({p.reason})" if p.reason else ""))
    if info.steps:
        lines.append(f"  {'step':<24} {'rounds':>6} {'seconds':>9} {'in':>10} {'relayed':>10} {'out':>10}")
        for s in info.steps:
            lines.append(f"  {s.name:<24} {s.rounds:>6} {s.seconds:>9.3f} {_bytes(s.bytes_in):>10} "
                         f"{_bytes(s.bytes_relayed):>10} {_bytes(s.bytes_out):>10}")
            for what in s.recovered:  # "c in r3.update"
                party, _, step = what.partition(" in ")
                lines.append(f"    reconstructed b for party {party} ({step}): lost while revealing")
    return "\n".join(lines)


def format_list(runs: Any) -> str:
    header = (f"{'RUN':>5}  {'JOB':<24} {'TYPE':<7} {'STATE':<12} {'PARTIES':>7}  {'STEP':<20} {'SECONDS':>8} "
              f"{'BYTES':>10}")
    lines = [header]
    for r in runs:
        joined = sum(1 for p in r.parties if p.state not in ("never joined", "declined"))
        step = f"{r.step}/{r.round}" if r.step else "-"
        lines.append(f"{r.run_id:>5}  {r.job_id:<24} {r.job_type:<7} {r.state:<12} {joined:>7}  {step:<20} "
                     f"{_duration(r):>8.1f} {_bytes(r.bytes_total):>10}")
    return "\n".join(lines)
