"""Path patterns (contract §14): matching and the overlap decision, against pathspec as an independent oracle.

The oracle: our pattern P matches a path when git's own rules (pathspec, with P anchored at the root as
`/P`) match the path or one of its leading folders, since a claim holds everything under what it matches.
"Never missed" is shown by brute force: for random pattern pairs over a small alphabet, every pair
`overlaps` calls free has no common matching path among all paths of up to three short segments; and
every pair it calls overlapping comes with a path that the oracle says matches both.
"""

from __future__ import annotations

import random
import re

import pytest

from synapolis.names import is_name
from synapolis.pathpatterns import (GLOBSTAR, PatternError, common_path, compile_pattern, literal_prefix,
                                    matches, overlaps, prefixes_of)

pathspec = pytest.importorskip("pathspec")


_EXACT: dict = {}


def _exact(line: str):
    """git's glob of `line` (anchored: `/...`) as pathspec translates it, matching whole paths only: pathspec
    ends each regex with `(?:/|$)` (what lies under a match is ignored too) or `/?$`, cut to `$` here."""
    found = _EXACT.get(line)
    if found is None:
        regex = pathspec.PathSpec.from_lines("gitignore", [line]).patterns[0].regex.pattern
        for tail in ("(?:/|$)", "/?$"):  # (a last segment `*` ends in `/?$`: a folder named by its slash)
            if regex.endswith(tail):
                regex = regex[:-len(tail)] + "$"
                break
        else:
            if regex != ".":  # `**/*` and the like: every path
                raise AssertionError(f"pathspec's regex of {line} has a new shape: {regex}")
        found = _EXACT[line] = re.compile(regex)
    return found


def oracle(pattern: str, path: str, fold: bool = False) -> bool:
    """The contract's reading of `pattern` through pathspec's globs: a folder pattern (a trailing `/` or
    `/**`) matches the folder and everything under it, any other pattern whole paths."""
    if fold:
        pattern, path = pattern.lower(), path.lower()
    folder = pattern.endswith("/") or pattern == "**" or pattern.endswith("/**")
    parts = [p for p in pattern.split("/") if p]
    while folder and parts and parts[-1] == "**":
        parts.pop()
    if not parts:
        return True
    regex = _exact("/" + "/".join(parts))
    candidates = prefixes_of(path)[1:] if folder else [path]
    return any(regex.match(candidate) for candidate in candidates)


# -- the table of §14 and the edges --------------------------------------------------------------------

TABLE = [
    ("src/api/**", "src/api/users.py", True),
    ("src/*.py", "src/main.py", True),
    ("**/*.md", "docs/api.md", True),
    ("src/api/*.py", "src/api/v2/x.py", False),
    ("docs/**", "src/**", False),
    # a folder two ways, and everything under it; without them a pattern matches whole paths only
    ("src/api/", "src/api/users.py", True), ("src/api/**", "src/api", True), ("src/api/", "src/apiary/x.py", False),
    ("src/api", "src/api/v2/x.py", False), ("src/a.py", "**/*.md", False), ("src/a.py", "src/a.py", True),
    # anchored at the project root, unlike a .gitignore line
    ("*.md", "docs/api.md", False), ("*.md", "README.md", True),
    ("**", "anything/at/all", True), ("**", "**", True), ("**/x", "a/b/x", True), ("a/**/b", "a/b", True),
    ("a/**/b", "a/x/y/b", True), ("a/**/b", "c/x/b", False), ("a/**/b", "a/x/y/c", False),
    ("a/**/b/", "a/x/b/c/d", True), ("a/**/b", "a/x/b/c/d", False),
    ("src/*.py", "src/a/b.py", False), ("src/*", "src/a/b.py", False), ("src/*/", "src/a/b.py", True),
    ("src/[ab].py", "src/c.py", False), ("src/[a-c].py", "src/?.py", True), ("src/[ab]x", "src/[bc]x", True),
    ("src/[a]x", "src/[b]x", False), ("a*b", "*c", False), ("a*", "*b", True), ("a**b", "ab", True),
    ("x?z", "xyz", True), ("x?z", "xz", False), (".github/workflows/ci.yml", ".github/**", True),
    ("ticket:142", "ticket:142", True),
]


@pytest.mark.parametrize("a,b,expected", TABLE)
def test_the_overlap_table(a, b, expected):
    assert overlaps(a, b) is expected
    assert overlaps(b, a) is expected
    witness = common_path(compile_pattern(a), compile_pattern(b))
    assert (witness is not None) is expected
    if expected:
        assert oracle(a, witness) and oracle(b, witness), witness


def test_case_is_folded_only_when_asked():
    assert not overlaps("Src/API/**", "src/api/users.py")
    assert overlaps("Src/API/**", "src/api/users.py", fold=True)
    assert overlaps("src/[A-C].py", "src/b.py", fold=True) and not overlaps("src/[A-C].py", "src/b.py")
    assert matches(compile_pattern("README.MD", True), "readme.md")


def test_matching_a_path():
    pat = compile_pattern("src/api/*.py")
    assert matches(pat, "src/api/users.py") and not matches(pat, "src/api/v2/x.py") and not matches(pat, "src/api")
    # a path is text, never a pattern: a file named with brackets is matched literally
    assert matches(compile_pattern("src/*.py"), "src/a[1].py")
    assert matches(compile_pattern("src/a.py"), "src/a.py") and not matches(compile_pattern("src/a.py"), "src/a.pyc")
    assert matches(compile_pattern("**"), "x") and matches(compile_pattern("src/"), "src/deep/er/file")
    assert not matches(compile_pattern("src"), "src/deep") and matches(compile_pattern("src"), "src")


def test_names_and_prefixes():
    assert is_name("ticket:142") and is_name("pr-7:review") and not is_name("src/a:b.py")
    assert not is_name(".x:y") and not is_name(":x") and not is_name("src/api/**")
    assert literal_prefix("src/api/*.py") == "src/api" and literal_prefix("**/*.md") == ""
    assert literal_prefix("src/api/") == "src/api" and literal_prefix("src/[ab]/x") == "src"
    assert prefixes_of("a/b/c.py") == ["", "a", "a/b", "a/b/c.py"]
    assert compile_pattern("a/**/**/b/**") == ("a", GLOBSTAR, "b", GLOBSTAR)
    assert compile_pattern("a/**/b") == ("a", GLOBSTAR, "b") and compile_pattern("**") == (GLOBSTAR,)


@pytest.mark.parametrize("bad", ["src/[ab", "[", "src/[z-a].py", "x/[]"])
def test_unreadable_patterns(bad):
    with pytest.raises(PatternError):
        compile_pattern(bad)


# -- the property tests: random patterns against brute force ---------------------------------------------

TOKENS = ["a", "b", "*", "?", "[ab]", "[b]", "[a-b]", "a*", "*b", "[]a]"]


def _segment(rng: random.Random) -> str:
    if rng.random() < 0.2:
        return "**"
    return "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 3)))


def _pattern(rng: random.Random) -> str:
    out = "/".join(_segment(rng) for _ in range(rng.randint(1, 3)))
    return out + ("/" if rng.random() < 0.1 else "")


def _universe() -> list[str]:
    segs = [""]
    words = []
    for _ in range(3):
        segs = [s + c for s in segs for c in "ab]"]
        words += segs
    words = [w for w in words if len(w) <= 2]
    paths = list(words)
    level = list(words)
    for _ in range(2):
        level = [p + "/" + w for p in level for w in words]
        paths += level
    return paths


UNIVERSE = _universe()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matching_agrees_with_pathspec(seed):
    rng = random.Random(seed)
    for _ in range(40):
        pattern = _pattern(rng)
        compiled = compile_pattern(pattern)
        for path in UNIVERSE:
            assert matches(compiled, path) == oracle(pattern, path), (pattern, path)


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_a_pair_reported_free_never_has_a_common_path(seed):
    rng = random.Random(seed)
    patterns = sorted({_pattern(rng) for _ in range(75)})
    matched = {p: frozenset(x for x in UNIVERSE if oracle(p, x)) for p in patterns}
    free = overlapping = 0
    for i, a in enumerate(patterns):
        for b in patterns[i:]:
            witness = common_path(compile_pattern(a), compile_pattern(b))
            if witness is None:
                free += 1
                both = matched[a] & matched[b]
                assert not both, f"{a} and {b} were called free, yet both match {sorted(both)[:3]}"
            else:
                overlapping += 1
                # exact the other way too: the path it found matches both, by git's own rules
                assert oracle(a, witness) and oracle(b, witness), (a, b, witness)
    assert free > 100 and overlapping > 100  # the generator gives both kinds in numbers


@pytest.mark.parametrize("seed", [21, 22])
def test_folded_overlap_agrees_with_lowercased_brute_force(seed):
    rng = random.Random(seed)
    upper = str.maketrans("ab", "AB")
    for _ in range(300):
        a, b = _pattern(rng), _pattern(rng).translate(upper) if rng.random() < 0.5 else _pattern(rng)
        witness = common_path(compile_pattern(a, True), compile_pattern(b, True))
        if witness is None:
            assert not any(oracle(a, x, True) and oracle(b, x, True) for x in UNIVERSE), (a, b)
        else:
            assert oracle(a, witness, True) and oracle(b, witness, True), (a, b, witness)
