"""What the README states in words holds in the code (issue 32): the claim item rule (every example it gives is
valid and is a name or a path pattern as it says; the length, the start characters and the forbidden segments
are what validate_claim_item enforces), and the documentation index links every page under docs/ and nothing
missing; LICENSE is the licence pyproject.toml names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT
from synapolis.errors import UsageError
from synapolis.names import MAX_ITEM, is_name, validate_claim_item

README = (Path(ROOT) / "README.md").read_text("utf-8")


def paragraph(start: str) -> str:
    found = re.search(rf"^{re.escape(start)}.*?(?:\n\n|\Z)", README, re.S | re.M)
    assert found, f"the README has no paragraph starting {start!r}"
    return " ".join(found.group(0).split())


def test_the_claim_item_rule_in_words_is_the_rule_in_the_code():
    rule = paragraph("Claim items (`ITEM`)")
    assert int(re.search(r"at most (\d+) characters", rule).group(1)) == MAX_ITEM
    validate_claim_item("a" * MAX_ITEM)
    with pytest.raises(UsageError):
        validate_claim_item("a" * (MAX_ITEM + 1))
    names = re.findall(r"`([^`]+)`", re.search(r"is one word \((.*?)\) is a \*\*name\*\*", rule).group(1))
    patterns = re.findall(r"`([^`]+)`", re.search(r"relative to the project root \((.*?)\)", rule).group(1))
    assert names == ["task:1234", "db:staging"] and len(patterns) >= 4, (names, patterns)
    for item in names:
        assert validate_claim_item(item) == item and is_name(item), item
    for item in patterns:
        assert validate_claim_item(item) == item and not is_name(item), item
    # the characters it lists, and the start characters it lists; nothing else
    listed = re.search(r"made of letters, digits and `([^`]+)`, plus `([^`]+)`", rule)
    allowed = set(listed.group(1).replace(" ", "")) | set(listed.group(2).replace(" ", ""))
    for ch in allowed:
        validate_claim_item({"[": "a[b]", "/": "a/b"}.get(ch, f"a{ch}b"))
    for ch in "!#$%&'(),;<=>\\^`{|}~ \"":
        with pytest.raises(UsageError):
            validate_claim_item(f"a{ch}b")
    starts = re.search(r"they start with a letter, a digit, `(.)`, `(.)` or one of `([^`]+)`", rule)
    for ch in [starts.group(1), starts.group(2), *starts.group(3).split()]:
        validate_claim_item(f"{ch}x]" if ch == "[" else f"{ch}x")
    for ch in ":/@+-":
        with pytest.raises(UsageError):
            validate_claim_item(f"{ch}x")
    assert "no `//` and no `.` or `..` segment" in rule
    for bad in ("src//a.py", "src/./a.py", "src/../a.py", "./src", "..", "."):
        with pytest.raises(UsageError):
            validate_claim_item(bad)


def test_the_documentation_index_links_every_page_and_only_pages_that_exist():
    index = README.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\(([^)#]+)\)", index))
    pages = {f"docs/{p.name}" for p in (Path(ROOT) / "docs").glob("*.md")}
    assert pages and pages <= linked, sorted(pages - linked)
    assert all((Path(ROOT) / target).is_file() for target in linked), sorted(linked)


def test_the_license_is_the_one_pyproject_names():
    pyproject = (Path(ROOT) / "pyproject.toml").read_text("utf-8")
    named = re.search(r'^license = \{ text = "([^"]+)" \}', pyproject, re.M).group(1)
    assert (Path(ROOT) / "LICENSE").read_text("utf-8").startswith(f"{named} License")
    assert "[LICENSE](LICENSE)" in README
