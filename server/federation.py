"""`xclp-server federation new` and `xclp-server allow add`: a federation on one machine from a
few CSVs, and the allow-list of a real one.

`federation new DIR --parties a,b,c [--data a.csv b.csv c.csv] [--type xclp]` writes what ten
commands and a hand-written allow-list made before (like `flwr new`):

    DIR/ca/                 a development CA (ca.pem; ca-key.pem, 0600, stays here)
    DIR/coordinator/        server.pem and server-key.pem (localhost, 127.0.0.1), allow.toml,
                            server.toml (TLS, a state database, the job) and <type>.toml, the job
    DIR/<party>/            <party>.key (0600) and <party>.pub, the party's identity; run.toml,
                            `xclp-client run --config` with everything it needs
    DIR/README.md           the exact command for each process

With `--data`, the tables are read first (every party's, one per party, in --parties order) and
the job is written from them: the same feature columns on every party (written into the job as
its schema, `columns`), the label column's classes, the number of classes, and what the tables
need, each said with its reason (xclp.data.survey): text columns declared categorical with their
levels, `impute = "mean"` for empty cells, `standardise = true` for scales more than tenfold
apart. Without, the job names a placeholder class count to edit.
Every party goes on with two (min_parties = 2, the job's and each party's alike).

`allow add NAME PUBKEY` puts a party's public key (its `xclp-client keygen` line) into an
allow-list, for federations where each institution makes its own key.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xclp.crypto import identity
from xclp.data import tables
from xclp.data.survey import MAX_LEVELS, STANDARDISE_RATIO, Survey, survey
from xclp.errors import ConfigError, InvalidInput
from xclp.runtime import read_toml, write_atomic, write_private
from xclp.server import dev_ca
from xclp.v1 import registry

__all__ = ["allow_add", "new_federation"]

PORT = 50051


def new_federation(root: Path, parties: Sequence[str], data: Sequence[Path] = (), *, job_type: str = "xclp",
                   label_column: str = tables.DEFAULT_LABEL, id_column: str | None = None,
                   say: Callable[[str], None] = lambda line: None) -> str:
    """Write the federation (module docstring) under `root`; returns the README's text. What the
    job proposes for the tables (categorical text columns, impute, standardise) is said on `say`,
    each with its reason."""
    if len(parties) < 2 or len(set(parties)) != len(parties):
        raise ConfigError(f"--parties needs at least two distinct names, got {', '.join(parties) or 'none'}")
    for p in parties:
        identity.check_party_id(p)
    types = [name for name in registry.names() if registry.get(name).starter is not None]
    if job_type not in types:
        raise ConfigError(f"--type {job_type!r}: a new federation starts one of {', '.join(types)} (the others' "
                          "parameters depend on what they are for: docs/job-parameters.md)")
    if data and len(data) != len(parties):
        raise ConfigError(f"--data names {len(data)} tables for {len(parties)} parties: one per party, in order")
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"{root} is not empty; give a new directory")
    params, keys, proposals = _params(job_type, [Path(d).resolve() for d in data], label_column, id_column)
    for proposal in proposals:
        say(f"the job proposes: {proposal}")

    dev_ca.init_ca(root / "ca")
    coordinator = root / "coordinator"
    dev_ca.issue(root / "ca", coordinator, "server", server=True, dns_names=("localhost",), ips=("127.0.0.1",))
    lines = []
    for p in parties:
        key = identity.generate_identity()
        (root / p).mkdir(parents=True, exist_ok=True)
        write_private(root / p / f"{p}.key", identity.private_key_pem(key))
        public = identity.public_key_text(key)
        write_atomic(root / p / f"{p}.pub", f"{public}\n".encode(), mode=0o644)
        lines.append(f'{p} = "{public}"')
    write_atomic(coordinator / "allow.toml", ("[parties]\n" + "\n".join(lines) + "\n").encode(), mode=0o644)
    job_id = f"{job_type}-{root.resolve().name}"
    expected = ", ".join(f'"{p}"' for p in parties)
    write_atomic(coordinator / f"{job_type}.toml", (
        f'job_id = "{job_id}"\ntype = "{job_type}"\nexpected_parties = [{expected}]\nmin_parties = 2\n'
        f'summary = "summary.json"\n\n[deadlines]\njoin_seconds = 600\nstep_seconds = 300\n\n[params]\n{params}'
    ).encode(), mode=0o644)
    write_atomic(coordinator / "server.toml", (
        f'listen = "127.0.0.1:{PORT}"\nallow_list = "allow.toml"\nstate = "state/xclp.db"\n'
        f'jobs = ["{job_type}.toml"]\nexit_when_done = true\n\n[tls]\ncert = "server.pem"\nkey = "server-key.pem"\n'
    ).encode(), mode=0o644)
    for i, p in enumerate(parties):
        table = str(Path(data[i]).resolve()) if data else f"../{p}.csv"
        settings = [f'coordinator = "localhost:{PORT}"', 'ca_cert = "../ca/ca.pem"', f'job = "{job_id}"',
                    f'party = "{p}"', f'identity = "{p}.key"', 'peers = "../coordinator/allow.toml"',
                    f'data = "{table}"', f'label_column = "{label_column}"', 'out = "out"', "min_parties = 2"]
        if id_column:
            settings.append(f'id_column = "{id_column}"')
        if keys:
            settings.append(f"paillier_bits = {keys}")
        write_atomic(root / p / "run.toml", ("\n".join(settings) + "\n").encode(), mode=0o644)
    readme = _readme(root, parties, job_type, job_id, bool(data))
    write_atomic(root / "README.md", readme.encode(), mode=0o644)
    return readme


def _params(job_type: str, data: Sequence[Path], label_column: str,
            id_column: str | None) -> tuple[str, int, list[str]]:
    """The job's [params], from the tables when there are some, checked; its Paillier key size (0:
    none); and what the tables need that the job proposes, each with its reason."""
    found = survey(data, label_column, id_column) if data else Survey()
    proposals, extra = [], []
    for name, levels in found.levels.items():
        if len(levels) > MAX_LEVELS:
            raise InvalidInput(f"column {name!r} holds text with {len(levels)} distinct values, too many for a "
                               f"category (at most {MAX_LEVELS}): drop it, or name it with --id-column if it is the "
                               "row id")
        proposals.append(f"column {name!r} holds text: declared categorical with its {len(levels)} levels "
                         f"({', '.join(levels[:5])}{', ...' if len(levels) > 5 else ''}), one 0/1 column each")
    categorical = {name: tuple(levels) for name, levels in found.levels.items()}
    empty = {c: n for c, n in found.empty.items() if n}
    if empty:
        proposals.append(f"{sum(empty.values())} empty feature cells (in {', '.join(sorted(empty))}): impute = "
                         '"mean" fills them with the pooled mean')
        extra.append('impute = "mean"')
    if found.scale_ratio > STANDARDISE_RATIO:
        proposals.append(f"the columns' scales differ {found.scale_ratio:.0f}-fold (more than {STANDARDISE_RATIO:g}): "
                         "standardise = true scales each by the pooled mean and standard deviation")
        extra.append("standardise = true")
    classes: list[str] = []
    n_classes = 0
    for path in data:
        table = tables.load(path, label_column=label_column, id_column=id_column, categorical=categorical)
        if table.labels is not None:
            classes.extend(v for v in table.labels.values if v not in classes)
        elif table.y is not None and table.labeled.any():
            n_classes = max(n_classes, int(table.y.max()) + 1)
        width = table.X.shape[1]
    if data and not classes and not n_classes:
        raise InvalidInput(f"no table has a labeled row in its {label_column!r} column (--label-column)")
    numeric = all(c.lstrip("-").isdigit() for c in classes)
    if classes and numeric:
        n_classes, classes = max(n_classes, max(int(c) for c in classes) + 1), []
    count = len(classes) if classes else (n_classes or 2)
    starter = registry.get(job_type).starter
    assert starter is not None
    values: dict[str, Any] = {"n_classes": count, **({"classes": classes} if classes else {}),
                              **starter(width if data else 5)}
    checked = {**values, **({"columns": list(found.columns)} if data else {}),
               **({"id_column": id_column} if data and id_column else {}),
               **({"categorical": {k: list(v) for k, v in categorical.items()}} if categorical else {}),
               **({"impute": "mean"} if empty else {}), **({"standardise": True} if "standardise = true" in extra
                                                              else {})}
    parsed = registry.parse_params(job_type, checked)  # what the coordinator will check, checked now
    lines = [f"n_classes = {count}" + ("" if data else "   # the number of classes of your label column")]
    if classes:
        lines.append("classes = [" + ", ".join(f'"{c}"' for c in classes) + "]")
    if data:  # the job's schema: every party is checked against it, not against the first to join
        lines.append(f"columns = {json.dumps(list(found.columns), ensure_ascii=False)}")
        if id_column:  # every party checks it reads its ids from it; simulate reads the tables by it
            lines.append(f"id_column = {json.dumps(id_column, ensure_ascii=False)}")
    lines += extra
    lines += [f"{k} = {v}" for k, v in values.items() if k not in ("n_classes", "classes")]
    if categorical:
        lines.append("\n[params.categorical]")
        lines += [f"{json.dumps(name, ensure_ascii=False)} = {json.dumps(list(levels), ensure_ascii=False)}"
                  for name, levels in categorical.items()]
    keys = parsed.paillier
    return "\n".join(lines) + "\n", keys.bits if keys is not None else 0, proposals


def _readme(root: Path, parties: Sequence[str], job_type: str, job_id: str, with_data: bool) -> str:
    here = shlex.quote(str(root.resolve()))
    runs = "\n".join(f"xclp-client run --config {here}/{p}/run.toml        # {p}, in a terminal of its own"
                     for p in parties)
    data_note = "" if with_data else (
        f"\nEach party reads ../<party>.csv (edit `data` in <party>/run.toml), and the job's `n_classes` in "
        f"coordinator/{job_type}.toml is a placeholder: set it to your number of classes.\n")
    return f"""# A {job_type} federation of {len(parties)} parties on this machine

Made by `xclp-server federation new`. A development CA (ca/), the coordinator's certificate and
allow-list (coordinator/), and each party's identity key (<party>/<party>.key, readable by you
alone) and settings (<party>/run.toml). One job, `{job_id}` (coordinator/{job_type}.toml); it goes
on with two parties if one is lost.
{data_note}
Start the coordinator, then every party (any order; each waits for the others):

```sh
xclp-server serve --config {here}/coordinator/server.toml
{runs}
```

Each party writes its result under <party>/out/; the coordinator writes the run summary (per step
its seconds and bytes, nothing of the data) to coordinator/summary.json and exits when the run is
done. For a real federation each institution makes its own key (`xclp-client keygen`) and sends the
public line to the operator, who adds it with `xclp-server allow add NAME PUBKEY`.
"""


def allow_add(path: Path, name: str, public_key: str, *, replace: bool = False) -> None:
    """Put `name = "PUBKEY"` in the allow-list at `path` (made if missing), checked."""
    identity.check_party_id(name)
    key = public_key.strip().strip('"')
    if key.startswith(f"{name} = "):  # the whole line `xclp-client keygen` prints
        key = key.split("=", 1)[1].strip().strip('"')
    parties = dict(identity.allow_list(read_toml(path).get("parties"), source=str(path))) if path.exists() else {}
    raw = identity.parse_public_key(key)  # refuses a malformed key with what it expects
    if name in parties and not replace:
        raise ConfigError(f"{path} already lists {name!r}; pass --replace to give it another key")
    if raw in parties.values() and parties.get(name) != raw:
        raise ConfigError(f"{path} already gives that key to another party: one key, one party")
    texts = {p: identity.public_key_text(k) for p, k in parties.items()}
    texts[name] = identity.public_key_text(raw)
    write_atomic(path, ("[parties]\n" + "".join(f'{p} = "{t}"\n' for p, t in texts.items())).encode(), mode=0o644)
