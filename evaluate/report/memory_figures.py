"""The report's memory figures: what each one is, its header, and which
tables show it. Every section takes its memory columns and cells from here,
so two sections never name or compute a figure differently.

- Peak host memory (`metrics.peak_memory_bytes`, evaluate.memory): the
  engine's resident memory in host RAM, not the harness's: the evaluate
  process's growth since the engine began starting plus the engine's own
  processes whole. On a GPU it holds none of the device's memory.
- GPU weights (`engine_memory.weights_bytes`): the memory the engine
  reported its weights took on the GPU (vLLM's "Model loading took").
  This is the figure that compares artifacts on a GPU.
- GPU KV cache (`engine_memory.kv_cache_bytes`): the KV cache the engine
  allocated on the GPU. On a CPU, the KV cache (reported, or vLLM-CPU's
  `VLLM_CPU_KVCACHE_SPACE`) is part of peak host memory instead.
- GPU in use, whole device (`metrics.peak_gpu_memory_bytes`): NVML's memory
  in use on the GPUs CUDA_VISIBLE_DEVICES leaves the job (every one where
  it is unset or empty) at the run's peak, every process included. vLLM
  reserves a fixed share of the device (`gpu_memory_utilization`) and fills
  what its weights leave with KV cache, so this is about the same for every
  artifact.

A table shows a GPU column only where one of its rows is on a GPU, and its
headline memory per row is the GPU weights where the engine reported them on
a GPU, else peak host memory."""
from evaluate.analysis.groups import Group, kv_cache_bytes, weight_memory_bytes
from evaluate.report.formatting import fmt_fixed, header, mb
from evaluate.results import Row

HOST = "peak_memory_bytes"
GPU_IN_USE = "peak_gpu_memory_bytes"
HOST_HEADER = header("peak_memory_mb")              # Peak host memory (MB)
HOST_KV_HEADER = "KV cache, in peak host memory (MB)"
GPU_WEIGHTS_HEADER = "GPU weights (MB)"
GPU_KV_HEADER = "GPU KV cache (MB)"
GPU_IN_USE_HEADER = header("peak_gpu_memory_mb")    # GPU in use, whole device (MB)


def on_gpu(row: Row) -> bool:
    """Whether the row's engine ran on a GPU: its machine had CUDA (or an
    accelerator, for rows without capability facts) and its engine was not
    told `device: cpu`; else whether NVML saw a GPU in use while it ran."""
    if row.engine_args.get("device") == "cpu":
        return False
    machine, hw = row.machine or {}, row.hardware or {}
    return bool(machine.get("cuda") or hw.get("accelerators") or GPU_IN_USE in row.metrics)


def gpu_weights_bytes(row: Row) -> int | None:
    """The weights' GPU memory as the engine reported it; None off a GPU or unreported."""
    return weight_memory_bytes(row) if on_gpu(row) else None


def gpu_kv_bytes(row: Row) -> int | None:
    """The KV cache the engine allocated on the GPU; None off a GPU."""
    return kv_cache_bytes(row) if on_gpu(row) else None


def host_kv_bytes(row: Row) -> int | None:
    """The KV cache held in host memory (part of peak host memory); None on a GPU."""
    return None if on_gpu(row) else kv_cache_bytes(row)


def headline_is_gpu(g: Group) -> bool:
    """Whether g's headline memory is its GPU weights (reported on a GPU), else peak host memory."""
    return gpu_weights_bytes(g.runs[0]) is not None


def summary_heads(groups: list[Group]) -> list[str]:
    """The Summary's memory columns: peak host memory where a group's headline
    is that, GPU weights where a group's is that (both only in a table of
    both kinds: stores of several machines side by side)."""
    gpu = [headline_is_gpu(g) for g in groups]
    return [HOST_HEADER] * (not all(gpu)) + [GPU_WEIGHTS_HEADER] * any(gpu)


def detail_heads(groups: list[Group]) -> list[str]:
    """*Speed in detail*'s memory columns: peak host memory where the Summary
    leaves it out, the KV cache where it lives (host or GPU), and the whole
    device's GPU memory in use where it was measured."""
    host_in_summary = HOST_HEADER in summary_heads(groups)
    return ([HOST_HEADER] * (not host_in_summary)
            + [HOST_KV_HEADER] * any(not on_gpu(g.runs[0]) for g in groups)
            + [GPU_KV_HEADER] * any(on_gpu(g.runs[0]) for g in groups)
            + [GPU_IN_USE_HEADER] * any(g.mean(GPU_IN_USE) is not None for g in groups))


def cells(g: Group, heads: list[str]) -> list[str]:
    """g's values under `heads` (any of this module's headers), in MB."""
    row = g.runs[0]
    value = {HOST_HEADER: lambda: g.mean(HOST), HOST_KV_HEADER: lambda: host_kv_bytes(row),
             GPU_WEIGHTS_HEADER: lambda: gpu_weights_bytes(row), GPU_KV_HEADER: lambda: gpu_kv_bytes(row),
             GPU_IN_USE_HEADER: lambda: g.mean(GPU_IN_USE)}
    return [fmt_fixed(mb(value[h]()), 1) for h in heads]


def gpu_note(groups: list[Group]) -> str:
    """One line on what the GPU columns mean, where any group ran on a GPU; "" elsewhere."""
    gpu = [g for g in groups if on_gpu(g.runs[0])]
    if not gpu:
        return ""
    shares = sorted({str(u) for g in gpu if (u := g.runs[0].engine_args.get("gpu_memory_utilization")) is not None})
    here = f", here {' / '.join(shares)}" if shares else ""
    return (f"On a GPU, *{GPU_WEIGHTS_HEADER}* is the memory the engine reported its weights took on the device, "
            f"the figure that compares artifacts; vLLM reserves a fixed share of each GPU up front "
            f"(`gpu_memory_utilization`{here}) and fills what the weights leave with its KV cache "
            f"(*{GPU_KV_HEADER}*), so *{GPU_IN_USE_HEADER}* (NVML, every process on the device: *Speed in detail*, "
            f"*Detailed runs*) is about that share for every artifact and does not compare them; "
            f"*{HOST_HEADER}* is the engine's resident memory in host RAM, none of the GPU's.")
