"""`context_table`: the Qwen-style table. Batch-1 results, input length down
the side, recipe × engine across (the engines of one artifact in adjacent
columns), each cell output speed and peak host memory, with the GPU's share
on a GPU; one table per output length."""
from dataclasses import dataclass

from evaluate.analysis.groups import Group, identity_of, kv_cache_bytes, weight_memory_bytes
from evaluate.report.formatting import MISSING, fmt_fixed, gb, md_table
from evaluate.report.layouts import MarkdownLayout
from evaluate.report.layouts.common import result_label
from evaluate.report.memory_figures import HOST, gpu_kv_bytes, gpu_weights_bytes, on_gpu
from evaluate.results import Row

SUBTITLE = "speed and memory per input length (batch 1)"
NOTE = ("Each cell: output tokens/s (generated tokens ÷ latency) · peak host memory (RAM) in GB (10^9 bytes; "
        "the engine's own, not the harness's: evaluate.memory; no GPU memory), both the mean over the timed runs; "
        "in brackets, where the engine reported them, the GB of it its weights and its KV cache took. On a GPU "
        "the cell says `host` for that figure and then, after `GPU`, the GB the engine reported its weights and "
        "its KV cache took on the device. "
        "vLLM pre-allocates its KV cache (`VLLM_CPU_KVCACHE_SPACE` on CPU, `gpu_memory_utilization` on "
        "GPUs), so its memory includes that whole cache at every input length{kv}; transformers grows its "
        f"cache with the context. \"{MISSING}\" = not measured.")


@dataclass
class ContextTable(MarkdownLayout):
    subtitle = SUBTITLE

    def body(self, analysis) -> str:
        return render(analysis.rows, analysis.speed)


def render(rows: list[Row], speed: list[Group]) -> str:
    ones = [g for g in speed if g.scenario.batch_size == 1]
    if not ones:
        return "No batch-1 speed results: run python -m evaluate ... scenario=context_ladder."
    parts = [NOTE.format(kv=kv_note(ones))]
    for out_len in sorted({g.scenario.output_len for g in ones}):
        same = [g for g in ones if g.scenario.output_len == out_len]
        missed = unmeasured(rows, same, out_len)
        parts += [f"## {out_len} generated tokens", table(same, missed), why_not(missed)]
    return "\n\n".join(p for p in parts if p)


def kv_note(groups: list[Group]) -> str:
    sizes = sorted({b for b in (kv_cache_bytes(g.runs[0]) for g in groups) if b})
    return f" (here {', '.join(f'{b / 2 ** 30:.3g} GiB' for b in sizes)})" if sizes else ""


def columns(groups: list[Group]) -> list[Group]:
    """One group per identity; those of one model/recipe/artifact side by side, engines in order of appearance."""
    first: dict[tuple, Group] = {}
    for g in groups:
        first.setdefault(g.identity, g)
    artifact_order = {k: i for i, k in enumerate(dict.fromkeys(ident[:3] for ident in first))}
    return sorted(first.values(), key=lambda g: artifact_order[g.identity[:3]])  # stable within an artifact


def table(groups: list[Group], missed: list[Row]) -> str:
    """Input lengths that only have skipped or failed rows stay as rows of MISSING."""
    cols = columns(groups)
    cell_of = {(g.scenario.input_len, g.scenario.name, g.identity): cell(g) for g in groups}
    names: dict[int, set[str]] = {}   # input length -> the scenarios measured at it
    for g in groups:
        names.setdefault(g.scenario.input_len, set()).add(g.scenario.name)
    lines = []
    for n in sorted(set(names) | {r.input_len for r in missed}):
        for name in sorted(names.get(n, ())) or [None]:
            lines.append([length_label(n, name, names.get(n, ()))]
                         + [cell_of.get((n, name, c.identity), MISSING) for c in cols])
    return md_table(["Input length"] + [result_label(c, cols) for c in cols], lines)


def length_label(n: int, name: str | None, names) -> str:
    """The input length; with the scenario's name when two scenarios of one
    shape were measured (e.g. the ladders' bs1 and ctx128), each on its own line."""
    return f"{n} ({name})" if len(names) > 1 else str(n)


def cell(g: Group) -> str:
    speed, host = fmt_fixed(g.mean('output_throughput')), fmt_fixed(gb(g.mean(HOST)))
    row = g.runs[0]
    if on_gpu(row):
        return (f"{speed} tok/s · host {host} GB · GPU weights {fmt_fixed(gb(gpu_weights_bytes(row)))} · "
                f"KV {fmt_fixed(gb(gpu_kv_bytes(row)))} GB")
    return f"{speed} tok/s · {host} GB" + split(row)


def split(row: Row) -> str:
    """ (weights W · KV K) from what the engine reported, or "" when it reported neither."""
    weights, kv = weight_memory_bytes(row), (row.engine_memory or {}).get("kv_cache_bytes")
    parts = [f"{name} {fmt_fixed(gb(value))}" for name, value in (("weights", weights), ("KV", kv))
             if value is not None]
    return f" ({' · '.join(parts)})" if parts else ""


def unmeasured(rows: list[Row], groups: list[Group], out_len: int) -> list[Row]:
    """Batch-1 rows without a result (e.g. longer than max_model_len: skipped), unless a rerun measured it."""
    measured = {(g.scenario.input_len, g.identity) for g in groups}
    return [r for r in rows if r.kind == "speed" and not r.ok and r.batch_size == 1 and r.output_len == out_len
            and r.input_len is not None and (r.input_len, identity_of(r)) not in measured]


def why_not(missed: list[Row]) -> str:
    why = dict.fromkeys(f"- input {r.input_len}, {r.recipe} · {r.engine}: {r.status} "
                        f"({r.reason or 'no reason recorded'})" for r in missed)
    return "\n".join(["Not measured:", *why]) if why else ""
