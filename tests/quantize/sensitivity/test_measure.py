"""The parts of the measurement, in process on the tiny model: the recipe's
scheme and its key, fake quantization on the scheme's grid, weights restored
after a cell, the layer-by-layer replay, the KL, the heat map."""
import pytest
import torch

from quantize import recipe as recipes
from quantize.common import recipe_choices, sensitivity_file
from quantize.common.errors import UserError
from quantize.common.sensitivity_plot import draw_heatmap
from quantize.sensitivity import measure, scheme as schemes


def scheme_of(name: str) -> schemes.WeightScheme:
    return schemes.from_recipe(recipes.load(recipe_choices.find(name)))


@pytest.mark.parametrize("recipe,key", [
    ("w4a16_gptq", "w4a16-g64-asym"), ("w4a16_awq", "w4a16-g64-asym"), ("w8a16_awq", "w8a16-channel-sym"),
    ("w8a8_smooth_ptq", "w8a8-channel-sym"), ("fp8_dynamic", "w8a8-fp8-channel-sym"),
])
def test_the_scheme_key_of_shipped_recipes(recipe, key):
    scheme = scheme_of(recipe)
    assert scheme.key == key and scheme.ignore == ["lm_head"]


def test_a_preset_scheme_keeps_its_activations_on_record_but_applies_weights_only():
    recorded = scheme_of("w8a8_smooth_ptq").as_dict()
    assert recorded["input_activations"]["num_bits"] == 8
    assert recorded["applied"].startswith("weights only")


def test_the_baseline_recipe_is_refused():
    with pytest.raises(UserError, match="quantizes nothing"):
        scheme_of("original")


def test_fake_quantization_lands_on_the_group_grid():
    weights = scheme_of("w4a16_rtn").weights          # int4, asymmetric, groups of 64
    torch.manual_seed(0)
    w = torch.randn(8, 128)
    q = schemes.fake_quantize(w, weights)
    groups, quantized = w.reshape(8, 2, 64), q.reshape(8, 2, 64)
    steps = (groups.amax(-1).clamp(min=0) - groups.amin(-1).clamp(max=0)) / 15
    assert all(len(torch.unique(g)) <= 16 for g in quantized.reshape(16, 64))
    assert ((quantized - groups).abs() <= steps.unsqueeze(-1) / 2 + 1e-6).all()
    assert not torch.equal(q, w)


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


WINDOWS = [list(range(100, 132)), list(range(500, 532))]


def test_a_cell_changes_the_output_and_its_weights_come_back(tiny):
    runner = measure.LayerwiseModel(tiny, WINDOWS)
    cells = measure.groups(tiny, scheme_of("w4a16_rtn"))
    assert [c.name for c in cells[:7]] == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    before = {name: p.clone() for name, p in tiny.named_parameters()}
    kl = measure.KL(runner.reference_logits)
    assert kl(runner.logits_from(1)) == pytest.approx(0, abs=1e-6)
    with measure.quantized([cells[9]], scheme_of("w4a16_rtn").weights):
        assert kl(runner.logits_from(1)) > 1e-6
    assert all(torch.equal(p, before[name]) for name, p in tiny.named_parameters())


def test_the_replay_from_a_layer_is_the_model_forward(tiny):
    runner = measure.LayerwiseModel(tiny, WINDOWS)
    cells = measure.groups(tiny, scheme_of("w4a16_rtn"))
    with measure.quantized([cells[3]], scheme_of("w4a16_rtn").weights):
        whole = tiny(torch.tensor(WINDOWS)).logits[:, :-1]
        assert torch.allclose(runner.logits_from(0), whole, atol=1e-5)


def test_the_kl_is_the_full_vocabulary_kl_per_token():
    torch.manual_seed(0)
    p_logits, q_logits = torch.randn(2, 5, 50), torch.randn(2, 5, 50)
    expected = torch.nn.functional.kl_div(torch.log_softmax(q_logits, -1), torch.log_softmax(p_logits, -1),
                                          log_target=True, reduction="sum") / 10
    assert measure.KL(p_logits)(q_logits) == pytest.approx(float(expected), rel=1e-5)


def sensitivity() -> sensitivity_file.Sensitivity:
    cells = [sensitivity_file.Cell(layer, group, [f"model.layers.{layer}.{group}"], kl, 100)
             for layer in range(3) for group, kl in (("self_attn.q_proj", 0.0), ("mlp.down_proj", 0.01 * (layer + 1)))]
    return sensitivity_file.Sensitivity("m", "/m", "ab" * 32, "w4a16_rtn", "w4a16-g64-asym", {}, {}, cells)


def test_the_heat_map_is_written_as_its_suffix_says(tmp_path):
    draw_heatmap(sensitivity(), tmp_path / "map.svg")
    svg = (tmp_path / "map.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "KL (nats/token)" in svg
    draw_heatmap(sensitivity(), tmp_path / "map.png")
    assert (tmp_path / "map.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(UserError, match="name a .png or .svg file"):
        draw_heatmap(sensitivity(), tmp_path / "map.pdf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.png", "map.svg"]


def test_a_file_counts_as_measured_only_for_the_same_text(tmp_path):
    from quantize.sensitivity.run import _existing
    text = {"source": "austen", "books": ["persuasion"], "num_windows": 4, "window_len": 128,
            "scored_tokens": 508, "sha256": "00"}
    scheme = scheme_of("w4a16_rtn").as_dict()
    measured = sensitivity_file.Sensitivity(**{**vars(sensitivity()), "text": text, "scheme": scheme})
    path = sensitivity_file.write(tmp_path, measured)
    assert _existing(tmp_path, text, scheme) == path
    assert _existing(tmp_path, {**text, "num_windows": 8}, scheme) is None
    assert _existing(tmp_path, text, {**scheme, "ignore": ["lm_head", "model.layers.0.mlp.down_proj"]}) is None
    path.write_text("{ damaged")
    assert _existing(tmp_path, text, scheme) is None


def test_a_recipe_that_keeps_other_modules_dense_has_its_own_key():
    usual = scheme_of("w4a16_rtn")
    kept = schemes.WeightScheme(usual.weights, None, ["Linear"], ["lm_head", "model.layers.3.mlp.down_proj"])
    assert kept.key.startswith("w4a16-g64-asym-m") and len(kept.key) == len("w4a16-g64-asym-m") + 6
    assert schemes.WeightScheme(usual.weights, None, ["Linear"], ["lm_head"]).key == "w4a16-g64-asym"


def test_a_moe_models_experts_are_cells_as_quantize_quantizes_them(tokenizer_dir, tmp_path):
    """transformers keeps a MoE's experts as fused 3-D weights: measured as
    loaded, every expert was left out; linearized as quantize does, each
    expert's Linear is a cell."""
    from quantize.common.tiny_model import build_tiny_qwen3_moe
    from quantize.sensitivity.run import _measure
    model_dir = build_tiny_qwen3_moe(tmp_path / "tiny-moe", tokenizer_dir, layers=1)
    cells, baseline = _measure(model_dir, scheme_of("w4a16_rtn"), [list(range(100, 116))])
    groups = {cell.group for cell in cells}
    assert {f"mlp.experts.{e}.{p}" for e in range(4) for p in ("gate_proj", "up_proj", "down_proj")} <= groups
    assert "self_attn.q_proj" in groups and baseline > 0
