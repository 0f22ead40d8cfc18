"""Defaults the command line names before any work (server/cli.py builds its parser from these
without importing the coordinator, gRPC or the job types, so `xclp-server job list --help` and
the Admin commands start at once)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_ADMIN_LISTEN = "127.0.0.1:50052"  # the Admin API: loopback unless TLS
DEFAULT_STATE = Path("xclp-state.db")  # the coordinator's SQLite state, beside --config
IN_FLIGHT = ("joining", "running")
FINAL = ("done", "failed", "cancelled", "interrupted")  # a run in one of these states is over
