"""KV-cache quantization end to end: the shipped fp8-KV recipe on the tiny
model, its checkpoint, vLLM serving it with an fp8 cache on this host, and
the one-line refusal an AVX2-only host gives (see tests/hosts/avx2_host/)."""
import json
import re

import pytest

from tests.conftest import run_cli, serve_verdict
from evaluate import results

pytestmark = pytest.mark.slow

RECIPE = "w8a8_kv8"
KV_SPACE_GIB = 1  # small enough that free memory never caps it


@pytest.fixture(scope="module")
def kv_artifact(build_artifact):
    """The session's build of the shipped recipe (tests/conftest.py: small Austen calibration)."""
    return build_artifact(RECIPE).dir


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("kv-scenario") / "kv_tiny.yaml"
    path.write_text("name: kv_tiny\nbatch_size: 1\ninput_len: 32\noutput_len: 16\n")
    return f"scenario={path}"


def test_the_recipe_saves_the_kv_scheme_and_calibrated_scales(kv_artifact):
    import torch
    from safetensors import safe_open

    from evaluate.target import from_path
    config = json.loads((kv_artifact / "config.json").read_text())
    q = config["quantization_config"]
    assert q["format"] == "int-quantized"
    kv = q["kv_cache_scheme"]
    assert (kv["type"], kv["num_bits"], kv["strategy"], kv["dynamic"], kv["symmetric"]) == (
        "float", 8, "tensor", False, True)
    fmt = from_path(kv_artifact).format
    assert fmt.kv_cache == "fp8" and fmt.label == "W8A8 int8 + fp8 KV"
    manifest = json.loads((kv_artifact / "manifest.json").read_text())
    assert manifest["quantization"]["kv_cache"] == {"num_bits": 8, "type": "float", "symmetric": True,
                                                    "strategy": "tensor", "group_size": None, "dynamic": False}

    tensors = {}
    for path in kv_artifact.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys() if re.search(r"self_attn\.[kv]_scale$", k)})
    layers = config["num_hidden_layers"]
    assert sorted(tensors) == sorted(f"model.layers.{i}.self_attn.{kv}_scale"
                                     for i in range(layers) for kv in "kv")
    for name, scale in tensors.items():
        assert scale.numel() == 1 and torch.isfinite(scale).all(), name
        # calibrated: max |k| / 448 (the e4m3 range) on the calibration text, not the default 1.0
        assert 0 < float(scale) < 1, (name, float(scale))
    assert len({float(s) for s in tensors.values()}) > 1


def kv_cache_tokens(out) -> int:
    """What vLLM logged: `CPU KV cache size: 4,194,304 tokens, ...`."""
    found = re.findall(r"KV cache size: ([\d,]+) tokens", out.stdout + out.stderr)
    (tokens,) = {int(n.replace(",", "")) for n in found}
    return tokens


@pytest.mark.extended
def test_vllm_serves_it_with_an_fp8_kv_cache(kv_artifact, scenario, tmp_path):
    """kv_cache_dtype=auto follows the checkpoint's scheme to an fp8 cache
    (vLLM logs nothing about it): the same KV space holds twice the tokens of
    the bf16 cache that kv_cache_dtype=bfloat16 asks for, scales unused."""
    from evaluate.engines.vllm import VllmEngine
    from evaluate.target import from_path
    verdict, dtype = serve_verdict(kv_artifact)
    if not verdict:  # e.g. an AVX2-only host: the next test covers it
        pytest.skip(f"vllm cannot serve it here: {verdict.reason}")
    fmt = from_path(kv_artifact).format
    same = (f"model={kv_artifact}", scenario, "runs=1", "engine.args.enforce_eager=true",
            "engine.args.max_model_len=513", f"engine.env.VLLM_CPU_KVCACHE_SPACE={KV_SPACE_GIB}")
    res = tmp_path / "fp8"
    out = run_cli("evaluate", *same, "accuracy.num_windows=2", f"results_dir={res}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = results.read(res)
    assert {(r.kind, r.status) for r in rows} == {("speed", "ok"), ("accuracy", "ok")}
    for r in rows:
        assert r.engine_args["dtype"] == dtype and r.engine_args.get("kv_cache_dtype", "auto") == "auto"
        assert VllmEngine.kv_quant(fmt, r.engine_args) == "fp8"
        assert r.kv_quant == "fp8"

    res16 = tmp_path / "bf16"
    out16 = run_cli("evaluate", *same, "accuracy=none", "engine.args.dtype=bfloat16",
                    "engine.args.kv_cache_dtype=bfloat16", f"results_dir={res16}", cwd=tmp_path)
    assert out16.returncode == 0, out16.stderr[-3000:]
    (row,) = results.read(res16)
    assert row.status == "ok" and VllmEngine.kv_quant(fmt, row.engine_args) == "none"
    assert row.kv_quant == "none"
    assert kv_cache_tokens(out) == 2 * kv_cache_tokens(out16)


def test_fp8_kv_on_an_avx2_host_is_one_line_and_writes_nothing(kv_artifact, scenario, tmp_path):
    res = tmp_path / "results"
    for extra, expected in (((), "this checkpoint's fp8 KV-cache scheme makes vLLM use an fp8 KV cache"),
                            (("engine.args.kv_cache_dtype=fp8",), "vLLM-CPU's fp8 KV cache needs AVX-512 or AMX")):
        out = run_cli("evaluate", f"model={kv_artifact}", scenario, *extra, f"results_dir={res}", cwd=tmp_path,
                      avx2_host=True)
        assert out.returncode == 2, out.stderr[-3000:]
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("error: vllm cannot serve W8A8 int8 + fp8 KV") and expected in last, last
        assert "Traceback" not in out.stderr and "starting vLLM" not in out.stdout + out.stderr
        assert not results.read(res)


@pytest.mark.extended
def test_hf_serves_it_simulating_the_fp8_kv_cache(kv_artifact, scenario, tmp_path):
    res = tmp_path / "results"
    out = run_cli("evaluate", f"model={kv_artifact}", scenario, "engine=hf", "runs=1", "accuracy=none",
                  f"results_dir={res}", cwd=tmp_path, avx2_host=True)
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = results.read(res)
    assert row.status == "ok" and row.engine == "hf" and row.metrics["output_tokens"] == 16
    assert row.kv_quant == "fp8 simulated"
