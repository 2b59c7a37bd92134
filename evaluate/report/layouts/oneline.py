"""`oneline`: the torchao-style line per result group (scenario × recipe ×
artifact × engine × setup), then the command that reproduces it when the row
carries one."""
from dataclasses import dataclass

from evaluate.analysis.groups import Group, engine_class, scenarios
from evaluate.report.formatting import MISSING, fmt_fixed, gb
from evaluate.report.memory_figures import GPU_IN_USE, HOST, gpu_weights_bytes, on_gpu
from evaluate.report.layouts import MarkdownLayout
from evaluate.report.layouts.common import result_label
from evaluate.results import Row

SUBTITLE = "one line per result"
NOTE = ("tok/s = output tokens/s; mem/s = weight bytes ÷ mean time per output token (the memory bandwidth "
        "decode achieved); peak_host_mem = peak host memory (RAM) of the engine, not the harness (evaluate.memory: "
        "in-process growth since it started, or its own processes' RSS; no GPU memory); on a GPU, gpu_weights = "
        "the GPU memory the engine reported its weights took, gpu_in_use = the whole device's memory in use "
        "(NVML; vLLM reserves `gpu_memory_utilization` of it whatever the model, so it does not compare artifacts); "
        "model_size = weight bytes on disk; all means over the timed runs, in GB = 10^9 bytes. "
        "kv_quant = the KV-cache dtype (none: the model's dtype); compile = not `enforce_eager` (vLLM). "
        f"\"{MISSING}\" = not measured.")
# Best instruction set first: the one the kernels most likely used.
ISA_LABELS = (("amx_bf16", "amx"), ("avx512_bf16", "avx512_bf16"), ("avx512f", "avx512"), ("avx2", "avx2"),
              ("sve", "sve"), ("asimd", "neon"))


@dataclass
class OneLine(MarkdownLayout):
    subtitle = SUBTITLE

    def body(self, analysis) -> str:
        return render(analysis.rows, analysis.speed)


def render(rows: list[Row], speed: list[Group]) -> str:
    parts = [NOTE]
    for s in scenarios(speed):
        here = [g for g in speed if g.scenario == s]
        parts += [f"## {s.heading()}", "\n".join(line(g, result_label(g, here)) for g in here)]
    return "\n\n".join(parts)


def line(g: Group, name: str) -> str:
    row = g.runs[0]
    fields = {"tok/s": fmt_fixed(g.mean("output_throughput")),
              "mem/s": f"{fmt_fixed(g.mean('weight_bandwidth_gb_s'))} GB/s",
              "peak_host_mem": f"{fmt_fixed(gb(g.mean(HOST)))} GB",
              **({"gpu_weights": f"{fmt_fixed(gb(gpu_weights_bytes(row)))} GB",
                  "gpu_in_use": f"{fmt_fixed(gb(g.mean(GPU_IN_USE)))} GB"} if on_gpu(row) else {}),
              "model_size": f"{fmt_fixed(gb(g.model_bytes))} GB",
              "quant": f"{g.recipe} ({g.quant_format})" if g.quant_format else g.recipe,
              "kv_quant": kv_quant(row), "compile": str(compiled(row)),
              "dtype": str(row.engine_args.get("dtype") or MISSING), "device": device(row)}
    text = f"- **{name}**: " + ", ".join(f"{k}: {v}" for k, v in fields.items())
    repro = getattr(row, "repro", None) or row.extra.get("repro")  # a Row field may come; older rows keep it in extra
    return text + (f"\n  repro: `{repro}`" if repro else "")


def kv_quant(row: Row) -> str:
    recorded = getattr(row, "kv_quant", None) or row.extra.get("kv_quant")
    kv = recorded or row.engine_args.get("kv_cache_dtype")
    return "none" if kv in (None, "", "auto") else str(kv)


def compiled(row: Row) -> bool:
    """As the row's engine reads its recorded args (vLLM: not `enforce_eager`; others: `compile`)."""
    return engine_class(row.engine).compiles(row.engine_args)


def device(row: Row) -> str:
    machine, hw = row.machine or {}, row.hardware or {}
    if machine.get("cuda") or (hw.get("accelerators") and row.engine_args.get("device") != "cpu"):
        return "cuda"
    isa = set(machine.get("isa") or hw.get("cpu_isa") or [])
    best = next((label for flag, label in ISA_LABELS if flag in isa), None)
    return f"cpu ({best})" if best else "cpu"
