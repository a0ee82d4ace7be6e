"""Path patterns as claim items (contract §2, §14): names vs patterns, parsing, matching and the exact overlap decision.

Pure functions, no file system. A pattern is gitignore-style and anchored at the project root:

- segments are separated by `/`; `*` matches any run of characters within one segment, `?` one
  character, `[abc]` / `[a-z]` one of a set (no negation: `!` and `^` are not item characters);
- a segment that is exactly `**` matches any number of segments, none included; a `**` that is
  part of a longer segment (`a**b`) is two `*` (git does the same);
- a trailing `/` or `/**` means the folder and everything under it: `src/api/` and `src/api/**` both
  hold `src/api` and every path below it. Any other pattern matches whole paths only: `src/*.py` holds
  `src/main.py`, not `src/lib/x.py`; a literal `src/api` is the one path `src/api` (the CLI writes
  `src/api/` for a claim of an existing folder, synapolis.project.normalize_item).

Unlike a .gitignore line, a pattern without a slash is not matched at every depth: `*.md` is the
Markdown files at the root; write `**/*.md` for all of them (a claim is relative to the project).

Two patterns overlap when some path matches both. `common_path` decides it exactly by walking both
patterns at once, segment by segment, and within a segment character by character (the product of
the two automatons), and returns such a path. The one approximation, always towards "overlaps":
a segment glob that can only match `.` or `..` (`[.]`, `[.][.]`) is taken as matching that segment,
though no real path has it.

The matcher here is our own rather than `pathspec`: that library costs some 40 ms of imports (four
times a bare `python -c pass`), and the guard runs in a harness hook on every edit. The tests check
both functions against `pathspec` as an independent oracle (tests/test_pathpatterns.py).
"""

from __future__ import annotations

GLOBSTAR = "**"  # a segment matching any number of segments
_STAR = 0  # a token: any run of characters within a segment
_ANY = 1  # a token: any one character (`?`)
_WILD = "*?["


class PatternError(ValueError):
    """A path pattern that cannot be read (an unclosed `[`, an empty range)."""


def has_wildcards(text: str) -> bool:
    return any(ch in text for ch in _WILD)


def _class(segment: str, start: int, fold: bool) -> tuple[frozenset, int]:
    """The set of `[...]` opening at `start`, and the index after its `]`."""
    i = start + 1
    members: set[str] = set()
    first = True
    while True:
        if i >= len(segment):
            raise PatternError(f"'[' at character {start + 1} of segment {segment!r} is never closed by ']'")
        ch = segment[i]
        if ch == "]" and not first:
            break
        if i + 2 < len(segment) and segment[i + 1] == "-" and segment[i + 2] != "]":
            low, high = ch, segment[i + 2]
            if ord(low) > ord(high):
                raise PatternError(f"the range {low}-{high} in segment {segment!r} is empty")
            members.update(chr(c) for c in range(ord(low), ord(high) + 1))
            i += 3
        else:
            members.add(ch)
            i += 1
        first = False
    if fold:
        members = {c.lower() for c in members}
    return frozenset(members), i + 1


def _segment(segment: str, fold: bool):
    """A literal segment stays a str; a glob becomes a tuple of tokens (_STAR, _ANY or a frozenset)."""
    if not has_wildcards(segment):
        return segment.lower() if fold else segment
    tokens: list = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            if not tokens or tokens[-1] is not _STAR:  # `**` inside a segment is one `*`
                tokens.append(_STAR)
            i += 1
        elif ch == "?":
            tokens.append(_ANY)
            i += 1
        elif ch == "[":
            members, i = _class(segment, i, fold)
            tokens.append(members)
        else:
            tokens.append(frozenset((ch.lower() if fold else ch,)))
            i += 1
    return tuple(tokens)


def is_folder(pattern: str) -> bool:
    """Whether the pattern names a folder and everything under it (a trailing `/` or `/**`)."""
    return pattern.endswith("/") or pattern == GLOBSTAR or pattern.endswith("/" + GLOBSTAR)


_COMPILED: dict = {}  # (pattern, fold) -> compile_pattern's answer; a long-lived server keeps at most _KEEP
_KEEP = 50_000


def compile_pattern(pattern: str, fold: bool = False) -> tuple:
    """The pattern as a tuple of segments (str literal, token tuple, or GLOBSTAR); a folder pattern ends in
    GLOBSTAR (everything under it). `fold`: compare without case (a case-insensitive file system)."""
    found = _COMPILED.get((pattern, fold))
    if found is None:
        if len(_COMPILED) >= _KEEP:
            _COMPILED.clear()
            _REGEX.clear()
        found = _COMPILED[(pattern, fold)] = _compile(pattern, fold)
    return found


def _compile(pattern: str, fold: bool) -> tuple:
    folder = is_folder(pattern)
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    while folder and parts and parts[-1] == GLOBSTAR:
        parts.pop()
    out: list = []
    for part in parts:
        if part == GLOBSTAR:
            if out and out[-1] is GLOBSTAR:
                continue  # `**/**` is one `**`
            out.append(GLOBSTAR)
        else:
            out.append(_segment(part, fold))
    if folder and (not out or out[-1] is not GLOBSTAR):
        out.append(GLOBSTAR)
    return tuple(out)


def check_pattern(pattern: str) -> None:
    """PatternError when the pattern cannot be read."""
    compile_pattern(pattern)


def literal_prefix(pattern: str, fold: bool = False) -> str:
    """The leading literal segments, joined by `/` ("" when the first segment is a glob): every path the
    pattern matches starts with them, which is what the claims index is keyed by."""
    out = []
    for seg in compile_pattern(pattern, fold):
        if not isinstance(seg, str) or seg is GLOBSTAR:
            break
        out.append(seg)
    return "/".join(out)


def prefixes_of(path: str) -> list[str]:
    """"" and every leading run of segments of `path` ("a", "a/b", "a/b/c.py"): the literal prefixes a
    pattern matching `path` can have."""
    out = [""]
    at = -1
    while True:
        at = path.find("/", at + 1)
        if at < 0:
            out.append(path)
            return out
        out.append(path[:at])


# --- one segment -------------------------------------------------------------------------------

def _token_has(token, ch: str) -> bool:
    return token is _ANY or ch in token


def _glob_match(tokens: tuple, text: str) -> bool:
    """Whether a glob segment matches the whole of `text` (non-empty, no `/`)."""
    # the classic two-pointer walk with one backtrack point per `*` (linear in practice)
    t = s = 0
    star_t, star_s = -1, 0
    while s < len(text):
        if t < len(tokens) and tokens[t] is not _STAR and _token_has(tokens[t], text[s]):
            t += 1
            s += 1
        elif t < len(tokens) and tokens[t] is _STAR:
            star_t, star_s = t, s
            t += 1
        elif star_t >= 0:
            star_s += 1
            s = star_s
            t = star_t + 1
        else:
            return False
    while t < len(tokens) and tokens[t] is _STAR:
        t += 1
    return t == len(tokens)


def segment_match(seg, text: str) -> bool:
    return seg == text if isinstance(seg, str) else _glob_match(seg, text)


def _meet(a, b):
    """The characters two tokens (_ANY or a set) both take: _ANY, or a set (maybe empty)."""
    if a is _ANY:
        return b
    if b is _ANY:
        return a
    return a & b


def _pick(token) -> str:
    if token is _ANY:
        return "x"
    return min(token)


def _common_segment(a: tuple, b: tuple) -> str | None:
    """A non-empty string both glob segments match, or None."""
    memo: dict = {}

    def walk(i: int, j: int, nonempty: bool) -> str | None:
        key = (i, j, nonempty)
        if key in memo:
            return memo[key]
        memo[key] = None  # a cycle (star against star) never helps: cut it
        found = None
        ta = a[i] if i < len(a) else None
        tb = b[j] if j < len(b) else None
        if ta is None and tb is None:
            found = "" if nonempty else None
        elif ta is _STAR and tb is _STAR:
            found = walk(i + 1, j, nonempty)
            if found is None:
                found = walk(i, j + 1, nonempty)
            if found is None and not nonempty:
                rest = walk(i, j, True)
                found = None if rest is None else "x" + rest
        elif ta is _STAR:
            found = walk(i + 1, j, nonempty)
            if found is None and tb is not None:
                rest = walk(i, j + 1, True)
                found = None if rest is None else _pick(tb) + rest
        elif tb is _STAR:
            found = walk(i, j + 1, nonempty)
            if found is None and ta is not None:
                rest = walk(i + 1, j, True)
                found = None if rest is None else _pick(ta) + rest
        elif ta is not None and tb is not None:
            both = _meet(ta, tb)
            if both is _ANY or both:
                rest = walk(i + 1, j + 1, True)
                found = None if rest is None else _pick(both) + rest
        memo[key] = found
        return found

    return walk(0, 0, False)


def _witness_segment(seg) -> str:
    """Some text a glob segment matches."""
    if isinstance(seg, str):
        return seg
    found = _common_segment(seg, (_STAR,))
    return found if found is not None else "x"


def common_segment(a, b) -> str | None:
    """A segment text both match, or None (both are str literals or token tuples, not GLOBSTAR)."""
    if isinstance(a, str):
        return a if segment_match(b, a) else None
    if isinstance(b, str):
        return b if _glob_match(a, b) else None
    return _common_segment(a, b)


# --- whole patterns ------------------------------------------------------------------------------

_REGEX: dict = {}  # compiled pattern -> its regular expression (json has loaded `re` already)


def _token_regex(token) -> str:
    import re

    if token is _STAR:
        return "[^/]*"
    if token is _ANY:
        return "[^/]"
    chars = sorted(token)
    if not chars:
        return "(?!)"
    return re.escape(chars[0]) if len(chars) == 1 else "[" + "".join(re.escape(c) for c in chars) + "]"


def _regex(compiled: tuple):
    """The compiled pattern as one regular expression over a whole path (made once per pattern)."""
    found = _REGEX.get(compiled)
    if found is not None:
        return found
    import re

    folder = bool(compiled) and compiled[-1] is GLOBSTAR
    body = compiled[:-1] if folder else compiled
    parts = []
    for i, seg in enumerate(body):
        last = i == len(body) - 1
        if seg is GLOBSTAR:
            parts.append("(?:[^/]+/)*")  # any number of whole segments, each followed by its slash
            continue
        text = re.escape(seg) if isinstance(seg, str) else "".join(_token_regex(t) for t in seg)
        parts.append(text + ("" if last else "/"))
    text = "".join(parts)
    if folder:  # the folder itself, or anything under it; everything when the pattern is only `**`
        text = text + "(?:/.*)?" if body else "[^/].*"
    found = _REGEX[compiled] = re.compile(text, re.DOTALL)
    return found


def matches(compiled: tuple, path: str) -> bool:
    """Whether the compiled pattern matches `path` (normalised, relative, segments joined by `/`)."""
    body, folder = (compiled[:-1], True) if compiled and compiled[-1] is GLOBSTAR else (compiled, False)
    if GLOBSTAR not in body and all(isinstance(s, str) for s in body):
        literal = "/".join(body)
        if not folder:
            return path == literal
        return literal == "" or path == literal or path.startswith(literal + "/")
    return _regex(compiled).fullmatch(path) is not None


def common_path(a: tuple, b: tuple) -> str | None:
    """A path both compiled patterns match, or None when there is none (the overlap decision, exact but
    for the `.`-segment note in the module's docstring)."""
    memo: dict = {}

    def walk(i: int, j: int) -> list | None:
        key = (i, j)
        if key in memo:
            return memo[key]
        memo[key] = None  # globstar against globstar: a cycle that never helps
        sa = a[i] if i < len(a) else None
        sb = b[j] if j < len(b) else None
        found = None
        if sa is None and sb is None:
            found = []
        elif sa is GLOBSTAR and sb is GLOBSTAR:
            found = walk(i + 1, j)
            if found is None:
                found = walk(i, j + 1)
        elif sa is GLOBSTAR:
            found = walk(i + 1, j)
            if found is None and sb is not None:
                rest = walk(i, j + 1)
                found = None if rest is None else [_witness_segment(sb)] + rest
        elif sb is GLOBSTAR:
            found = walk(i, j + 1)
            if found is None and sa is not None:
                rest = walk(i + 1, j)
                found = None if rest is None else [_witness_segment(sa)] + rest
        elif sa is not None and sb is not None:
            seg = common_segment(sa, sb)
            if seg is not None:
                rest = walk(i + 1, j + 1)
                found = None if rest is None else [seg] + rest
        memo[key] = found
        return found

    found = walk(0, 0)
    if found is None:
        return None
    return "/".join(found) if found else "x"  # two patterns that match everything: any path


def overlaps(a: str, b: str, fold: bool = False) -> bool:
    """Whether some path matches both patterns (contract §14): `src/api/**` and `src/api/users.py` do,
    `docs/**` and `src/**` do not."""
    return common_path(compile_pattern(a, fold), compile_pattern(b, fold)) is not None


def overlaps_compiled(a: tuple, b: tuple) -> bool:
    """`overlaps` of two compiled patterns."""
    return common_path(a, b) is not None
