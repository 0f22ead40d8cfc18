"""The arrows of docs/design.md §1, checked on the source: who may import whom.

Every module of the installed package is put in a layer by where it lives; every import it makes
(top-level, lazy inside functions, relative) must point into a layer its own layer may use:

    methods (xclp.*: lsh, graph, flynn, race, privacy, tables, errors, runtime, ...)
        <- crypto (xclp.crypto)
        <- v1, the contract both ends share (xclp.v1)
        <- tools that drive processes (xclp.demo)
        <- server (xclp.server)   |   client (xclp.client)    (never each other)
        <- simulation (xclp.simulation: the one module that drives both sides' steps)

Nothing installed imports the tests, the benchmarks, or the old top-level names `crypto`,
`server`, `client`. The checker is tested on a small fake tree too, so it cannot pass by
checking nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# top-level folder -> import name (pyproject.toml [tool.setuptools.package-dir])
PACKAGE_DIRS = {"xclp": "xclp", "crypto": "xclp.crypto", "server": "xclp.server", "client": "xclp.client"}

ALLOWED: dict[str, frozenset[str]] = {
    "methods": frozenset({"methods"}),
    "crypto": frozenset({"crypto", "methods"}),
    "v1": frozenset({"v1", "crypto", "methods"}),
    "tools": frozenset({"tools", "v1", "crypto", "methods"}),
    "server": frozenset({"server", "v1", "crypto", "methods"}),
    "client": frozenset({"client", "tools", "v1", "crypto", "methods"}),
    "simulation": frozenset({"simulation", "server", "client", "v1", "crypto", "methods"}),
}
FORBIDDEN_ROOTS = {"crypto", "server", "client", "tests", "benchmarks"}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "xclp":
        raise ValueError(module)
    second = parts[1] if len(parts) > 1 else ""
    return {"crypto": "crypto", "v1": "v1", "server": "server", "client": "client", "simulation": "simulation",
            "demo": "tools"}.get(second, "methods")


def modules(root: Path, package_dirs: dict[str, str]) -> Iterator[tuple[str, Path]]:
    for folder, name in package_dirs.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            # a folder mapped elsewhere (xclp/ holds no crypto/ today, but be exact) is skipped
            yield ".".join([name, *parts]), path


def imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in the file, relative ones resolved."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from xclp.privacy import noise` imports xclp.privacy.noise
                yield node.lineno, f"{target}.{alias.name}"


def violations(root: Path, package_dirs: dict[str, str] = PACKAGE_DIRS) -> list[str]:
    known = {name for name, _ in modules(root, package_dirs)}
    found = []
    for module, path in modules(root, package_dirs):
        own = layer(module)
        for line, target in imports(module, path):
            where = f"{path.relative_to(root)}:{line}: {module} imports {target}"
            top = target.split(".")[0]
            if top in FORBIDDEN_ROOTS:
                found.append(f"{where} (outside the xclp namespace)")
            elif top == "xclp" and target in known and layer(target) not in ALLOWED[own]:
                found.append(f"{where} ({own} may not import {layer(target)})")
    return found


def test_every_import_follows_the_arrows_of_design_section_1() -> None:
    assert violations(REPO) == []


def test_the_checker_finds_a_wrong_import(tmp_path: Path) -> None:
    """A method that climbs into crypto, a client that imports the server, a relative climb and a
    lazy one inside a function, an old top-level name: each is reported."""
    for folder, files in {
        "xclp": {"__init__.py": "", "lsh.py": "from xclp.crypto import masking\n",
                 "v1/__init__.py": "", "v1/wire.py": "def f():\n    import xclp.client.session\n"},
        "crypto": {"__init__.py": "", "masking.py": "import numpy\n"},
        "server": {"__init__.py": "", "service.py": "from ..client import session\n"},
        "client": {"__init__.py": "", "session.py": "from xclp.server import service\nimport server.cli\n"},
    }.items():
        for name, text in files.items():
            target = tmp_path / folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    found = "\n".join(violations(tmp_path))
    assert "xclp.lsh imports xclp.crypto.masking (methods may not import crypto)" in found
    assert "xclp.v1.wire imports xclp.client.session (v1 may not import client)" in found
    assert "xclp.server.service imports xclp.client.session (server may not import client)" in found
    assert "xclp.client.session imports xclp.server.service (client may not import server)" in found
    assert "xclp.client.session imports server.cli (outside the xclp namespace)" in found
    assert len({line.split(": ")[0] for line in found.splitlines()}) == 5  # nothing else, no clean line


@pytest.mark.parametrize("module", ["xclp.lsh", "xclp.privacy.noise", "xclp.demo", "xclp.crypto.paillier",
                                    "xclp.v1.bundles", "xclp.server.cli", "xclp.client.cli", "xclp.simulation"])
def test_layers_are_assigned_by_folder(module: str) -> None:
    expected = {"xclp.lsh": "methods", "xclp.privacy.noise": "methods", "xclp.demo": "tools",
                "xclp.crypto.paillier": "crypto",
                "xclp.v1.bundles": "v1", "xclp.server.cli": "server", "xclp.client.cli": "client",
                "xclp.simulation": "simulation"}
    assert layer(module) == expected[module]


def job_type_dispatch(root: Path, names: frozenset[str]) -> list[str]:
    """Places outside the registry that compare a `job_type` or list job types (STYLE 9)."""
    found = []
    for module, path in modules(root, PACKAGE_DIRS):
        if module == "xclp.v1.registry":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                names_job_type = any(getattr(o, "id", "") == "job_type" or getattr(o, "attr", "") == "job_type"
                                     for o in operands)
                literal = any(isinstance(o, ast.Constant) and isinstance(o.value, str)
                              or isinstance(o, (ast.Tuple, ast.List, ast.Set)) for o in operands)
                if names_job_type and literal:  # `spec.job_type not in self.config.job_types` is a policy
                    found.append(f"{where}: compares a job_type")
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(strings) >= 2 and set(strings) <= names:
                    found.append(f"{where}: lists job types {strings}")
    return found


def test_only_the_registry_knows_the_job_types() -> None:
    """The registry is the one list of job types; nothing else compares a job_type or lists them,
    and each entry names a coordinator class in the server and a party class in the client."""
    from xclp.v1 import registry

    assert job_type_dispatch(REPO, frozenset(registry.names())) == []
    for name in registry.names():
        entry = registry.get(name)
        assert isinstance(entry.coordinator, str) and layer(entry.coordinator.split(":")[0]) == "server", name
        assert isinstance(entry.party, str) and layer(entry.party.split(":")[0]) == "client", name
        assert callable(entry.coordinator_class()) and callable(entry.party_class())
        # the simulation and a model file's loader, named the same way
        assert entry.simulation is None or callable(entry.simulation_runner()), name
        if entry.model_loader is not None:
            assert isinstance(entry.model_loader, str) and layer(entry.model_loader.split(":")[0]) == "client", name


SHARED = ("xclp.client.session", "xclp.client.api", "xclp.client.context", "xclp.client.agent",
          "xclp.client.models", "xclp.client.outputs", "xclp.client.phases.", "xclp.server.run",
          "xclp.server.coordinator", "xclp.server.service", "xclp.server.phases.", "xclp.simulation.simulate")


def params_dispatch(root: Path) -> list[str]:
    """isinstance over one job type's parameters (`XclpJobParams`, ...) in the modules every job
    shares: what differs by type is asked of the job type, through the registry."""
    found = []
    for module, path in modules(root, PACKAGE_DIRS):
        if not any(module == s or (s.endswith(".") and module.startswith(s)) for s in SHARED):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                names = [getattr(k, "id", getattr(k, "attr", "")) for k in kinds]
                if any(n.endswith("JobParams") and n != "JobParams" for n in names):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: isinstance over {', '.join(names)}")
    return found


def test_the_modules_every_job_shares_ask_the_job_type_not_isinstance() -> None:
    assert params_dispatch(REPO) == []


def test_the_isinstance_checker_finds_a_type_test(tmp_path: Path) -> None:
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "__init__.py").write_text("")
    (tmp_path / "client" / "session.py").write_text("if isinstance(params, XclpJobParams):\n    pass\n"
                                                   "ok = isinstance(params, JobParams)\n")
    assert params_dispatch(tmp_path) == ["client/session.py:1: isinstance over XclpJobParams"]


def test_the_dispatch_checker_finds_a_comparison_and_a_list(tmp_path: Path) -> None:
    for folder, files in {"xclp": {"__init__.py": "", "a.py": 'if config.job_type == "xclp":\n    pass\n'},
                          "client": {"__init__.py": "", "b.py": 'TYPES = ("fedavg", "dbcl")\nx = ("xclp",)\n'},
                          "crypto": {"__init__.py": ""}, "server": {"__init__.py": ""}}.items():
        for name, text in files.items():
            (tmp_path / folder).mkdir(exist_ok=True)
            (tmp_path / folder / name).write_text(text)
    found = job_type_dispatch(tmp_path, frozenset({"xclp", "fedavg", "dbcl"}))
    assert found == ["xclp/a.py:1: compares a job_type", "client/b.py:1: lists job types ['fedavg', 'dbcl']"]


MAX_MODULE_LINES = 450  # a module a newcomer can read through


def test_no_installed_module_is_longer_than_a_newcomer_reads_through() -> None:
    """Every installed module (the generated protobuf code aside) has at most MAX_MODULE_LINES lines."""
    long = {str(path.relative_to(REPO)): n for _, path in modules(REPO, PACKAGE_DIRS)
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
            and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def private_writes(root: Path, package_dirs: dict[str, str] = PACKAGE_DIRS) -> list[str]:
    """Assignments to another object's private attribute (`session._executor = ...`, `x._n += 1`) in
    the installed modules: an object's private state is written by its own methods only (a class's
    by its own classmethods: `self` and `cls` are the object itself). protoc's generated modules
    (`*_pb2.py`) set up their descriptors so and are not ours to write."""
    found = []
    for module, path in modules(root, package_dirs):
        if path.stem.endswith(("_pb2", "_pb2_grpc")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in (t for outer in targets for t in ast.walk(outer)):
                if isinstance(target, ast.Attribute) and target.attr.startswith("_") \
                        and not target.attr.startswith("__") \
                        and not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls")):
                    found.append(f"{path.relative_to(root)}:{target.lineno}: {module} writes "
                                 f"{ast.unparse(target)}")
    return found


def test_no_module_writes_another_objects_private_state() -> None:
    assert private_writes(REPO) == []


def test_the_private_write_checker_finds_one(tmp_path: Path) -> None:
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "friend.py").write_text(
        "def rejoin(session):\n    session._executor = None\n    session.stage, session._job = 1, 2\n"
        "    session._n += 1\n\nclass Own:\n    def __init__(self):\n        self._ok = 1\n")
    found = private_writes(tmp_path, {"client": "xclp.client"})
    assert [f.split(": ", 1)[1] for f in found] == [
        "xclp.client.friend writes session._executor", "xclp.client.friend writes session._job",
        "xclp.client.friend writes session._n"]


# docs/architecture.md: the run-size defaults (XclpJobParams.for_rows) become concrete once per run, where the
# roster is verified, and every restart reads them back from the run's state (`with_resolved`)
RESOLVED_AT = {
    "client/session.py": "the party, where it verifies the roster's signed row counts",
    "server/jobs/xclp.py": "the coordinator, in check_start, from the joined parties' row counts",
    "xclp/simulation/simulate.py": "the simulation, which has no roster but the tables",
    "client/jobs/xclp.py": "before_join's estimate for an assumed roster (no run yet; its result enters none)",
}


def resolutions(root: Path, package_dirs: dict[str, str] = PACKAGE_DIRS) -> dict[str, int]:
    """Per installed module, how many calls of `.for_rows(...)` it makes."""
    found: dict[str, int] = {}
    for _, path in modules(root, package_dirs):
        calls = sum(1 for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "for_rows")
        if calls:
            found[str(path.relative_to(root))] = calls
    return found


def test_the_run_size_defaults_are_resolved_where_the_roster_is_verified_and_nowhere_else() -> None:
    """A restarted party (client/run_state.py) and a restarted coordinator (XclpJob.resumed) read the
    resolved values from the run's state; before, each resolved them again from the roster."""
    assert resolutions(REPO) == dict.fromkeys(RESOLVED_AT, 1)
