"""The structure of ``src/svattn`` holds: no import cycles, no private names across
modules, small modules in the certified core.

The layer contracts themselves are import-linter's (``[tool.importlinter]`` in
pyproject.toml, run by ``make test``); these tests add what a layer contract
does not say. Imports inside functions count like module-level ones (grimp
reads every import statement).
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

SRC = Path(__file__).parents[1] / "src" / "svattn"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("svattn", cache_dir=None)


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycles(graph):
    # a package's __init__ re-exporting its own submodules is not a cycle of logic;
    # every other circle is
    cycles = []
    for comp in _cycles(graph):
        real = [m for m in comp if not any(o != m and o.startswith(m + ".") for o in comp)]
        if len(real) > 1:
            cycles.append(comp)
    assert not cycles, f"import cycles: {cycles}"


def test_the_cycle_finder_finds_a_cycle():
    class Fake:
        modules = {"a", "b", "c"}

        @staticmethod
        def find_modules_directly_imported_by(m):
            return {"a": {"b"}, "b": {"a"}, "c": set()}[m]

    assert _cycles(Fake()) == [["a", "b"]]


def _private_violations(path: Path) -> list[str]:
    """``from svattn.x import _name``, ``import svattn.x._mod`` from outside x, and
    ``alias._name`` on an imported svattn module, in one source file."""
    me = _module_name(path)
    mine = {me} | {me.rsplit(".", k)[0] for k in range(1, me.count(".") + 1)}
    tree = ast.parse(path.read_text(), str(path))
    out, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith("svattn"):
            target = node.module
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if alias.name.startswith("_") and not alias.name.startswith("__") \
                        and target != me:
                    out.append(f"{me}: from {target} import {alias.name}")
                aliases[alias.asname or alias.name] = full
            targets = [target]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("svattn")]
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
        else:
            continue
        for t in targets:  # a private module, reached from outside its package
            parts = t.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and ".".join(parts[:i]) not in mine:
                    out.append(f"{me}: imports the private module {t}")
                    break
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            out.append(f"{me}: {node.value.id}.{node.attr} ({aliases[node.value.id]})")
    return out


def test_no_private_names_across_modules():
    bad = [v for p in sorted(SRC.rglob("*.py")) for v in _private_violations(p)]
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def test_the_private_name_check_sees_a_violation(tmp_path):
    fake = SRC / "exact" / "_probe_not_a_module.py"
    fake.write_text("from svattn.exact.core.state import _check\nimport svattn.nn._common as c\n"
                    "x = c._helper\n")
    try:
        got = _private_violations(fake)
    finally:
        fake.unlink()
    assert len(got) == 3, got


def _layer_contracts() -> dict[str, set[str]]:
    """Each container of a layer contract in pyproject.toml -> the names its layers list."""
    import tomllib

    config = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())
    out: dict[str, set[str]] = {}
    for contract in config["tool"]["importlinter"]["contracts"]:
        for container in contract.get("containers", []):
            names = {n.strip().strip("()") for layer in contract["layers"]
                     for n in layer.replace(":", "|").split("|")}
            out.setdefault(container, set()).update(names)
    return out


def _unlayered(contracts: dict[str, set[str]]) -> list[str]:
    """The modules and packages directly inside a contract's container that no layer
    names (``svattn.exact.x`` for a file ``exact/x.py`` or a folder ``exact/x/``)."""
    out = []
    for container, names in sorted(contracts.items()):
        folder = SRC.parent.joinpath(*container.split("."))
        children = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | {
            p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
        out += [f"{container}.{c}" for c in sorted(children - names)]
    return out


def test_every_module_of_the_exact_core_has_a_layer():
    # a new module of svattn.exact (or of one of its packages) takes a place in the layer
    # contracts, and in docs/design.md's module map, before it is imported
    contracts = _layer_contracts()
    assert {"svattn.exact", "svattn.exact.core", "svattn.exact.backends",
            "svattn.exact.backends.compiled", "svattn.exact.operations",
            "svattn.exact.records", "svattn.exact.auditor"} <= set(contracts)
    assert not (bad := _unlayered(contracts)), f"modules in no layer contract: {bad}"


def test_every_module_of_the_model_and_the_mixers_has_a_layer():
    # issue #38 split the stream (stream, stream_folder) and the mixers' inference state
    # (state, hybrid_state) into modules: their order is declared like the exact core's
    contracts = _layer_contracts()
    assert {"svattn.lm", "svattn.mixers"} <= set(contracts)
    assert not (bad := _unlayered(contracts)), f"modules in no layer contract: {bad}"


def test_the_layer_check_sees_a_module_without_a_layer():
    probes = [SRC / "exact" / "_probe_not_a_module.py",
              SRC / "exact" / "records" / "_probe_not_a_module.py"]
    for fake in probes:
        fake.write_text("")
    try:
        got = _unlayered(_layer_contracts())
    finally:
        for fake in probes:
            fake.unlink()
    assert got == ["svattn.exact._probe_not_a_module",
                   "svattn.exact.records._probe_not_a_module"], got


def test_modules_of_the_exact_core_are_small():
    big = {str(p.relative_to(SRC)): n for p in (SRC / "exact").rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 700}
    assert not big, f"modules of svattn.exact over 700 lines: {big}"


def test_svddmemory_is_orchestration():
    path = SRC / "exact" / "memory.py"
    cls = next(n for n in ast.parse(path.read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "SVDDMemory")
    assert cls.end_lineno - cls.lineno + 1 < 700


# The solver state stays inside svattn.exact: its consumers (the estimator, the LM, the
# benchmarks and scripts) read SVDDMemory's properties and its read-only ``view``
# (svattn.exact.view.MemoryView). ``instrument`` hands the state to the benchmarks that
# time the core's kernels or A/B a solver setting: those listed here, and only them.
REPO = SRC.parents[1]
INSTRUMENTED = {"benchmarks/ab_jumps.py", "benchmarks/attack_ill_border_ahead.py",
                "benchmarks/bench_erase.py",
                "benchmarks/bench_stream_speed.py", "benchmarks/bench_tied_uniqueness.py",
                "benchmarks/profile_forget_parts.py"}


def _state_readers(path: Path) -> list[str]:
    """``x.solver_state`` (or ``getattr(x, "solver_state")``) and calls of
    ``instrument``, in one source file, as ``"path:line: what"``."""
    where = path.relative_to(REPO).as_posix()
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "solver_state":
            out.append(f"{where}:{node.lineno}: .solver_state")
        elif isinstance(node, ast.Constant) and node.value == "solver_state":
            out.append(f"{where}:{node.lineno}: 'solver_state'")
        elif (isinstance(node, ast.Call) and where not in INSTRUMENTED
              and getattr(node.func, "id", getattr(node.func, "attr", None)) == "instrument"):
            out.append(f"{where}:{node.lineno}: instrument()")
    return out


def _outside_the_core() -> list[Path]:
    roots = [REPO / "benchmarks", REPO / "scripts", SRC]
    return sorted(p for r in roots if r.is_dir() for p in r.rglob("*.py")
                  if (SRC / "exact") not in p.parents)


def test_the_solver_state_is_read_only_inside_the_exact_core():
    bad = [v for p in _outside_the_core() for v in _state_readers(p)]
    assert not bad, ("the solver state read outside svattn.exact (use SVDDMemory.view):\n"
                     + "\n".join(bad))


def test_the_solver_state_check_sees_a_reader():
    fake = SRC / "_probe_not_a_module.py"
    fake.write_text("a = mem.solver_state.nS\nb = getattr(mem, 'solver_state')\n"
                    "from svattn.exact.view import instrument\nc = instrument(mem)\n"
                    "d = mem.view.n_margin\n")
    try:
        got = _state_readers(fake)
    finally:
        fake.unlink()
    assert len(got) == 3, got
