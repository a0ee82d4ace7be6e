"""No private API of a dependency (issue 16): synapolis/ and benchmarks/ never import a dependency's private
module or name, and never reach into another package's objects for an `_attribute`.

Read from the source (the AST, not a grep, so strings and comments never trip it). An `x._name` is ours only
when synapolis itself defines `_name`: on `self`/`cls`, in that class or a base class of ours (a subclass of an
SDK class does not inherit the right to its base's privates); on anything else, somewhere in synapolis, and
not also as a private of a dependency that file imports (where the two names meet, whose it is cannot be told
from the source). Python's own modules are out of this guard's scope (`os._exit` is public); a private stdlib
module is judged apart.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [ROOT / "synapolis", ROOT / "benchmarks"]
OURS = {"synapolis", "_common", "conftest"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _sources(*folders: Path) -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8"), str(path))
            for folder in folders for path in sorted(folder.rglob("*.py"))}


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return bool(top) and top not in OURS and top not in sys.stdlib_module_names


def _defined_privates(trees) -> set[str]:
    """Every private name a body of code defines: functions, classes, assigned names and attributes,
    arguments, and names spelled as strings (`__slots__`, `setattr`)."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    return {name for name in names if _private(name)}


def _class_privates(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> set[str]:
    """The privates `cls` defines, with those of its base classes that are ours (by name)."""
    names, seen, todo = set(), set(), [cls]
    while todo:
        current = todo.pop()
        if current.name in seen:
            continue
        seen.add(current.name)
        names |= _defined_privates([current])
        todo.extend(classes[b.id] for b in current.bases if isinstance(b, ast.Name) and b.id in classes)
    return names


def _stdlib_module_names(tree: ast.Module) -> set[str]:
    """Local names bound to a Python standard module by an import (`import os`, `import _ctypes`)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _third_party(alias.name) and alias.name.split(".")[0] not in OURS:
                    bound.add((alias.asname or alias.name).split(".")[0])
    return bound


def _imported_packages(tree: ast.Module) -> set[str]:
    """The third-party top-level packages one source imports."""
    tops = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops.update(a.name.split(".")[0] for a in node.names if _third_party(a.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _third_party(node.module):
            tops.add(node.module.split(".")[0])
    return tops


_PACKAGE_PRIVATES: dict[str, set[str]] = {}


def package_privates(top: str) -> set[str]:
    """The private names an installed package defines in its own source (none when it is not installed)."""
    if top not in _PACKAGE_PRIVATES:
        spec = importlib.util.find_spec(top)
        folders = [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
        _PACKAGE_PRIVATES[top] = _defined_privates(_sources(*folders).values()) if folders else set()
    return _PACKAGE_PRIVATES[top]


def private_api_uses(sources: dict[Path, ast.Module], privates_of=package_privates) -> list[str]:
    """Each place (file:line and what) where `sources` use a dependency's private module, name or attribute;
    `privates_of(package)` names the private names a third-party package defines."""
    defined = _defined_privates(sources.values())
    classes = {n.name: n for tree in sources.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    found = []
    for path, tree in sources.items():
        where = path.relative_to(ROOT)
        stdlib_names = _stdlib_module_names(tree)
        ours = defined.difference(*(privates_of(top) for top in _imported_packages(tree)))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _third_party(node.module):
                parts = node.module.split(".")[1:] + [a.name for a in node.names]
                if any(_private(part) for part in parts):
                    found.append(f"{where}:{node.lineno}: from {node.module} import "
                                 f"{', '.join(a.name for a in node.names)}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _third_party(alias.name) and any(_private(p) for p in alias.name.split(".")):
                        found.append(f"{where}:{node.lineno}: import {alias.name}")
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            own = _class_privates(cls, classes)
            for node in ast.walk(cls):
                if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                        and node.value.id in ("self", "cls") and node.attr not in own):
                    found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr} (not defined by {cls.name})")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _private(node.attr)):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue  # judged per class above
            if isinstance(node.value, ast.Name) and node.value.id in stdlib_names:
                continue  # Python's own modules: not this guard's business
            if node.attr not in ours:
                found.append(f"{where}:{node.lineno}: .{node.attr} (not defined by synapolis)")
    return sorted(set(found))


def test_no_private_api_of_a_dependency():
    assert private_api_uses(_sources(*SCANNED)) == []


@pytest.mark.parametrize("code, what", [
    ("from mcp.shared._httpx_utils import create_mcp_http_client\n", "from mcp.shared._httpx_utils import"),
    ("import mcp.shared._httpx_utils\n", "import mcp.shared._httpx_utils"),
    ("def f(server):\n    return server._lowlevel_server\n", "._lowlevel_server"),
    ("def f(ctx):\n    return ctx.request_context.session._connection\n", "._connection"),
    ("from mcp.server.mcpserver import MCPServer\nclass S(MCPServer):\n    def f(self):\n"
     "        return self._lowlevel_server\n", "self._lowlevel_server"),
])
def test_the_guard_sees_each_kind_of_reach(tmp_path, code, what):
    """What the guard exists for is caught: a private module, an SDK object's private attribute (also when a
    subclass reaches its SDK base's), and a private name of ours that is also the SDK's."""
    path = ROOT / "synapolis" / "_probe.py"  # a path under ROOT for the report; never written to disk
    sources = {path: ast.parse("import mcp\n" + code)}
    if what == "._connection":
        # ours too (a method of our own called `_connection`): a collision with the SDK's still counts
        sources[ROOT / "synapolis" / "_probe2.py"] = ast.parse("class T:\n    def _connection(self):\n        pass\n")
    found = private_api_uses(sources)
    assert any(what in line for line in found), found


def test_the_guard_leaves_our_own_privates_and_pythons_alone():
    code = ("import os\nclass A:\n    def __init__(self):\n        self._x = 1\n    def f(self):\n"
            "        return self._x + self._g()\n    def _g(self):\n        return 2\n"
            "def h(a):\n    os._exit(0)\n    return a._x\n")
    assert private_api_uses({ROOT / "synapolis" / "_probe.py": ast.parse(code)}) == []


# underscored, yet documented in the library reference with a stable interface (docs.python.org/3/library/_thread.html)
DOCUMENTED_PYTHON_MODULES = {"_thread"}


def private_python_modules(sources: dict[Path, ast.Module]) -> list[str]:
    """Each import of one of Python's private modules (`_sha256`, `_ctypes`, `_operator`): they are the C halves
    of public modules, renamed or changed without notice (`_sha256` became `_sha2` in 3.12)."""
    found = []
    for path, tree in sources.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if _private(top) and top in sys.stdlib_module_names and top not in DOCUMENTED_PYTHON_MODULES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    return sorted(found)


def test_no_private_module_of_python():
    assert private_python_modules(_sources(*SCANNED)) == []


def test_the_python_guard_sees_a_private_module_and_leaves_public_ones():
    probe = ROOT / "synapolis" / "_probe.py"
    code = "from __future__ import annotations\nimport os\nimport _thread\nimport hashlib\ntry:\n    from _sha256 import sha256\n" \
           "except ImportError:\n    import _ctypes\n"
    found = private_python_modules({probe: ast.parse(code)})
    assert sorted(line.split(": ")[1] for line in found) == ["_ctypes", "_sha256"], found
