"""`xclp-client`: one institution's party (docs/design.md §9).

    xclp-client keygen --party hospital-a --out keys/        # send keys/hospital-a.pub to the operator
    xclp-client run --coordinator coord.example.org:50051 --ca-cert ca.pem --job flynn-demo \\
        --party hospital-a --identity keys/hospital-a.key --data train.csv --out flynn-model.npz
    xclp-client predict --model flynn-model.npz --data new.csv --out predictions.csv   (FlyNN, fedavg, dbcl)
    xclp-client query --model race-model.npz --data queries.csv --out kde.csv
    xclp-client run ... --job xclp-demo --paillier-bits 2048 --out results/   # XCLP: writes results/predictions.csv
    xclp-client demo                      # coordinator + three institutions on localhost, XCLP end to end
    xclp-client agent --config agent.toml # always on: takes part in the runs its policy accepts

`run` settings come from flags or `--config party.toml` (same names, underscores; flags win), both
made and checked from one table of the party's options (client/options.py).
Exit codes: 0 success, 2 bad input or settings, 3 protocol violation, 4 refused (not allow-listed,
bad signature), 5 dropped or timed out, 1 unexpected error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from xclp.client import api, options
from xclp.client.ledger import Budget, default_directory
from xclp.client.models import ModelFile
from xclp.client.options import Source
from xclp.client.outputs import predict_columns, query_columns, with_id_name, write_columns
from xclp.client.session import stderr_progress
from xclp.crypto import identity
from xclp.data import party_table, tables
from xclp.errors import ConfigError, XclpError
from xclp.memory import limit_malloc_arenas
from xclp.runtime import read_toml, require_testing, write_atomic, write_private
from xclp.v1.exits import stdout_closed
from xclp.v1.registry import Output
from xclp.v1.status import EXIT_BAD_INPUT, EXIT_DROPPED, EXIT_OK, exit_code
from xclp.validation import table as comparison_table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xclp-client", description="An xclp party: joins a coordinator's jobs with local "
                                                                "data.")
    sub = p.add_subparsers(dest="command", required=True)

    k = sub.add_parser("keygen", help="create this party's Ed25519 identity key",
                       description="Write <out>/<party>.key (private, mode 0600) and <out>/<party>.pub (send it "
                       "to the coordinator's operator for the allow-list).")
    k.add_argument("--party", required=True, help="this party's id, e.g. hospital-a")
    k.add_argument("--out", type=Path, default=Path("."), help="output directory (default: current)")

    r = sub.add_parser("run", help="take part in a job", description="Join a job on the coordinator with "
                       "local data, do this party's side, and write the resulting model file atomically.")
    r.add_argument("--config", type=Path, help="party TOML file (keys as the flags below, with underscores)")
    options.add_flags(r)

    ag = sub.add_parser("agent", help="an always-on party: joins the runs that name it and its policy accepts",
                        description="Poll the coordinator for runs that name this party; take part in those whose "
                        "type, data set (by catalogue name) and security requirements the agent's config accepts; "
                        "write each run's outputs to <out>/<job>/<run>/ atomically; log every refusal with its "
                        "reason. Stops cleanly on SIGTERM/SIGINT. See client/agent.py for agent.toml.")
    ag.add_argument("--config", type=Path, required=True, help="agent TOML file")
    ag.add_argument("--runs", type=int, help="stop after taking part in this many runs; exit 0 only if every one "
                    "was done (demos and tests; default: run until SIGTERM)")
    ag.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")

    dm = sub.add_parser("demo", help="XCLP across three institutions on localhost, no Docker",
                        description="Start a coordinator and three institutions (real processes, TLS with a "
                        "throwaway dev CA) on the bundled demo data, run XCLP, and print each institution's "
                        "accuracy on its unlabeled rows next to what it gets alone.")
    dm.add_argument("--key-bits", type=int, default=2048, help="Paillier key size (default 2048)")
    dm.add_argument("--insecure-test-keys", action="store_true", help="allow --key-bits below 2048 (quick trials)")
    dm.add_argument("--lsh-bits", type=int, default=1024, help="LSH bits L (default 1024)")
    dm.add_argument("--data-dir", type=Path, help="directory with <party>.csv and <party>.truth.csv "
                    "(default: the bundled demo data)")
    dm.add_argument("--out", "--keep", dest="keep", type=Path, help="the work directory: certificates, keys, logs "
                    "and outputs, kept (default: a new directory under the system's temp directory, named at the end)")

    sm = sub.add_parser("simulate", help="does federating help? alone, federated and pooled accuracy per party",
                        description="Simulate an XCLP job over your tables in this process (the plaintext "
                        "reference, which the service's result equals) and print, per party, the accuracy on a "
                        "held-out part of its labeled rows for the party alone (label propagation on its own rows), "
                        "federated, a logistic regression on its own labeled rows, and pooled (one central table, "
                        "for reference), each with its 95 % interval; warn where federating is worse than alone "
                        "beyond the intervals, and say where the held-out rows are too few to tell.")
    sm.add_argument("job", type=Path, help="the job file (its type and [params])")
    sm.add_argument("data", type=Path, nargs="+", help="one table per party (the party is named by the file's stem)")
    sm.add_argument("--holdout", type=float, default=0.2, help="fraction of each party's labeled rows held out "
                    "(default 0.2; the same rows every time)")
    sm.add_argument("--label-column", default="label", help="the label column (default label)")
    sm.add_argument("--id-column", help="the row id column (default: the job's id_column, else row numbers)")

    lg = sub.add_parser("ledger", help="what this party released about each data set, and its DP budget",
                        description="Show, export, move or forget this party's privacy ledger (docs/privacy.md): "
                        "per data set (the digest of its table as read, before any job prepares it), the one set of "
                        "parties its exact releases are among, each run's exact releases (what, among which parties, "
                        "in which job and run) and every DP charge, with the budget spent and left. It holds no value "
                        "of the data.")
    lg.add_argument("action", choices=("show", "export", "forget", "move", "reopen"),
                    help="show: a summary; export: the whole ledger as JSON on stdout; forget: drop one data set "
                         "(or --all), which re-opens everything it guarded; move: let one data set release exactly "
                         "among another set of parties from now on (--to); reopen: weigh DP jobs on a data set that "
                         "declined one for its budget against what is left again")
    lg.add_argument("dataset", nargs="?", help="forget, move, reopen: the data set's digest (or a unique prefix of "
                    "it)")
    lg.add_argument("--to", metavar="PARTIES", help="move: the new set of parties, comma-separated (e.g. a,b,c,e)")
    lg.add_argument("--all", action="store_true", help="forget: every data set")
    lg.add_argument("--yes", action="store_true", help="forget, move: do it (without it, only say what it would "
                    "re-open)")
    lg.add_argument("--state", type=Path, help="the state directory (default: $XDG_STATE_HOME/xclp)")
    lg.add_argument("--privacy-budget", metavar="EPS[,DELTA]", help="the budget to report what is left against "
                    "(default 10,1e-5)")

    pr = sub.add_parser("predict", help="FlyNN, fedavg or dbcl network predictions for a CSV, locally",
                        description="Predict classes with a FlyNN, fedavg or dbcl model file; no network. Writes "
                        "id,prediction (a network also writes its confidence).")
    q = sub.add_parser("query", help="RACE kernel density (or class) estimates for a CSV, locally",
                       description="Query a RACE model file; no network. A KDE model writes id,kde; a class "
                       "model writes id,prediction,score_<c>...")
    for sp in (pr, q):
        sp.add_argument("--model", type=Path, required=True, help="model file written by `xclp-client run`")
        sp.add_argument("--data", type=Path, required=True, help="CSV, Parquet or .npz with the same feature columns "
                        "(label column ignored)")
        sp.add_argument("--label-column", default=tables.DEFAULT_LABEL,
                        help="label column to ignore if present (default label)")
        sp.add_argument("--id-column", help="row id column name (default: row numbers)")
        sp.add_argument("--delimiter", help="CSV separator: , ; | or tab (default: detected from the header)")
        sp.add_argument("--out", type=Path, required=True, help="output CSV (written atomically)")
    q.add_argument("--estimator", choices=("mean", "median_of_means"), default="mean", help="KDE estimator (default "
                                                                                            "mean)")
    q.add_argument("--groups", type=int, help="groups for median_of_means")
    return p


def _read_party_toml(path: Path, without: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """`--config party.toml`: the settings it gives, checked (client/options.py), paths next to it;
    but not those `without` (the flags given, which win over the file, under any of their names)."""
    raw = read_toml(path)
    skipped = {name for flag in without for name in (flag, *options.OPTIONS[flag].old_names)}
    return options.read_settings({k: v for k, v in raw.items() if k not in skipped},
                                 options.Where(Source.RUN_TOML, path), base=path.parent)


class Terminated(BaseException):
    """SIGTERM: unwind like Ctrl-C, so that every `finally` runs (the Paillier pool's processes end with it)."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    flags = options.read_settings({k: v for k, v in vars(args).items() if k in options.keys(Source.FLAG)
                                   and v is not None}, options.Where(Source.FLAG))
    cfg = {} if args.config is None else _read_party_toml(args.config, without=set(flags))
    cfg.update(flags)  # flags win

    def named(name: str) -> str:  # where the user gave it: a flag, or else the file
        return options.Where(Source.RUN_TOML if name in cfg and name not in flags else Source.FLAG,
                             args.config).named(name)
    missing = [k for k in ("coordinator", "job", "party", "identity", "peers", "data", "out") if not cfg.get(k)]
    if missing:
        raise ConfigError("run needs " + ", ".join("--" + m.replace("_", "-") for m in missing))
    identity.check_party_id(cfg["party"])
    seed_path = cfg.pop("debug_dump_seed", None)
    if seed_path:
        require_testing("--debug-dump-seed writes the job's secret common seed to disk")
    out = Path(cfg.pop("out"))
    cfg.update(label_column=cfg.get("label_column", tables.DEFAULT_LABEL) or None,
               id_column=cfg.get("id_column") or None, state=cfg.get("state") or default_directory())
    result = api.run_with(cfg, named=named)
    if seed_path:
        write_atomic(seed_path, result.job.seed)
    path = result.save(out)
    if result.output is Output.PREDICTIONS:
        stderr_progress(f"wrote predictions for {len(result.data.ids)} rows to {path}")
        if result.validation is not None:
            print(comparison_table([result.validation]), flush=True)
    elif path is None:
        stderr_progress(f"the job withholds the model from the parties (after {len(result.job.rounds)} rounds), so "
                        "there is no model to write")
    else:
        stderr_progress(f"wrote the {result.job_type} model of {len(result.participants)} parties to {path}")
    return EXIT_OK


def agent(args: argparse.Namespace) -> int:
    import logging
    import threading

    from xclp.client.agent import Agent, AgentConfig

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = AgentConfig.load(args.config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.runs is not None and args.runs < 1:
        raise ConfigError("--runs must be at least 1")
    runner = Agent(config)
    runner.serve(stop, runs=args.runs)
    failed = sorted(f"{run} of job {job}" for (job, run), ok in runner.finished.items() if not ok)
    stderr_progress("agent stopped" + (f"; runs not done: {', '.join(failed)}" if failed else ""))
    if stop.is_set():  # SIGTERM or SIGINT: a clean stop, whatever the runs it cut short
        return EXIT_OK
    return EXIT_DROPPED if args.runs is not None and failed else EXIT_OK


def demo(args: argparse.Namespace) -> int:
    from xclp.demo import DemoOptions, run_demo

    return run_demo(DemoOptions(key_bits=args.key_bits, insecure_test_keys=args.insecure_test_keys,
                                lsh_bits=args.lsh_bits, data_dir=args.data_dir, keep=args.keep))


def simulate(args: argparse.Namespace) -> int:
    """In a process of its own (xclp/simulation/compare.py says why): this one becomes it."""
    names = [path.stem for path in args.data]
    if len(set(names)) != len(names):
        raise ConfigError(f"simulate names each party by its table's file name; these repeat: {', '.join(names)}")
    request = {"job": str(args.job), "data": {n: str(p) for n, p in zip(names, args.data)}, "holdout": args.holdout,
               "label_column": args.label_column, "id_column": args.id_column}
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "xclp.simulation.compare", json.dumps(request)])


def keygen(args: argparse.Namespace) -> int:
    identity.check_party_id(args.party)
    args.out.mkdir(parents=True, exist_ok=True)
    key = identity.generate_identity()
    key_path = write_private(args.out / f"{args.party}.key", identity.private_key_pem(key))
    public = identity.public_key_text(key)
    write_atomic(args.out / f"{args.party}.pub", f"{public}\n".encode(), mode=0o644)
    print(f'{args.party} = "{public}"')
    stderr_progress(f"identity key: {key_path} (keep private); public key: {args.out / (args.party + '.pub')}. "
                    "Send the line above to the coordinator's operator for the allow-list.")
    return EXIT_OK


def predict(args: argparse.Namespace) -> int:
    model = ModelFile.load(args.model)
    table = _table(args, model)
    write_columns(args.out, with_id_name(predict_columns(model, table), table))
    stderr_progress(f"wrote {len(table.ids)} predictions of the {model.job_type} model to {args.out}")
    return EXIT_OK


def query(args: argparse.Namespace) -> int:
    model = ModelFile.load(args.model)
    table = _table(args, model)
    write_columns(args.out, with_id_name(query_columns(model, table, estimator=args.estimator, groups=args.groups),
                                         table), float_format=lambda v: f"{v:.10g}")
    stderr_progress(f"wrote {len(table.ids)} estimates to {args.out}")
    return EXIT_OK


def _table(args: argparse.Namespace, model: ModelFile) -> party_table.PartyData:
    return tables.load(args.data, label_column=args.label_column or None, id_column=args.id_column,
                           delimiter=args.delimiter, categorical=model.params.categorical)


def ledger_command(args: argparse.Namespace) -> int:
    from xclp.client.ledger import Ledger

    book = Ledger(args.state or default_directory(), budget=Budget.of(args.privacy_budget, "--privacy-budget"))
    if args.action == "export":
        print(json.dumps(book.load(), indent=1, sort_keys=True))
        return EXIT_OK
    summary = book.summary()
    if args.action == "show":
        print(f"privacy ledger {book.path}: {len(summary)} data set(s); budget ε = {book.budget.epsilon:g}, "
              f"δ = {book.budget.delta:g} each")
        for digest, entry in summary.items():
            spent, left = entry["spent"], entry["left"]
            how = " (RDP composition across its releases)" if entry["composition"] == "rdp" else ""
            print(f"\ndata set {digest[:16]}: DP spent ε = {spent['epsilon']:.4g}, δ = {spent['delta']:.3g}{how}; "
                  f"left ε = {left['epsilon']:.4g}, δ = {left['delta']:.3g}")
            for charge in entry["dp"]:
                print(f"  DP    ε = {charge['epsilon']:<8g} δ = {charge['delta']:<8g} {charge['what']} "
                      f"(job {charge['job']}, run {charge['run']}, {charge['at']})")
            if entry["among"]:
                print(f"  exact releases only among {', '.join(entry['among'])}")
            if entry["declined"]:
                print(f"  declines every DP job since job {entry['declined']['job']} ({entry['declined']['at']}) "
                      "went past its budget")
            for release in entry["exact"]:
                whats = release["what"]
                listed = "; ".join(whats[:3]) + ("; and more" if len(whats) > 3 or release.get("more") else "")
                state = " (retired by a move)" if release.get("retired") else ""
                print(f"  exact among {', '.join(release['parties'])} (job {release['job']}, run {release['run']}, "
                      f"{release['at']}){state}: {listed}")
        return EXIT_OK
    if args.action == "move":
        return _ledger_move(book, summary, args)
    if args.action == "reopen":
        if not args.dataset:
            raise ConfigError("ledger reopen takes a data set's digest (or a unique prefix)")
        print(f"data set {book.reopen(args.dataset)[:16]} weighs DP jobs against what is left of its budget again "
              "(an operator can learn one more crossing: docs/privacy.md)")
        return EXIT_OK
    if bool(args.dataset) == bool(args.all):
        raise ConfigError("ledger forget takes a data set's digest (or a unique prefix) or --all")
    chosen = [d for d in summary if args.all or d.startswith(args.dataset)]
    if not args.yes:
        for d in chosen:
            entry = summary[d]
            print(f"data set {d[:16]}: forgetting it re-opens {len(entry['exact'])} exact release(s) to a rerun "
                  f"among other parties and gives back ε = {entry['spent']['epsilon']:.4g} of its DP budget")
        print("nothing forgotten: add --yes to forget" + (" them" if len(chosen) != 1 else " it"))
        return EXIT_BAD_INPUT
    gone = book.forget(None if args.all else args.dataset)
    print(f"forgot {len(gone)} data set(s): {', '.join(d[:16] for d in gone) or 'none'}")
    return EXIT_OK


def _ledger_move(book: Any, summary: dict[str, Any], args: argparse.Namespace) -> int:
    """`ledger move DIGEST --to a,b,c,e`: the institution's explicit choice of another set of parties."""
    if not args.dataset or not args.to:
        raise ConfigError("ledger move takes a data set's digest (or a unique prefix) and --to PARTIES, e.g. "
                          "`xclp-client ledger move 3f2a --to a,b,c,e`")
    chosen = [d for d in summary if d.startswith(args.dataset)]
    parties = sorted({p.strip() for p in args.to.split(",") if p.strip()})
    if len(chosen) == 1 and not args.yes:
        before = summary[chosen[0]]["among"] or []
        changed = sorted(set(before) ^ set(parties))
        print(f"data set {chosen[0][:16]} releases exactly among {', '.join(before) or 'no set yet'}. Moved to "
              f"{', '.join(parties)}, a coordinator that holds a sum over each set can difference the two into what "
              f"{', '.join(changed) or 'nobody'} released: a choice for the whole consortium (docs/privacy.md)")
        print("nothing moved: add --yes to move it")
        return EXIT_BAD_INPUT
    moved = book.move(args.dataset, parties)
    print(f"data set {moved[:16]} now releases exactly among {', '.join(parties)}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    limit_malloc_arenas()
    commands = {"keygen": keygen, "run": run, "predict": predict, "query": query, "demo": demo, "agent": agent,
                "ledger": ledger_command, "simulate": simulate}
    try:
        return commands[args.command](args)
    except XclpError as exc:
        print(f"xclp-client: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        print("xclp-client: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("xclp-client: stopped by SIGTERM; nothing written", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:
        return stdout_closed()
    except OSError as exc:
        print(f"xclp-client: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
