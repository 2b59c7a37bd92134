"""The README's model-family table, rendered from tests/family_matrix.yaml (the
expectations tests/test_family_matrix.py checks), so the two cannot drift.

    .venv/bin/python scripts/family_table.py           # print the table
    .venv/bin/python scripts/family_table.py --write   # put it into README.md between the markers
    .venv/bin/python scripts/family_table.py --check   # exit 1 if README.md's table differs

Standard library and PyYAML only: it also loads the matrix for the test."""
import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MATRIX_FILE = ROOT / "tests" / "family_matrix.yaml"
README = ROOT / "README.md"
BEGIN, END = "<!-- family-matrix:begin -->", "<!-- family-matrix:end -->"
WORKS, REFUSED, CAPABILITY, SUSPECT = "works", "refused", "capability", "suspect"
QUANTIZE = "quantize"


class MatrixError(ValueError):
    """The matrix file or README is not as this script needs it (one line)."""


@dataclass(frozen=True)
class Reason:
    key: str
    phrase: str  # what the one-line answer contains; {architecture} filled in
    short: str   # what the README cell says


@dataclass(frozen=True)
class Expect:
    """One cell: works, refused (always, in one line), capability (the capability layer decides) or,
    for quantize, suspect (built and kept, but marked by quantize's sanity gate)."""
    kind: str
    reason: Reason | None = None

    def phrase(self, architecture: str) -> str:
        return self.reason.phrase.replace("{architecture}", architecture)


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str
    trait: str
    cells: dict  # recipe -> {stage ("quantize" or an engine) -> Expect}

    def expect(self, recipe: str, stage: str) -> Expect | None:
        """None: the stage is not asked (quantize refused the cell)."""
        return self.cells[recipe].get(stage)


@dataclass(frozen=True)
class Matrix:
    recipes: tuple[str, ...]
    engines: tuple[str, ...]
    families: dict  # name -> Family


def load(path: Path = MATRIX_FILE) -> Matrix:
    raw = yaml.safe_load(Path(path).read_text())
    reasons = {key: Reason(key, r["phrase"], r["short"]) for key, r in raw["reasons"].items()}
    recipes, engines = tuple(raw["recipes"]), tuple(raw["engines"])
    families = {name: Family(name, f["architecture"], f["trait"],
                             {recipe: _cell(f"{name}/{recipe}", f["cells"].get(recipe), engines, reasons)
                              for recipe in recipes})
                for name, f in raw["families"].items()}
    return Matrix(recipes, engines, families)


def _cell(where: str, raw, engines: tuple[str, ...], reasons: dict) -> dict:
    if not isinstance(raw, dict) or QUANTIZE not in raw:
        raise MatrixError(f"{MATRIX_FILE.name}: {where} needs a `quantize:` expectation")
    cell = {stage: _expect(f"{where}/{stage}", value, reasons) for stage, value in raw.items()}
    if cell[QUANTIZE].kind == CAPABILITY:
        raise MatrixError(f"{MATRIX_FILE.name}: {where}: `capability` is for engines, not quantize")
    suspect_engines = sorted(stage for stage, e in cell.items() if stage != QUANTIZE and e.kind == SUSPECT)
    if suspect_engines:
        raise MatrixError(f"{MATRIX_FILE.name}: {where}: `suspect` is for quantize, not {suspect_engines}")
    asked = set(engines) if cell[QUANTIZE].kind in (WORKS, SUSPECT) else set()
    if set(cell) - {QUANTIZE} != asked:
        raise MatrixError(f"{MATRIX_FILE.name}: {where} gives engines {sorted(set(cell) - {QUANTIZE})}; "
                          f"it needs {sorted(asked)} (every engine where quantize works, none where it refuses)")
    return cell


def _expect(where: str, value, reasons: dict) -> Expect:
    if value == WORKS:
        return Expect(WORKS)
    if isinstance(value, dict) and len(value) == 1:
        (kind, key), = value.items()
        if kind in (REFUSED, CAPABILITY, SUSPECT) and key in reasons:
            return Expect(kind, reasons[key])
    raise MatrixError(f"{MATRIX_FILE.name}: {where}: {value!r} is not `works`, `refused: <reason>`, "
                      f"`capability: <reason>` or `suspect: <reason>` with a reason of {sorted(reasons)}")


# Each reason is a numbered note under the table, so that cells stay short.
NOTE_CELLS = {REFUSED: "one line", SUSPECT: "⚠ suspect", CAPABILITY: "✅"}
NOTE_TEXTS = {REFUSED: "a one-line answer (exit 2), never a traceback: {short}",
              SUSPECT: "built, but quantize's sanity check marks it suspect: {short}; ⚠ ✅: served all the same",
              CAPABILITY: "served where the capability layer allows ({short}), else its one-line answer"}
LEGEND = "✅ works; — not asked (quantize answered in one line)"


def render(matrix: Matrix) -> str:
    """The markdown table, a row per family and a column per recipe x engine,
    then the legend: what the marks mean, and each numbered reason."""
    columns = [(recipe, engine) for recipe in matrix.recipes for engine in matrix.engines]
    lines = ["| family | trait | " + " | ".join(f"`{r}` {e}" for r, e in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    notes: dict[tuple[str, Reason], int] = {}   # (kind, reason) -> its number, in order of first use
    for family in matrix.families.values():
        cells = [_cell_text(family, recipe, engine, engine == matrix.engines[0], notes) for recipe, engine in columns]
        lines.append(f"| {family.name} (`{family.architecture}`) | {family.trait} | " + " | ".join(cells) + " |")
    lines += ["", f"- {LEGEND}"]
    lines += [f"- [{n}] {NOTE_TEXTS[kind].format(short=reason.short)}" for (kind, reason), n in notes.items()]
    return "\n".join(lines) + "\n"


def _cell_text(family: Family, recipe: str, engine: str, first: bool, notes: dict) -> str:
    """`first`: the recipe's first engine column, which says why quantize refused (the others: —)
    or why it marked the artifact suspect (the others: ⚠ before what the engine does)."""
    quantize = family.expect(recipe, QUANTIZE)
    if quantize.kind == REFUSED:
        return _noted(quantize, notes) if first else "—"
    if quantize.kind == SUSPECT and first:
        return _noted(quantize, notes)
    served = _noted(family.expect(recipe, engine), notes)
    return f"⚠ {served}" if quantize.kind == SUSPECT else served


def _noted(expect: Expect, notes: dict) -> str:
    """The cell's mark, and the number of the note giving its reason."""
    if expect.kind == WORKS:
        return "✅"
    number = notes.setdefault((expect.kind, expect.reason), len(notes) + 1)
    return f"{NOTE_CELLS[expect.kind]} [{number}]"


def readme_block(text: str) -> tuple[int, int]:
    """The character span between the markers' lines (after BEGIN's line, up to END)."""
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < 0 or end < begin:
        raise MatrixError(f"the README lacks the lines {BEGIN} and {END} (in that order) around the "
                          "family table; add them where the table goes and run --write again")
    return text.index("\n", begin) + 1, end


def with_table(text: str, table: str) -> str:
    start, end = readme_block(text)
    return text[:start] + table + text[end:]


def write_atomically(path: Path, text: str) -> None:
    """Whole or not at all: a temp file in the same folder, renamed over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"replace the table in {README.name}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 if {README.name}'s table differs")
    parser.add_argument("--readme", type=Path, default=README, help="the file with the markers (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        matrix = load()
        table = render(matrix)
        if not (args.write or args.check):
            print(table, end="")
            return 0
        text = args.readme.read_text()
        updated = with_table(text, table)
    except KeyError as e:
        print(f"error: {MATRIX_FILE.name} lacks the key {e}", file=sys.stderr)
        return 2
    except (MatrixError, OSError, yaml.YAMLError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if args.check:
        if updated != text:
            print(f"{args.readme}'s family table differs from {MATRIX_FILE.name}: run "
                  ".venv/bin/python scripts/family_table.py --write", file=sys.stderr)
            return 1
        return 0
    if updated != text:
        write_atomically(args.readme, updated)
    print(f"{args.readme}: family table written ({len(matrix.families)} families)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
