"""The committed generated modules match proto/ exactly (docs/design.md §1)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("xclp_pb2.py", "xclp_pb2.pyi", "xclp_pb2_grpc.py")


def test_generated_modules_are_current(tmp_path):
    subprocess.run([str(ROOT / "scripts" / "gen-proto"), str(tmp_path)], check=True, capture_output=True)
    for name in GENERATED:
        fresh = (tmp_path / "xclp" / "v1" / name).read_text()
        committed = (ROOT / "xclp" / "v1" / name).read_text()
        assert fresh == committed, f"xclp/v1/{name} is stale: run scripts/gen-proto and commit the result"
