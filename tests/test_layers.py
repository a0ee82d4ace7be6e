"""The layer map (issue 34, docs/DESIGN.md): zero cycles, zero upward imports, no module over 500 lines.

Read from the source (the AST): every import counts, at the top of a module or inside a function, and a
relative import is resolved to the module it names. The map below is the data; a module it does not name
is a verb. A violation that must wait is listed in NOT_YET (empty now), so the check fails on any new one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500

GROUND, STORE, RULES, VERBS, SURFACES = range(5)
# the map, bottom up (a module not named here, nor under a named package, is a verb)
GROUND_MODULES = {"synapolis", "synapolis.errors", "synapolis.timeutil", "synapolis.names", "synapolis.paths",
                  "synapolis.atomic", "synapolis.schemas", "synapolis.terminal", "synapolis.pathpatterns",
                  "synapolis.pgurl", "synapolis.config", "synapolis.project", "synapolis.heartbeat",
                  "synapolis.watching"}
RULES_MODULES = {"synapolis.status"}
PACKAGES = (("synapolis.atomic", GROUND), ("synapolis.store", STORE), ("synapolis.rules", RULES),
            ("synapolis.cli", SURFACES), ("synapolis.mcp", SURFACES), ("synapolis.web", SURFACES),
            ("synapolis.harness", SURFACES), ("synapolis.__main__", SURFACES))

# Violations not fixed yet, each one on its own as the check prints it ("a -> b" an import, "a: N lines" a size).
# Empty since the store and verbs branches of issue 34 met: keep it so; an entry is a debt with a reason beside it.
NOT_YET: set[str] = set()


def layer_of(module: str) -> int:
    if module in GROUND_MODULES:
        return GROUND
    if module in RULES_MODULES:
        return RULES
    for package, rank in PACKAGES:
        if module == package or module.startswith(package + ".") or module.startswith(package + "_"):
            return rank
    return VERBS


def may_import(importer: int, imported: int) -> bool:
    """Its own rank or lower; a rule (a pure decision) only the ground, never the store."""
    return imported <= importer and not (importer == RULES and imported == STORE)


def modules_of(root: Path) -> dict[str, Path]:
    """{dotted name: file} of every module of the package at `root` (a package is its __init__)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path, known) -> set[str]:
    """The modules of `known` that `module` imports anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()

    def add(name: str) -> None:
        while name and name not in known:  # `import a.b.c` of a name that is no module: its nearest module
            name = name.rpartition(".")[0]
        if name:
            found.add(name)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                add(submodule if submodule in known else origin)
    found.discard(module)
    return {name for name in found if name.split(".")[0] == known_root(known)}


def known_root(known) -> str:
    return min(known, key=len).split(".")[0]


def graph_of(root: Path) -> tuple[dict[str, set[str]], dict[str, Path]]:
    files = modules_of(root)
    return {module: imports_of(module, path, files) for module, path in files.items()}, files


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def violations(root: Path, allowed=frozenset()) -> list[str]:
    """Every upward import, every import inside a cycle and every module over MAX_LINES lines, except those
    `allowed`; a cycle is judged on the graph without the allowed imports."""
    graph, files = graph_of(root)
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if not may_import(layer_of(module), layer_of(target)):
                found.append(f"{module} -> {target}")
    kept = {module: {t for t in targets if f"{module} -> {t}" not in allowed} for module, targets in graph.items()}
    for component in cycles_of(kept):
        members = set(component)
        found.extend(f"{module} -> {target}" for module in component for target in sorted(kept[module] & members)
                     if f"{module} -> {target}" not in found)
    for module, path in sorted(files.items()):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            found.append(f"{module}: {lines} lines")
    return [entry for entry in found if _key(entry) not in {_key(a) for a in allowed}]


def _key(entry: str) -> str:
    return entry.split(":")[0] if entry.endswith(" lines") else entry


def test_no_new_upward_import_cycle_or_long_module():
    found = violations(ROOT / "synapolis", frozenset(NOT_YET))
    assert not found, "layer violations (docs/DESIGN.md, the layers):\n" + "\n".join(found)


def test_not_yet_lists_only_what_is_still_there():
    """An entry that is fixed leaves NOT_YET, so it cannot come back unnoticed."""
    still = {_key(entry) for entry in violations(ROOT / "synapolis")}
    gone = sorted(entry for entry in NOT_YET if _key(entry) not in still)
    assert not gone, "fixed: remove from NOT_YET:\n" + "\n".join(gone)


def test_the_map_names_modules_that_exist():
    """A module renamed or split away from the map's name would quietly become a verb: the map follows it."""
    _graph, files = graph_of(ROOT / "synapolis")
    assert sorted((GROUND_MODULES | RULES_MODULES) - set(files)) == []


def test_the_store_imports_only_the_ground():
    graph, _files = graph_of(ROOT / "synapolis")
    upward = sorted(f"{module} -> {target}" for module, targets in graph.items() if layer_of(module) == STORE
                    for target in targets if layer_of(target) > STORE)
    assert not upward


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "synapolis"


@pytest.mark.parametrize("planted, expected", [
    # an import inside a function, relative, from the store up to a verb
    ({"synapolis/store/base.py": "def f():\n    from ..claims import x\n"}, "synapolis.store.base -> synapolis.claims"),
    # a cycle between two verbs, one through `from . import module`
    ({"synapolis/claims.py": "from . import board\n", "synapolis/board.py": "import synapolis.claims\n"},
     "synapolis.board -> synapolis.claims"),
    # a rule reaching the store through its package
    ({"synapolis/status.py": "from .store import store_for\n"}, "synapolis.status -> synapolis.store"),
    ({"synapolis/claims.py": "x = 1\n" * (MAX_LINES + 1)}, f"synapolis.claims: {MAX_LINES + 1} lines"),
])
def test_the_check_finds_what_it_is_for(tmp_path, planted, expected):
    base = {"synapolis/__init__.py": "", "synapolis/store/__init__.py": "", "synapolis/store/base.py": "",
            "synapolis/claims.py": "", "synapolis/board.py": "", "synapolis/status.py": "",
            "synapolis/errors.py": ""}
    root = _write(tmp_path, {**base, **planted})
    assert expected in violations(root)
    assert not violations(_write(tmp_path / "clean", base))
