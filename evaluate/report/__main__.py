"""`python -m evaluate.report [results_dir=results] [out_dir=reports] [title=...] [pareto_scenario=<name>]
[layout=summary,batch_table,context_table,oneline,length_grid]`

key=value arguments like the two stages: results_dir holds results*.jsonl;
out_dir gets report.md, summary.csv, runs.csv and the PNGs (layout `summary`,
the default) and `<layout>.md` for every other layout asked for;
pareto_scenario is the scenario whose throughput the speed-vs-size and
speed-vs-accuracy plots use (default: the first). An empty value keeps the
default."""
import sys

from evaluate.report import build_report, layouts
from quantize.common.errors import UserError
from quantize.common.paths import resolve

DEFAULTS = {"results_dir": "results", "out_dir": "reports",
            "title": "quantbench: quantized LLM benchmark report", "pareto_scenario": None,
            "layout": layouts.SUMMARY}


def parse(argv: list[str]) -> dict:
    """key=value arguments over DEFAULTS; anything else is a UserError naming the keys."""
    options = dict(DEFAULTS)
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in DEFAULTS:
            raise UserError(f"unknown argument {arg!r}; python -m evaluate.report takes "
                            f"{' '.join(f'{k}=' for k in DEFAULTS)}")
        options[key] = value or DEFAULTS[key]
    options["layout"] = layouts.parse(options["layout"])
    return options


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse(sys.argv[1:] if argv is None else argv)
        paths = build_report(resolve(options["results_dir"]), resolve(options["out_dir"]), options["title"],
                             options["pareto_scenario"], tuple(options["layout"]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
