"""MoE linearization for every fused-experts layout transformers uses, on
tiny random models of each (in process, real transformers/llm-compressor):
the linearized model computes what the fused one did, and a save/reload
round trip stores names that the original class (where its conversion
mapping reads per-expert tensors) and quantbench's reload check accept with
nothing missing or unexpected. Also: the reload check reports a missing
router or head, while a renamed one passes."""
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quantize import verify
from quantize.common import moe
from quantize.common.checkpoint import ignore_unquantized
from quantize.common.tiny_model import build_tiny

LAYOUTS = ("qwen3_moe", "olmoe", "granitemoe", "mixtral", "deepseek_v3")
# Per layout: the name one stored tensor must carry after linearization (what
# the original class's converters and vLLM read), and a router.
STORED = {
    "qwen3_moe": ("model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.0.mlp.gate.weight"),
    "olmoe": ("model.layers.0.mlp.experts.0.gate_proj.weight", "model.layers.0.mlp.gate.weight"),
    "granitemoe": ("model.layers.0.block_sparse_moe.experts.0.gate_proj.weight",
                   "model.layers.0.block_sparse_moe.router.weight"),
    "mixtral": ("model.layers.0.block_sparse_moe.experts.0.w1.weight", "model.layers.0.block_sparse_moe.gate.weight"),
    # first_k_dense_replace=1: layer 0 is dense, layer 1 holds the experts
    "deepseek_v3": ("model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.1.mlp.gate.weight"),
}
# transformers 5.17 maps GraniteMoE's fused experts from legacy fused tensors
# only: its original class has no converter reading per-expert tensors.
READS_PER_EXPERT = set(LAYOUTS) - {"granitemoe"}
IDS = torch.arange(1, 17).unsqueeze(0)


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _fused_params(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.dim() == 3 and n.rpartition(".")[2] in moe.FUSED_EXPERT_PARAMS]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("layouts")
    return lambda family: build_tiny(family, root / family, tokenizer_dir, dtype="float32")


@pytest.mark.parametrize("family", LAYOUTS)
def test_linearize_keeps_logits_and_round_trips(family, tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    src = tiny_dir(family)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    fused_logits = _logits(model)
    assert _fused_params(model), "the layout under test has fused experts"
    moe.linearize(model)
    assert not _fused_params(model)
    assert torch.allclose(_logits(model), fused_logits, atol=1e-5)

    out = tmp_path / "linearized"
    model.save_pretrained(out)
    stored = set(load_file(out / "model.safetensors"))
    expert, router = STORED[family]
    assert expert in stored and router in stored, sorted(n for n in stored if "layers.1." in n)[:12]
    assert not any(".router.layer." in n or n.endswith(moe.FUSED_EXPERT_PARAMS) for n in stored)

    # quantbench's reload check: every stored tensor finds its parameter and back
    reloaded = moe.reload_dense(out)
    assert torch.allclose(_logits(reloaded), fused_logits, atol=1e-5)
    # plain modules: an offloaded expert (onloaded to the CPU per call) breaks the model moved to a GPU
    assert not [n for n, m in reloaded.named_modules() if hasattr(m, "_original_forward_func")]
    if family in READS_PER_EXPERT:  # the original class, through transformers' own loading report
        original, report = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
        assert not (report["missing_keys"] or report["unexpected_keys"] or report["mismatched_keys"]), report
        assert _fused_params(original)
        assert torch.allclose(_logits(original), fused_logits, atol=1e-5)


def _drop(directory, name):
    path = directory / "model.safetensors"
    tensors = load_file(path)
    del tensors[name]
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("family", ["granitemoe", "mixtral"])
def test_reload_check_names_a_missing_router(family, tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_dir(family), dtype=torch.float32)
    moe.linearize(model)
    model.save_pretrained(tmp_path)
    _drop(tmp_path, STORED[family][1])
    with pytest.raises(RuntimeError, match=r"missing tensor model\.layers\.0\..*(router|gate)\.weight"):
        moe.reload_dense(tmp_path)


def test_renamed_head_passes_a_missing_one_fails(tiny_dir, tmp_path):
    """GPT-NeoX stores its head as embed_out: transformers' report knows it."""
    import shutil
    src = tiny_dir("gpt_neox")
    with safe_open(src / "model.safetensors", "pt") as f:
        assert "embed_out.weight" in f.keys()
    assert verify.check(src, "reload", prunes=False)["logits_finite"]
    assert verify.check(src, "tensors", prunes=False)["layout_matches_model"]
    broken = tmp_path / "broken"
    shutil.copytree(src, broken)
    _drop(broken, "embed_out.weight")
    with pytest.raises(RuntimeError, match="missing tensor .*(embed_out|lm_head)"):
        verify.check(broken, "reload", prunes=False)


def test_tied_falcon_head_left_unquantized_is_listed_as_ignored(tiny_dir, tmp_path):
    """compressed-tensors lists Falcon's skipped lm_head (a Linear among
    FalconLinear layers) nowhere; a loader would quantize it and find no
    scales. ignore_unquantized writes it into the saved config."""
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_dir("falcon"), dtype=torch.float32)
    scheme = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64}}
    q = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    apply_quantization_config(model, q)
    config = {"model_type": "falcon", "quantization_config": q.model_dump(mode="json") | {"ignore": []}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert ignore_unquantized(tmp_path, model) == ["lm_head"]
    assert json.loads((tmp_path / "config.json").read_text())["quantization_config"]["ignore"] == ["lm_head"]
    assert ignore_unquantized(tmp_path, model) == []  # idempotent


@pytest.mark.extended
@pytest.mark.slow
def test_quantize_builds_and_verifies_granitemoe_and_mixtral(tiny_dir, tmp_path):
    """The cells the reload check used to reject: `python -m quantize` builds
    W4A16 of both, verified by reloading, under the names vLLM and the model
    class read (GraniteMoE's router.weight; Mixtral's block_sparse_moe w1/w2/w3)."""
    from tests.conftest import run_cli
    models = ",".join(str(tiny_dir(f)) for f in ("granitemoe", "mixtral"))
    arts = tmp_path / "artifacts"
    proc = run_cli("quantize", "-m", "model=local", f"model.path={models}", "recipe=w4a16_gptq",
                   "calibration.num_samples=8", "calibration.max_seq_len=64", f"artifacts_dir={arts}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for family, name in (("granitemoe", "model.layers.0.block_sparse_moe.router.weight"),
                         ("mixtral", "model.layers.0.block_sparse_moe.experts.3.w2.weight_packed")):
        art = arts / family / "w4a16_gptq"
        assert json.loads((art / "manifest.json").read_text())["checks"]["verified_by"] == "reload"
        with safe_open(art / "model.safetensors", "pt") as f:
            assert name in set(f.keys())
