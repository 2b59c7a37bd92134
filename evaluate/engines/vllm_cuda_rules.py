"""What vLLM serves on a CUDA GPU, per compute capability, as the CUDA build
of vLLM 0.32.0 (the release of the CPU target) decides it in its own source.
Each rule cites the file (under vllm/) and function it was read from; where
vLLM picks among kernels at start-up, a yes names the one it would pick when
that matters for speed. Nothing here was measured: no vLLM engine has run on
a GPU in this project yet.

A rule takes the checkpoint format, the lowest compute capability among the
GPUs, e.g. (8, 0), and the engine args (dtype resolved); it answers a Verdict."""
from evaluate.formats import DENSE, FP8, W4A16, W8A8_INT8, W8A16, YES, Verdict

Capability = tuple[int, int]

# model_executor/layers/quantization/compressed_tensors/schemes/*.py, get_min_capability of each
# scheme; CompressedTensorsConfig.get_scheme raises below it (_check_scheme_supported).
#   W8A8 int8: CompressedTensorsW8A8Int8 -> 75; W4A16/W8A16: CompressedTensorsWNA16 -> 75;
#   FP8 weight-only: CompressedTensorsW8A16Fp8 -> 75 (W8A8 FP8 needs 89, see FP8_NATIVE).
SCHEME_MIN = {W8A8_INT8: (7, 5), W4A16: (7, 5), W8A16: (7, 5), FP8: (7, 5)}
# compressed_tensors.py, _get_scheme_from_parts: FP8 W8A8 where
# _check_scheme_supported(CompressedTensorsW8A8Fp8.get_min_capability() = 89), else the
# weight-only CompressedTensorsW8A16Fp8, run by MarlinFP8ScaledMMLinearKernel
# (model_executor/kernels/linear/scaled_mm/marlin.py: "FP8 Marlin kernel for GPUs that lack
# FP8 hardware support").
FP8_NATIVE = (8, 9)
# platforms/cuda.py, CudaPlatform.check_if_supports_dtype: "Bfloat16 is only supported on GPUs
# with compute capability of at least 8.0"; supported_dtypes: [bf16, fp16, fp32] from 80, else
# [fp16, fp32] (config/model.py, _resolve_auto_dtype falls back to the first of them).
BF16 = (8, 0)
# model_executor/kernels/linear/mixed_precision/machete.py, MacheteLinearKernel.can_implement:
# only on capability 9.0 exactly (is_device_capability(90)); it comes before Marlin in
# kernels/linear/__init__.py, _POSSIBLE_KERNELS[CUDA] (choose_mp_linear_kernel's order).
MACHETE = (9, 0)


def cuda_rule(fmt, cc: Capability, args: dict) -> Verdict:
    """The weights and compute dtype on a GPU of capability `cc` (the KV
    cache is cuda_kv_rule's)."""
    sm = _sm(cc)
    if args.get("dtype") == "bfloat16" and cc < BF16:
        return Verdict(False, f"vLLM runs bfloat16 only from compute capability 8.0 ({sm} here); "
                              "use engine.args.dtype=float16")
    needs = SCHEME_MIN.get(fmt.scheme, (0, 0))
    if cc < needs:
        return Verdict(False, f"vLLM serves {fmt.label} from compute capability {needs[0]}.{needs[1]} "
                              f"({sm} here); use a newer GPU or engine=hf")
    verdict = _moe_rule(fmt, cc) if fmt.moe else _linear_rule(fmt, cc)
    if verdict and fmt.sparse_24:
        # compressed_tensors.py, _parse_sparsity_config: a sparsity_config is rejected ("Sparsity
        # support has been removed"), so 2:4 weights load as the dense scheme they are stored in.
        return verdict.with_note("2:4 zeros computed dense: this vLLM has no 2:4 sparse kernel")
    return verdict


def _linear_rule(fmt, cc: Capability) -> Verdict:
    if fmt.scheme == FP8 and cc < FP8_NATIVE:
        return Verdict(True, f"no FP8 tensor cores on {_sm(cc)} (they start at sm89): weight-only FP8 "
                             "through the Marlin kernel, activations stay 16-bit")
    if fmt.scheme in (W4A16, W8A16):
        return _weight_only_int_rule(fmt, cc)
    # W8A8 int8: kernels/linear/__init__.py, _POSSIBLE_INT8_KERNELS[CUDA] starts with
    # CutlassInt8ScaledMMLinearKernel, whose is_supported asks only for CUDA.
    return YES


def _weight_only_int_rule(fmt, cc: Capability) -> Verdict:
    """choose_mp_linear_kernel (kernels/linear/__init__.py) over
    _POSSIBLE_KERNELS[CUDA]; the kernels that ship with the wheel are Machete
    (sm90 only), Marlin (sm75+) and Triton W4A16; Conch and Humming need
    packages setup does not install."""
    bits = 8 if fmt.scheme == W8A16 else 4
    if fmt.zero_point and bits == 8:
        # layers/quantization/utils/marlin_utils.py, query_marlin_supported_quant_types: with zero
        # points only uint4; utils/machete_utils.py, query_machete_supported_quant_types: uint4 and
        # uint8; triton_w4a16.py, TRITON_W4A16_SUPPORTED_QUANT_TYPES: 4-bit only.
        if cc != MACHETE:
            return Verdict(False, f"vLLM's kernels for 8-bit weights with zero points need sm90 (Machete); "
                                  f"{_sm(cc)} here has only Marlin, which takes 8-bit weights symmetric; "
                                  "use a symmetric recipe or engine=hf")
    return Verdict(True, "Machete kernel where the layer fits it, else Marlin" if cc == MACHETE
                   else "Marlin kernel")


def _moe_rule(fmt, cc: Capability) -> Verdict:
    """Fused-MoE methods (layers/quantization/compressed_tensors/compressed_tensors_moe/)."""
    if fmt.scheme == DENSE:
        return YES  # UnquantizedFusedMoEMethod: the Triton fused-MoE kernel, no capability floor
    if fmt.scheme == W8A8_INT8:
        # compressed_tensors_moe_w8a8_int8.py (channel-wise weights, dynamic per-token activations,
        # as the shipped W8A8 recipes) on fused_moe/experts/triton_moe.py, TritonExperts:
        # _supports_quant_scheme takes int8 "at least 7.5 (Turing) on CUDA"
        return YES
    if fmt.scheme in (W4A16, W8A16):
        # compressed_tensors_moe_wna16.py on fused_moe/oracle/int_wna16.py: MarlinExperts
        # (experts/marlin_moe.py, sm75+) and TritonWNA16Experts (experts/triton_moe.py) take
        # kInt4Static, kInt4StaticAsym and kInt8Static: zero points only with 4-bit weights
        if fmt.zero_point and fmt.scheme == W8A16:
            return Verdict(False, "vLLM's fused-MoE kernels take 8-bit expert weights symmetric only, and this "
                                  f"{fmt.label} checkpoint has zero points; use a symmetric recipe or engine=hf")
        return Verdict(True, "Marlin fused-MoE kernel")
    if fmt.scheme == FP8:
        # fused_moe/oracle/fp8.py, _get_priority_backends: ... TRITON, MARLIN; TritonExperts takes fp8
        # only where CudaPlatform.supports_fp8 (sm89+), so below that Marlin runs it weight-only
        return _linear_rule(fmt, cc)
    return Verdict(False, f"no rule for {fmt.label} experts on CUDA; try it with "
                          "`python -m evaluate.capabilities probe=true` on the GPU, or use engine=hf")


def cuda_kv_rule(kv: str, cc: Capability, explicit: bool) -> Verdict:
    """The KV cache dtype `kv` vLLM would run (after the checkpoint's scheme;
    `explicit`: asked for by engine.args.kv_cache_dtype, else the checkpoint's).
    The attention backend is the first valid one of platforms/cuda.py,
    _get_backend_priorities: FlashInfer first on sm10x, else FlashAttention,
    FlashInfer, Triton, FlexAttention."""
    sm = _sm(cc)
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
    if (9, 0) <= cc < (10, 0) and kv != "fp8_e5m2" or (10, 0) <= cc < (11, 0):
        # fa_utils.py, flash_attn_supports_kv_cache_dtype: e4m3 with FlashAttention 3 on sm90 and
        # FlashAttention 4 on sm100; sm10x tries FlashInfer first (flashinfer.py: e4m3 and e5m2)
        return YES
    # sm80-sm89 (and e5m2 on sm90): FlashAttention 2 has no fp8 cache (flash_attn_supports_kv_cache_dtype),
    # so FlashInfer serves it (flashinfer-python is a dependency of the CUDA wheel)
    return Verdict(True, f"fp8 KV cache run by FlashInfer on {sm}, where FlashAttention has none")


def _sm(cc: Capability) -> str:
    return f"sm{cc[0]}{cc[1]}"
