"""`batch_table`: the TGI-style table. Per model/recipe/engine/setup and
prompt shape, prefill latency (TTFT) and decode latency per token (TPOT) per
batch size: avg, min, max, p50, p90, p99; one section per tensor-parallel size."""
import statistics
from dataclasses import dataclass

from evaluate.analysis.groups import Group, numeric_metrics
from evaluate.report.formatting import MISSING, fmt_fixed, md_table, short
from evaluate.report.layouts import MarkdownLayout
from evaluate.report.stores_markdown import machine_names
from evaluate.results import Row

SUBTITLE = "prefill and decode latency per batch size"
STEPS = (("Prefill", "ttft_ms"), ("Decode (token)", "tpot_ms"))
HEADERS = ["Step", "Batch size", "Avg (ms)", "Min (ms)", "Max (ms)", "p50 (ms)", "p90 (ms)", "p99 (ms)"]
# Each run records per-request summaries, not every request: the spread is over runs.
NOTE = ("Prefill = time to first token (TTFT); decode = time per output token after the first (TPOT). "
        "Avg, min and max are over the timed runs, of each run's mean over its requests; p50, p90 and p99 "
        f"are each run's percentiles over its requests, averaged over the runs. \"{MISSING}\" = not measured.")


@dataclass
class BatchTable(MarkdownLayout):
    subtitle = SUBTITLE

    def body(self, analysis) -> str:
        return render(analysis.rows, analysis.speed)


def render(rows: list[Row], speed: list[Group]) -> str:
    parts = [NOTE]
    for tp, tables in by_tp(speed).items():
        parts.append(f"## Tensor parallel size {tp}")
        for heading, groups in tables.items():
            parts += [f"### {heading}", table(groups)]
    return "\n\n".join(parts)


def tp_size(g: Group) -> int:
    return int(g.runs[0].engine_args.get("tensor_parallel_size") or 1)


def by_tp(speed: list[Group]) -> dict[int, dict[str, list[Group]]]:
    """{TP size: {table heading: groups}}, TP sizes ascending, tables in order of appearance."""
    out: dict[int, dict[str, list[Group]]] = {}
    machines = machine_names({g.machine: g.runs[0].hardware for g in speed if g.runs})
    for g in speed:
        if g.scenario.batch_size is not None:
            out.setdefault(tp_size(g), {}).setdefault(heading(g, machines), []).append(g)
    return dict(sorted(out.items()))


def heading(g: Group, machines: dict[str, str]) -> str:
    """Per artifact, engine, setup and shape; rows from before setup ids name
    their machine instead where there are several (machines: machine_names)."""
    s = g.scenario
    setup = (f" · setup {g.setup_id}" if g.setup_id
             else f" · machine {machines[g.machine]}" if len(machines) > 1 else "")
    return (f"{g.model_name} · {g.recipe} ({short(g.artifact_id)}) · {g.engine}{setup} · "
            f"prompt {s.input_len} tokens, {s.output_len} generated")


def table(groups: list[Group]) -> str:
    ordered = sorted(groups, key=lambda g: (g.scenario.batch_size, g.scenario.name))
    sizes = [g.scenario.batch_size for g in ordered]
    return md_table(HEADERS, [[step, batch_label(g, sizes), *cells(g, metric)]
                              for step, metric in STEPS for g in ordered])


def batch_label(g: Group, sizes: list[int]) -> str:
    """The batch size; with the scenario's name when two scenarios of one
    shape were measured (e.g. the ladders' bs1 and ctx128)."""
    bs = g.scenario.batch_size
    return f"{bs} ({g.scenario.name})" if sizes.count(bs) > 1 else str(bs)


def cells(g: Group, metric: str) -> list[str]:
    means = [m for m in (numeric_metrics(r).get(f"{metric}_mean") for r in g.runs) if m is not None]
    spread = (statistics.mean(means), min(means), max(means)) if means else (None, None, None)
    return [fmt_fixed(x) for x in (*spread, *(g.mean(f"{metric}_p{p}") for p in (50, 90, 99)))]
