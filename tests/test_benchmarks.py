"""Every benchmark runs end to end in its smoke mode (`--smoke`: the smallest run through every
part, seconds each), so none can rot unseen: benchmarks/dbcl.py's secure run failed for weeks
before anything ran it. The figures of a smoke run mean nothing and are not checked; that the
benchmark finishes and ends with its JSON line is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# benchmarks/_*.py are their helpers (data, the service harness), not benchmarks
NAMES = sorted(p.stem for p in BENCHMARKS.glob("[a-z]*.py"))


def test_the_list_is_every_benchmark() -> None:
    assert len(NAMES) >= 16 and "dbcl" in NAMES and "xclp_scale" in NAMES


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_each_benchmark_runs_end_to_end_in_its_smoke_mode(name: str, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    # its own process group: a benchmark that overruns is ended with every process it started (the
    # coordinator and parties of the service benchmarks), not only itself
    proc = subprocess.Popen([sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=BENCHMARKS.parent, env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=500)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{name} --smoke did not end within 500 s (its process group was killed):\n{stderr[-4000:]}")
    assert proc.returncode == 0, f"{name} --smoke exited {proc.returncode}:\n{stderr[-4000:]}"
    lines = stdout.strip().splitlines()
    assert lines, f"{name} --smoke printed nothing on stdout"
    assert isinstance(json.loads(lines[-1]), dict), lines[-1][:500]
