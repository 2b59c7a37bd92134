"""Report layouts (`python -m evaluate.report layout=a,b`): `summary` is
report.md with the CSVs and plots (see build_report); every other layout is a
module here whose `render(rows, speed)` returns the Markdown body of
`<layout>.md`, in the style of one reference report. All of them read the same
rows and aggregated groups: nothing is measured for a layout."""
from evaluate.analysis.groups import Group
from evaluate.report.layouts import batch_table, context_table, length_grid, oneline
from evaluate.report.markdown import distinct, hardware_text
from evaluate.results import Row
from quantize.common.errors import UserError

SUMMARY = "summary"
LAYOUTS = {"batch_table": batch_table, "context_table": context_table, "oneline": oneline,
           "length_grid": length_grid}
CHOICES = (SUMMARY, *LAYOUTS)


def parse(text: str) -> list[str]:
    """`a,b` -> the layout names, in order, once each; an unknown name is a UserError naming the choices."""
    names = list(dict.fromkeys(n.strip() for n in str(text).split(",") if n.strip())) or [SUMMARY]
    unknown = [n for n in names if n not in CHOICES]
    if unknown:
        raise UserError(f"unknown layout {unknown[0]!r}; layout= takes one or several of "
                        f"{', '.join(CHOICES)} (comma-separated)")
    return names


def render(name: str, rows: list[Row], speed: list[Group], title: str) -> str:
    """`<name>.md`: the title, the hardware measured on, then the layout's tables."""
    module = LAYOUTS[name]
    lines = [f"# {title} — {module.SUBTITLE}", ""]
    lines += [f"- Hardware: {hardware_text(hw)}" for hw in distinct(rows, "hardware")]
    needs_speed = getattr(module, "NEEDS_SPEED", True)  # length_grid reads serving rows instead
    body = (module.render(rows, speed) if speed or not needs_speed
            else "No speed results in this store: run python -m evaluate first.")
    return "\n".join(lines + ["", body]) + "\n"
