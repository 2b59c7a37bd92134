"""Mixture-of-experts end to end on a tiny random Qwen3-MoE: quantize with the
shipped recipes in either calibration dtype (real llm-compressor), the reload
check on per-expert quantized tensors, the manifest naming the layers left
dense, and evaluate serving it where the engine can or giving the capability
layer's one-line answer."""
import json
from dataclasses import replace

import pytest
from safetensors import safe_open

from tests.conftest import last_line, run_cli, serve_verdict
from evaluate import results
from evaluate.capabilities import KNOWN_MACHINES
from evaluate.formats import W4A16, W8A8_INT8, CheckpointFormat, classify
from quantize.common.paths import RECIPES_DIR
from quantize.common.tiny_model import build_tiny_qwen3_moe

SMALL = ["calibration.num_samples=8", "calibration.max_seq_len=64"]
RECIPES = ("w8a8_smooth_gptq", "w4a16_gptq", "w4a16_awq")
SCENARIO = ("scenario=interactive", "scenario.input_len=16", "scenario.output_len=4")
LAYERS = 2


@pytest.fixture(scope="module")
def moe_artifacts(tmp_path_factory, tokenizer_dir):
    """The three recipes calibrated in float32 (the dtype `auto` picks on a CPU
    without native bf16, where the experts used to stay bf16 and crash), and
    W4A16-GPTQ in bfloat16 too."""
    root = tmp_path_factory.mktemp("moe")
    model = build_tiny_qwen3_moe(root / "tiny-qwen3-moe", tokenizer_dir, layers=LAYERS)
    out = {}
    for dtype, recipes in (("float32", RECIPES), ("bfloat16", ("w4a16_gptq",))):
        arts = root / f"artifacts-{dtype}"
        proc = run_cli("quantize", "-m", f"recipe={','.join(recipes)}", f"model={model}", *SMALL,
                       f"calibration_dtype={dtype}", f"artifacts_dir={arts}", cwd=root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out |= {(r, dtype): arts / "tiny-qwen3-moe" / r for r in recipes}
    # The shipped int4 recipes are asymmetric; vLLM-CPU's fused-MoE int4 kernel takes symmetric weights only.
    sym = root / "w4a16_gptq_sym.yaml"
    sym.write_text((RECIPES_DIR / "w4a16_gptq.yaml").read_text().replace("symmetric: false", "symmetric: true"))
    arts = root / "artifacts-float32"
    proc = run_cli("quantize", f"recipe={sym}", f"model={model}", *SMALL, "calibration_dtype=float32",
                   f"artifacts_dir={arts}", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["w4a16_gptq_sym", "float32"] = arts / "tiny-qwen3-moe" / "w4a16_gptq_sym"
    return {"root": root, "model": model, **out}


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.parametrize("recipe, dtype", [(r, "float32") for r in RECIPES] + [("w4a16_gptq", "bfloat16")])
def test_quantized_moe_reloads_and_names_its_dense_layers(moe_artifacts, recipe, dtype):
    art = moe_artifacts[recipe, dtype]
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["calibration_dtype"] == dtype
    # A quantized MoE is always verified by reloading it (per-expert layout: quantize/verify.py).
    assert manifest["checks"]["verified_by"] == "reload"
    assert manifest["checks"]["reloads_in_transformers"] and manifest["checks"]["logits_finite"]
    routers = [f"model.layers.{i}.mlp.gate" for i in range(LAYERS)]
    assert manifest["moe"] == {"num_experts": 4, "experts_per_token": 2, "dense_routers": routers}
    assert set(routers) <= set(manifest["quantization"]["ignore"])
    # Every expert of every layer is quantized, stored one tensor set per expert.
    suffix = "weight_packed" if recipe.startswith("w4a16") else "weight_scale"
    with safe_open(art / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    for layer in range(LAYERS):
        for expert in range(4):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"model.layers.{layer}.mlp.experts.{expert}.{proj}.{suffix}" in keys
        assert f"model.layers.{layer}.mlp.gate.weight" in keys  # the router, dense


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["w8a8_smooth_gptq", "w4a16_gptq", "w4a16_gptq_sym"])
def test_vllm_serves_quantized_moe_or_says_why_not(moe_artifacts, tmp_path, recipe):
    art = moe_artifacts[recipe, "float32"]
    verdict, _ = serve_verdict(art)
    res = tmp_path / "res"
    out = run_cli("evaluate", f"model={art}", *SCENARIO, "runs=1", "accuracy=none", "engine.args.enforce_eager=true",
                  f"results_dir={res}", cwd=tmp_path)
    if verdict:
        assert out.returncode == 0, out.stderr[-3000:]
        assert {r.status for r in results.read(res)} == {"ok"}
    else:
        assert out.returncode == 2, out.stderr[-3000:]
        line = last_line(out.stderr)
        assert "Traceback" not in out.stderr
        if "scripts/setup.sh" in verdict.reason:  # a host without vLLM (e.g. CUDA with torch only)
            assert "scripts/setup.sh" in line
        else:
            assert "MoE" in line and "engine=hf" in line
        assert not (res / "results.jsonl").exists()


@pytest.mark.extended
@pytest.mark.slow
def test_hf_engine_serves_quantized_moe_with_accuracy(moe_artifacts, tmp_path):
    art = moe_artifacts["w4a16_gptq", "float32"]
    res = tmp_path / "res"
    out = run_cli("evaluate", f"model={art}", "engine=hf", *SCENARIO, "runs=1", "accuracy.num_windows=1",
                  "accuracy.lastword.num_items=4", f"results_dir={res}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r.kind: r for r in results.read(res)}
    assert rows["speed"].status == "ok" and rows["speed"].metrics["output_throughput"] > 0
    acc = rows["accuracy"].metrics
    assert acc["scored_tokens"] == 511 and acc["perplexity"] > 0 and 0 <= acc["top1_agreement"] <= 1


def test_capability_layer_knows_moe():
    config = {"num_experts": 4, "dtype": "bfloat16",
              "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
                  "g": {"weights": {"num_bits": 4, "type": "int"}}}}}
    fmt = classify(config)
    assert fmt.moe and fmt.scheme == W4A16 and fmt.label == "W4A16 MoE"
    assert not classify({"num_hidden_layers": 2}).moe
    from evaluate.engines.vllm import VllmEngine
    for scheme in (W4A16, W8A8_INT8):
        fmt = CheckpointFormat(scheme, method="compressed-tensors", moe=True)
        verdict = VllmEngine.supports(fmt, KNOWN_MACHINES["avx512_bf16"], {"dtype": "bfloat16"})
        assert not verdict and "need AMX" in verdict.reason and "engine=hf" in verdict.reason
        assert VllmEngine.supports(fmt, KNOWN_MACHINES["amx"], {"dtype": "bfloat16"})
        # vLLM-CPU's fused-MoE kernels take symmetric weights only, with AMX too (seen: w4a16_gptq)
        asym = CheckpointFormat(scheme, method="compressed-tensors", moe=True, zero_point=True)
        verdict = VllmEngine.supports(asym, KNOWN_MACHINES["amx"], {"dtype": "bfloat16"})
        assert not verdict and "symmetric" in verdict.reason and "engine=hf" in verdict.reason
        if scheme == W4A16:  # the dense int4 kernel takes zero points (make run's w4a16 recipes)
            assert VllmEngine.supports(replace(asym, moe=False), KNOWN_MACHINES["amx"], {"dtype": "bfloat16"})
    dense = CheckpointFormat(moe=True)
    assert VllmEngine.supports(dense, KNOWN_MACHINES["avx512_bf16"], {"dtype": "bfloat16"})
