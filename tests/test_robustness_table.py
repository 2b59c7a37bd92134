"""docs/robustness.md names, for each class of bad input, each rule of the
report and each rule behind its numbers, the test that checks it: every test
it names must exist, with the case it names, so the tables cannot drift from
the suite."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "robustness.md"
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)(?:\[([^\]]+)\])?`")


def references() -> list[tuple[str, str, str | None]]:
    return REFERENCE.findall(TABLE.read_text())


def test_the_table_names_a_test_on_every_row():
    """Every row of each table (its header is the line above `|---|`)."""
    lines = TABLE.read_text().splitlines()
    headers = {i - 1 for i, line in enumerate(lines) if line.startswith("|---")}
    rows = [line for i, line in enumerate(lines) if line.startswith("| ") and i not in headers]
    assert len(rows) >= 20
    assert all(REFERENCE.search(row) for row in rows), [row for row in rows if not REFERENCE.search(row)]


@pytest.mark.parametrize("path,name,case", references(), ids=lambda v: str(v))
def test_each_named_test_exists(path, name, case):
    source = (ROOT / path).read_text()
    assert re.search(rf"^def {name}\(", source, re.M), f"{path} has no {name}"
    if case:  # a parametrize id: a case key, a param id or a parametrized value
        assert f'"{case}"' in source or f"'{case}'" in source, f"{path} has no case {case!r}"
