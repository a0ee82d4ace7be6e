"""The project a state directory guards (contract §14): its root, whether its file system ignores case, and paths
and claim items normalised relative to it."""

from __future__ import annotations

import os

from .errors import UsageError

_ROOTS: dict = {}  # state directory -> (project root, fold): found once per process
_FOLD: dict = {}


def find_root(state_dir: str) -> str:
    """The top of the git work tree that holds the state directory's parent, else that parent.

    Found by walking up to the nearest `.git` (a folder, or the file of a linked worktree or submodule)
    without running git: the hook runs this on every edit."""
    parent = os.path.dirname(os.path.abspath(state_dir))
    here = parent
    while True:
        if os.path.exists(os.path.join(here, ".git")):
            return here
        up = os.path.dirname(here)
        if up == here:
            return parent
        here = up


def ignores_case(root: str) -> bool:
    """Whether the file system under `root` ignores case: the same folder under its name with the case
    of its letters swapped is the same file (macOS and Windows by default; Linux not)."""
    found = _FOLD.get(root)
    if found is not None:
        return found
    here = root
    answer = False
    while True:
        base = os.path.basename(here)
        if base.lower() != base.upper():
            other = os.path.join(os.path.dirname(here), base.swapcase())
            try:
                answer = os.path.samefile(here, other)
            except OSError:
                answer = False
            break
        up = os.path.dirname(here)
        if up == here:
            break
        here = up
    _FOLD[root] = answer
    return answer


def project_of(ws) -> tuple[str, bool]:
    """(project root, fold case) of a workspace."""
    key = ws.files.root
    found = _ROOTS.get(key)
    if found is None:
        root = find_root(key)
        found = _ROOTS[key] = (root, ignores_case(root))
    return found


def _tidy(parts: list[str]) -> list[str]:
    """Drop empty and '.' segments (`./`, `//`), resolve '..' lexically; None when it climbs above the root."""
    out: list[str] = []
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
            continue
        out.append(part)
    return out


def relative_path(path: str, root: str, fold: bool = False) -> str | None:
    """`path` (absolute, or relative to the project root) as the normalised path relative to `root`: `./`
    and duplicate slashes dropped, `..` resolved, case folded when `fold`; None when it lies outside the
    project (or is the root itself). Lexical, as git compares paths: symlinks are not followed."""
    if not isinstance(path, str) or path == "" or "\0" in path:
        return None
    path = path.replace(os.sep, "/") if os.sep != "/" else path
    if os.path.isabs(path):
        rel = None
        for base in (root, os.path.realpath(root)):
            candidate = os.path.normpath(path)
            try:
                common = os.path.commonpath([candidate, base])
            except ValueError:  # another drive (Windows)
                continue
            if common == base:
                rel = os.path.relpath(candidate, base).replace(os.sep, "/")
                break
        if rel is None or rel == ".":
            return None
        path = rel
    parts = _tidy(path.split("/"))
    if not parts:
        return None
    out = "/".join(parts)
    return out.lower() if fold else out


def split_paths(ws, paths, keep_case: bool = False) -> tuple[list[tuple[str, str]], list[str]]:
    """([(path, its project-relative form)] for each of `paths` inside `ws`'s project, [the others]), in order.
    `keep_case`: never folded, even where this file system ignores case (for another machine to compare)."""
    root, fold = project_of(ws)
    fold = fold and not keep_case
    inside: list[tuple[str, str]] = []
    outside: list[str] = []
    for path in paths:
        rel = relative_path(path, root, fold)
        if rel is None:
            outside.append(path)
        else:
            inside.append((path, rel))
    return inside, outside


def normalize_item(ws, item: str) -> str:
    """A claim item as the store keeps it: a name as given; a path pattern with `./` and duplicate slashes
    dropped and an absolute path inside the project made relative (outside it: UsageError); a literal path
    naming a folder that exists in the project gets its trailing `/` (the folder and everything under it,
    which is what a person claiming `src/api` means). Case is kept (overlap is decided without case where
    the file system ignores it). Validation (names.validate_claim_item) comes after."""
    if not isinstance(item, str) or item == "":
        return item
    from .names import is_name
    from .pathpatterns import has_wildcards

    if is_name(item):
        return item
    item = _tidy_item(ws, item)
    if not item.endswith("/") and not has_wildcards(item) and ".." not in item.split("/"):
        root, _fold = project_of(ws)
        if os.path.isdir(os.path.join(root, item)):
            return item + "/"
    return item


def _tidy_item(ws, item: str) -> str:
    trailing = item.endswith("/") and item.strip("/") != ""
    if os.path.isabs(item):
        root, _fold = project_of(ws)
        rel = relative_path(item.rstrip("/") or "/", root)
        if rel is None:
            raise UsageError(f"claim item {item[:80]!r} is outside the project {root}: a path claim is "
                             "relative to the project root")
        return rel + ("/" if trailing else "")
    if "//" not in item and not item.startswith("./") and "/./" not in item and not item.endswith("/."):
        return item
    parts = [p for p in item.split("/") if p not in ("", ".")]
    if not parts:
        return item  # nothing left: validation says why
    return "/".join(parts) + ("/" if trailing else "")
