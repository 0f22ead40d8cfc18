"""XCLP through the CLIs, once clean, once with every party's connection cut in the middle of
SecureHamming, once with the coordinator killed (SIGKILL) there and started again on the same
state, and once with a party killed there and started again with the same command: what a network
fault, a coordinator's crash and a party's crash cost.

3 parties of sklearn's digits, split and labeled as in xclp_e2e.py, a coordinator process
(`xclp-server serve`, TLS with a throwaway dev CA) and three `xclp-client run` processes. In the
faulty run the parties reach the coordinator through a TCP proxy (tests/proxy.py) that closes
every connection through it once SecureHamming has run for half as long as it took in the clean
run; the parties reconnect (the job's reconnect_seconds) and go on. In the crash run the
coordinator is killed once SecureHamming has run half as long as in the clean run and started again
at once on the same state and port; it goes on from its checkpoint (docs/operating.md "Long runs");
the stop run does the same with SIGTERM, which saves the run as it stands ("A graceful stop").
In the party run, party b is killed the same way and its command run again at once: it rejoins
from its sealed run state (docs/operating.md "A party killed and restarted"); in the rowsums run,
party b is killed the moment it has sent its masked row sums in SecureRowSums (before it can
reveal anything) and its command run again: it rejoins with the Z̄ its run state keeps, and the sum
goes on at its next attempt among the same parties ("A party killed in SecureRowSums"). In the solve run the
coordinator is killed after SecureHamming, once its checkpoint holds the graph (in the influence
solve), and started again: it solves again and runs SecureRowSums from there (docs/operating.md
"A coordinator killed after SecureHamming").
Each run's predictions are checked against the same protocol run in one process on that run's
common seed (the runs draw different seeds, so their predictions differ from each other by design).

Reported (last stdout line, JSON): per run its wall seconds (party processes started -> all
exited), SecureHamming seconds and attempts, who was dropped, whether its predictions equal the
in-process run's; the cut or kill made and, for the crash, the pieces the restarted coordinator
kept and redid (its SecureHamming seconds and attempts are those after the restart: the attempt in
flight at the crash was never recorded); for the party's crash, the pieces the coordinator kept
for the restarted party's attempt; and wall_ratio = faulty / clean for each (goal <= 1.2).

Usage: python benchmarks/xclp_faults.py [--quick | --smoke] [--cases cut,crash,stop,party,rowsums,solve]
(--quick: 3 x 150 rows, L = 256, 1024-bit test keys)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _data import load_digits_data
from _service import deployment, run_command, serve
from xclp_e2e import GRAPH, N_CLASSES, PARTIES, job_toml, read_labels, split, write_party_csv

from xclp.crypto.pool import process_pool
from xclp.errors import InvalidInput
from xclp.seeding import public_rng
from xclp.server.resume import Saved
from xclp.simulation import run_xclp_inprocess

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.proxy import Proxy  # the checkout's tests: the proxy the tests cut too


def say(message: str) -> None:
    print(f"xclp_faults: {message}", file=sys.stderr, flush=True)


def one_run(name: str, data: dict[str, tuple[np.ndarray, np.ndarray]], lsh_bits: int, key_bits: int,
            cut_after: float | None, kill_after: float | None = None,
            party_after: float | None = None, kill_in_solve: bool = False,
            kill_signal: signal.Signals = signal.SIGKILL, party_in_row_sums: bool = False) -> dict[str, Any]:
    """A whole run through the CLIs; with `cut_after`, every connection is cut that many seconds
    into SecureHamming; with `kill_after`, the coordinator is killed (`kill_signal`: or stopped) then
    and started again; with `party_after`, party b is; with `kill_in_solve`, the coordinator is
    killed in the influence solve; with `party_in_row_sums`, party b once it masked its row sums."""
    insecure = key_bits < 2048
    work = deployment(f"xclp-faults-{name}-", PARTIES)
    for p, (X, y) in data.items():
        write_party_csv(work / f"{p}.csv", X, y)
    (work / "job.toml").write_text(job_toml("faults", lsh_bits, key_bits, "reconnect_seconds = 60\n"))
    env = {**os.environ, "XCLP_TESTING": "1", "PYTHONUNBUFFERED": "1"}
    server, port = serve(work, env, free_port() if kill_after is not None or kill_in_solve else 0)
    proxy = Proxy(f"127.0.0.1:{port}") if cut_after is not None else None
    dial = int(proxy.address.rsplit(":", 1)[1]) if proxy is not None else port
    started = time.perf_counter()
    commands = {p: run_command(work, dial, "faults", p, "--data", str(work / f"{p}.csv"), "--id-column", "row_id",
                               "--paillier-bits", str(key_bits), "--out", str(work / "out" / p),
                               "--debug-dump-seed", str(work / f"{p}.seed"), "--state", str(work / "state" / p),
                               *(["--insecure-test-keys"] if insecure else [])) for p in PARTIES}
    procs = [subprocess.Popen(commands[p], stderr=open(work / f"{p}.log", "w"), env=env) for p in PARTIES]
    cut_at: list[float] = []
    servers = [server]
    if proxy is not None and cut_after is not None:
        threading.Thread(target=cut_in_secure_hamming, args=(work / "coordinator.log", proxy, cut_after, cut_at),
                         daemon=True).start()
    if kill_after is not None:
        threading.Thread(target=kill_in_secure_hamming, args=(work, env, port, servers, kill_after, cut_at,
                                                              kill_signal), daemon=True).start()
    if kill_in_solve:
        threading.Thread(target=kill_in_the_solve, args=(work, env, port, servers, cut_at), daemon=True).start()
    killer = None
    if party_after is not None:
        killer = threading.Thread(target=kill_party_in_secure_hamming,
                                  args=(work, env, procs, commands, party_after, cut_at), daemon=True)
        killer.start()
    if party_in_row_sums:
        killer = threading.Thread(target=kill_party_in_row_sums, args=(work, env, procs, commands, cut_at),
                                  daemon=True)
        killer.start()
    codes = [proc.wait() for proc in procs]
    if killer is not None:  # the party killed, then its command again: wait for that one
        killer.join()
        codes = [proc.wait() for proc in procs]
    wall = time.perf_counter() - started
    servers[-1].wait(60)
    if proxy is not None:
        proxy.close()
    if any(codes):
        raise SystemExit(f"{name}: a party failed ({codes}); logs in {work}")
    summary = json.loads((work / "summary.json").read_text())
    hamming = summary["steps"]["secure_hamming"]
    stopped = "killed" if kill_signal == signal.SIGKILL else "stopped"
    fault = (f"coordinator {stopped} {{:.1f}}s into it" if kill_after is not None
             else "party b killed {:.1f}s into it" if party_after is not None
             else "coordinator killed {:.1f}s after it (in the influence solve)" if kill_in_solve
             else "party b killed {:.1f}s after it (in SecureRowSums)" if party_in_row_sums
             else "connections cut {:.1f}s into it")
    say(f"{name}: {wall:.1f}s wall, SecureHamming {hamming['seconds']:.1f}s in {hamming['rounds']} attempt(s)"
        + (", " + fault.format(cut_at[0]) if cut_at else ""))
    seed = (work / "a.seed").read_bytes()
    with process_pool() as pool:
        inproc = run_xclp_inprocess(data, N_CLASSES, seed=seed, L=lsh_bits, key_bits=key_bits, params=GRAPH,
                                    executor=pool, insecure_test_keys=insecure)
    same = all(np.array_equal(read_labels(work / "out" / p / "predictions.csv"), inproc.outputs[p].labels)
               for p in PARTIES)
    reconnected = sum("reconnected to the coordinator" in (work / f"{p}.log").read_text() for p in PARTIES)
    out = {"wall_seconds": round(wall, 3), "secure_hamming_seconds": round(hamming["seconds"], 3),
           "secure_hamming_attempts": hamming["rounds"], "dropped": summary.get("dropped", {}),
           "parties_reconnected": reconnected, "predictions_equal_in_process": same}
    if party_after is not None:
        said = (work / "b-restarted.log").read_text()
        attempt = re.search(r"SecureHamming attempt \d+: [^;]*; (\d+) pieces(?:; (?:(\d+) pairs)?(?:, )?"
                            r"(?:(\d+) pieces of others)? kept from before)?", said)
        return out | {"killed_seconds_into_secure_hamming": round(cut_at[0], 3) if cut_at else None,
                      "rejoined": "restarted: rejoining run" in said,
                      "pieces_done_after_restart": int(attempt.group(1)) if attempt else None,
                      "pairs_kept_whole": int(attempt.group(2) or 0) if attempt else 0,
                      "pieces_kept": int(attempt.group(3) or 0) if attempt else 0}
    if party_in_row_sums:
        said = (work / "b-restarted.log").read_text() if cut_at else ""
        rowsums = summary["steps"]["rowsums"]
        return out | {"killed_seconds_after_secure_hamming": round(cut_at[0], 3) if cut_at else None,
                      "rejoined": "restarted: rejoining run" in said,
                      "influence_columns_received_again": "influence columns received" in said,
                      "rowsums_attempts": rowsums["rounds"], "rowsums_seconds": round(rowsums["seconds"], 3)}
    if kill_in_solve:
        restarted = (work / "coordinator-restarted.log").read_text() if cut_at else ""
        return out | {"killed_seconds_after_secure_hamming": round(cut_at[0], 3) if cut_at else None,
                      "went_on_from_checkpoint": "goes on from its checkpoint" in restarted,
                      "solved_again": "influence columns are solved and sent again" in restarted,
                      "secure_hamming_run_again": "step secure_hamming" in restarted}
    if kill_after is None:
        return out | {"cut_seconds_into_secure_hamming": round(cut_at[0], 3) if cut_at else None}
    restarted = (work / "coordinator-restarted.log").read_text()
    kept = re.search(r"keeps (\d+) pairs folded whole and (\d+) pieces of (\d+) others", restarted)
    total = re.search(r"SecureHamming: (\d+) pieces folded in", restarted)
    return out | {"killed_seconds_into_secure_hamming": round(cut_at[0], 3) if cut_at else None,
                  "went_on_from_checkpoint": "goes on from its checkpoint" in restarted,
                  "saved_at_stop": "is saved, and goes on when the coordinator starts again" in (
                      work / "coordinator.log").read_text(errors="replace"),
                  "pairs_kept_whole": int(kept.group(1)) if kept else 0,
                  "pieces_kept": int(kept.group(2)) if kept else 0,
                  "pieces_folded_after_restart": int(total.group(1)) if total else None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_in_secure_hamming(work: Path, env: dict[str, str], port: int, servers: list[subprocess.Popen],
                           after: float, killed_at: list[float], sig: signal.Signals = signal.SIGKILL) -> None:
    """Once the coordinator's log says SecureHamming started, wait `after` seconds, SIGKILL it (or
    stop it with `sig`) and start it again on the same state and port."""
    while "step secure_hamming attempt 0 started" not in (work / "coordinator.log").read_text(errors="replace"):
        time.sleep(0.2)
    began = time.perf_counter()
    time.sleep(after)
    servers[0].send_signal(sig)
    servers[0].wait(30)
    killed_at.append(time.perf_counter() - began)
    say(f"coordinator {'killed' if sig == signal.SIGKILL else 'stopped'} {killed_at[0]:.1f}s into SecureHamming; "
        "starting it again")
    servers.append(serve(work, env, port, "coordinator-restarted.log")[0])


def kill_in_the_solve(work: Path, env: dict[str, str], port: int, servers: list[subprocess.Popen],
                      killed_at: list[float]) -> None:
    """Once the coordinator's checkpoint holds the graph (SecureHamming is over: the influence solve
    runs), SIGKILL it and start it again on the same state and port; nothing if the run ends first.
    `killed_at`: seconds from the end of SecureHamming (as this thread saw it in the log) to the kill."""
    log, over = work / "coordinator.log", None
    while servers[0].poll() is None:
        if over is None and re.search(r"secure_hamming attempt \d+ complete", log.read_text(errors="replace")):
            over = time.perf_counter()
        try:
            saved = Saved.from_bytes((work / "runs" / "1.ckpt").read_bytes())
        except (OSError, InvalidInput):  # none yet, or being replaced
            saved = None
        if saved is not None and "graph" in saved.meta["job"]:
            break
        time.sleep(0.05)
    else:
        say("the run ended before a checkpoint of its influence solve: nothing killed")
        return
    servers[0].send_signal(signal.SIGKILL)
    servers[0].wait(30)
    killed_at.append(time.perf_counter() - (over or time.perf_counter()))
    say(f"coordinator killed in its influence solve, {killed_at[0]:.1f}s after SecureHamming; starting it again")
    servers.append(serve(work, env, port, "coordinator-restarted.log")[0])


def kill_party_in_secure_hamming(work: Path, env: dict[str, str], procs: list[subprocess.Popen],
                                  commands: dict[str, list[str]], after: float, killed_at: list[float]) -> None:
    """Once the coordinator's log says SecureHamming started, wait `after` seconds, SIGKILL party b
    and run its command again at once (its log: b-restarted.log)."""
    while "step secure_hamming attempt 0 started" not in (work / "coordinator.log").read_text(errors="replace"):
        time.sleep(0.2)
    began = time.perf_counter()
    time.sleep(after)
    restart_party_b(work, env, procs, commands)
    killed_at.append(time.perf_counter() - began)
    say(f"party b killed {killed_at[0]:.1f}s into SecureHamming; its command runs again")


def kill_party_in_row_sums(work: Path, env: dict[str, str], procs: list[subprocess.Popen],
                           commands: dict[str, list[str]], killed_at: list[float]) -> None:
    """Once party b's log says it sent its masked row sums (its run state holds its Z̄), SIGKILL it
    and run its command again at once; nothing if it ends first. `killed_at`: seconds from the end
    of SecureHamming (as this thread saw it in the coordinator's log) to the kill."""
    log, over, at = work / "coordinator.log", None, PARTIES.index("b")
    while "masked row sums sent" not in (work / "b.log").read_text(errors="replace"):
        if procs[at].poll() is not None:
            say("party b ended before it masked its row sums: nothing killed")
            return
        if over is None and re.search(r"secure_hamming attempt \d+ complete", log.read_text(errors="replace")):
            over = time.perf_counter()
        time.sleep(0.02)
    restart_party_b(work, env, procs, commands)
    killed_at.append(time.perf_counter() - (over or time.perf_counter()))
    say(f"party b killed in SecureRowSums, {killed_at[0]:.1f}s after SecureHamming; its command runs again")


def restart_party_b(work: Path, env: dict[str, str], procs: list[subprocess.Popen],
                    commands: dict[str, list[str]]) -> None:
    """SIGKILL party b, and run its command again at once (its log: b-restarted.log)."""
    at = PARTIES.index("b")
    procs[at].send_signal(signal.SIGKILL)
    procs[at].wait(30)
    procs[at] = subprocess.Popen(commands["b"], stderr=open(work / "b-restarted.log", "w"), env=env)


def cut_in_secure_hamming(log: Path, proxy: Proxy, after: float, cut_at: list[float]) -> None:
    """Once the coordinator's log says SecureHamming started, wait `after` seconds and cut."""
    while "step secure_hamming attempt 0 started" not in log.read_text(errors="replace"):
        time.sleep(0.2)
    began = time.perf_counter()
    time.sleep(after)
    proxy.cut()
    cut_at.append(time.perf_counter() - began)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 x 150 rows, L = 256, 1024-bit test keys")
    ap.add_argument("--rows", type=int, help="rows per party (above 599: digits drawn again with jitter, as "
                    "xclp_scale.py does)")
    ap.add_argument("--lsh-bits", type=int, help="L (default 1024, 256 with --quick)")
    ap.add_argument("--cases", default="cut,crash,party",
                    help="faulty runs beside the clean one: cut, crash, stop, party, rowsums, solve (default cut, "
                         "crash, party)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run through the clean run and a coordinator "
                    "killed and restarted, for CI: proves the benchmark runs; its figures mean nothing")
    args = ap.parse_args()
    if args.smoke:
        args.cases = "crash"
    rows, lsh_bits, key_bits = ((60, 128, 512) if args.smoke else (150, 256, 1024) if args.quick
                                else (599, 1024, 2048))
    rows, lsh_bits = args.rows or rows, args.lsh_bits or lsh_bits
    cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    known = {"cut", "crash", "stop", "party", "rowsums", "solve"}
    if cases - known:
        raise SystemExit(f"--cases: unknown {', '.join(sorted(cases - known))}")
    X, y = load_digits_data()
    rng = public_rng(7, "benchmark/xclp-e2e/split")
    if rows * len(PARTIES) > y.size:  # more rows than digits has: jittered repeats
        idx = rng.integers(0, y.size, size=rows * len(PARTIES))
        X, y = X[idx] + rng.normal(scale=0.5, size=(idx.size, X.shape[1])), y[idx]
    data = {}
    for p, idx in zip(PARTIES, split(y, rows, rng)):
        labels = np.full(idx.size, -1, dtype=np.int64)
        chosen = rng.choice(idx.size, size=max(1, round(0.1 * idx.size)), replace=False)
        labels[chosen] = y[idx][chosen]
        data[p] = (X[idx], labels)
    say(f"{len(PARTIES)} parties x {rows} rows, L = {lsh_bits}, {key_bits}-bit keys")
    clean = one_run("clean", data, lsh_bits, key_bits, None)
    half = clean["secure_hamming_seconds"] / 2
    out: dict[str, Any] = {
        "parties": len(PARTIES), "rows_per_party": rows, "lsh_bits": lsh_bits, "key_bits": key_bits,
        "cores": len(os.sched_getaffinity(0)), "clean": clean}
    if "cut" in cases:
        cut = out["connections_cut_mid_secure_hamming"] = one_run("cut", data, lsh_bits, key_bits, half)
        out["wall_ratio"] = round(cut["wall_seconds"] / clean["wall_seconds"], 3)
    if "crash" in cases:
        crash = out["coordinator_killed_mid_secure_hamming"] = one_run("crash", data, lsh_bits, key_bits, None, half)
        out["wall_ratio_coordinator_killed"] = round(crash["wall_seconds"] / clean["wall_seconds"], 3)
    if "stop" in cases:
        stop = out["coordinator_stopped_mid_secure_hamming"] = one_run("stop", data, lsh_bits, key_bits, None, half,
                                                                       kill_signal=signal.SIGTERM)
        out["wall_ratio_coordinator_stopped"] = round(stop["wall_seconds"] / clean["wall_seconds"], 3)
    if "party" in cases:
        party = out["party_killed_mid_secure_hamming"] = one_run("party", data, lsh_bits, key_bits, None, None, half)
        out["wall_ratio_party_killed"] = round(party["wall_seconds"] / clean["wall_seconds"], 3)
    if "rowsums" in cases:
        rowsums = out["party_killed_in_secure_rowsums"] = one_run("rowsums", data, lsh_bits, key_bits, None,
                                                                 party_in_row_sums=True)
        out["wall_ratio_party_killed_in_rowsums"] = round(rowsums["wall_seconds"] / clean["wall_seconds"], 3)
    if "solve" in cases:
        solve = out["coordinator_killed_in_influence_solve"] = one_run("solve", data, lsh_bits, key_bits, None,
                                                                       kill_in_solve=True)
        out["wall_ratio_killed_in_solve"] = round(solve["wall_seconds"] / clean["wall_seconds"], 3)
    out["load_average_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
