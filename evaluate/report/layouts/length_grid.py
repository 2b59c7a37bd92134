"""`length_grid`: the vLLM-vs-TGI table of the reference reports. Serving
rows (kind "serving") of two or more engines or servers, input × output length
down the side, per metric the engines side by side:
- req/s: completed requests ÷ level duration (request_throughput);
- output tok/s: output_throughput;
- ms per token: mean end-to-end latency ÷ mean (prompt + generated) tokens per request;
- ms per output token: mean end-to-end latency ÷ mean generated tokens per request.
Each cell is the level of that column with the highest request throughput
(its peak; client-bound levels left out), and the table says which level it was.
The levels are those of "Serving under load" (load_levels.curves: the latest
load profile, the latest row of a level), so a replaced curve or an older row
of a repeated level never shows here."""
from dataclasses import dataclass

from evaluate.analysis.groups import Group
from evaluate.analysis.load_levels import Curve, ServingAnalysis
from evaluate.report.formatting import MISSING, fmt_fixed, md_table
from evaluate.report.layouts import MarkdownLayout
from evaluate.report.layouts.common import result_label
from evaluate.results import Row

SUBTITLE = "serving throughput and latency per input × output length"
NOTE = ("Per (input, output) length and column (artifact · engine), the load level with the highest request "
        "throughput; req/s = completed requests ÷ level duration; output tok/s = generated tokens ÷ duration; "
        "ms per token = mean end-to-end latency ÷ mean prompt + generated tokens per request; ms per output "
        f"token = mean end-to-end latency ÷ mean generated tokens per request. \"{MISSING}\" = not measured.")
METRICS = (("req/s", 3), ("output tok/s", 1), ("ms per token", 2), ("ms per output token", 2))


def values(row: Row) -> dict[str, float | None]:
    m = row.metrics
    done, e2el = m.get("completed") or 0, m.get("mean_e2el_ms")
    inp, out = m.get("total_input_tokens") or 0, m.get("total_output_tokens") or 0
    per_req = lambda tokens: e2el / (tokens / done) if done and tokens and e2el is not None else None  # noqa: E731
    return {"req/s": m.get("request_throughput"), "output tok/s": m.get("output_throughput"),
            "ms per token": per_req(inp + out), "ms per output token": per_req(out)}


def peak(curves: list[Curve], shape: tuple[int, int]) -> Row | None:
    """The level of these curves at that input/output length with the highest request throughput."""
    rows = [lv.row for c in curves if (c.scenario.input_len, c.scenario.output_len) == shape for lv in c.levels
            if lv.metrics.get("valid") is not False and lv.get("request_throughput") is not None]
    return max(rows, key=lambda r: r.metrics["request_throughput"], default=None)


def level_text(row: Row) -> str:
    load = row.load or {}
    mode, level = load.get("mode"), load.get("level")
    return "synchronous" if mode == "synchronous" else f"{mode} {level:g}" if isinstance(level, (int, float)) \
        else str(mode or "?")


@dataclass
class LengthGrid(MarkdownLayout):
    subtitle = SUBTITLE
    needs_speed = False   # rendered from serving rows

    def body(self, analysis) -> str:
        return render(analysis.serving)


def render(serving: ServingAnalysis | None) -> str:
    shaped = [c for c in (serving.curves if serving else [])
              if c.scenario.input_len is not None and c.scenario.output_len is not None]
    if not shaped:
        return ("No serving results: run python -m evaluate engine=vllm_server load=... (and engine=openai "
                "engine.base_url=... for another server) first.")
    # one column per identity, whatever scenario names the rows carry: the lengths are the rows
    cols: dict[tuple, list[Curve]] = {}
    for c in shaped:
        cols.setdefault(c.group.identity, []).append(c)
    columns: list[Group] = [curves[0].group for curves in cols.values()]
    labels = [result_label(c, columns) for c in columns]
    shapes = sorted({(c.scenario.input_len, c.scenario.output_len) for c in shaped})
    heads = ["Input length", "Output length"] + [f"{name} · {label}" for name, _ in METRICS for label in labels]
    table, used = [], []
    for shape in shapes:
        picked = [peak(curves, shape) for curves in cols.values()]
        used += [f"- {shape[0]} → {shape[1]}, {label}: {level_text(r)}" for label, r in zip(labels, picked) if r]
        vals = [values(r) if r else {} for r in picked]
        table.append([str(shape[0]), str(shape[1])]
                     + [fmt_fixed(v.get(name), digits) for name, digits in METRICS for v in vals])
    return "\n\n".join([NOTE, md_table(heads, table), "Levels shown (highest request throughput):\n" + "\n".join(used)])
