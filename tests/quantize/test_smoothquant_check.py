"""SmoothQuant mappings are checked, not assumed, before calibration.

Phi (a parallel block) and OLMoE (a router) are families llm-compressor has
no SmoothQuant mappings for; its silent Llama-style fallback made garbage of
both. Through the real CLI they are one line (exit 2) before the tokenizer
or the calibration set is loaded; a Phi recipe with explicit mappings that
fit is checked and quantized. In process, on meta models: registered
families pass, MoE families are checked in their linearized layout, and
explicit mappings with a missing layer or mismatched widths are refused."""
import pytest

from quantize import smoothquant_check
from quantize.common.errors import UserError
from quantize.common.tiny_model import build_tiny
from quantize import recipe as recipes
from quantize.common.recipe_choices import RecipeChoice
from quantize.recipe import RecipeFile
from tests.conftest import SMALL_CALIB, check_ok, last_line, run_quantize, tail

# Phi's decoder layer is parallel: input_layernorm feeds the attention and the MLP at once,
# so every Linear reading it is balanced against it (and there is no second norm).
PHI_SMOOTH_RECIPE = """\
quant_stage:
  quant_modifiers:
    SmoothQuantModifier:
      smoothing_strength: 0.8
      mappings:
        - [["re:.*q_proj", "re:.*k_proj", "re:.*v_proj", "re:.*fc1"], "re:.*input_layernorm"]
    GPTQModifier:
      targets: [Linear]
      scheme: W8A8
      ignore: [lm_head]
      dampening_frac: 0.01
"""
REFUSED = "llm-compressor has no SmoothQuant mappings for"


@pytest.fixture(scope="module")
def families(tmp_path_factory, tokenizer_dir):
    """Tiny random checkpoints, built on first use: {family: dir}."""
    root = tmp_path_factory.mktemp("families")
    built = {}

    def get(family):
        if family not in built:
            built[family] = build_tiny(family, root / family, tokenizer_dir)
        return built[family]
    return get


def recipe_file(tmp_path, text, name="smooth.yaml") -> RecipeFile:
    path = tmp_path / name
    path.write_text(text)
    return recipes.load(RecipeChoice(name=path.stem, path=str(path)))


def explicit(tmp_path, *mappings: str) -> RecipeFile:
    lines = "".join(f"        - {m}\n" for m in mappings)
    return recipe_file(tmp_path, PHI_SMOOTH_RECIPE.split("      mappings:\n")[0] + "      mappings:\n" + lines
                       + "    GPTQModifier:\n      targets: [Linear]\n      scheme: W8A8\n      ignore: [lm_head]\n")


DEFAULT_RECIPE = """\
quant_stage:
  quant_modifiers:
    SmoothQuantModifier:
      smoothing_strength: 0.8
    GPTQModifier:
      targets: [Linear]
      scheme: W8A8
      ignore: [lm_head]
"""


# ---- in process, on meta models ------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3"])
def test_a_registered_family_passes_with_llm_compressors_mappings(families, tmp_path, family):
    smoothquant_check.check(recipe_file(tmp_path, DEFAULT_RECIPE), families(family))


@pytest.mark.parametrize("family,architecture", [("phi", "PhiForCausalLM"), ("olmoe", "OlmoeForCausalLM"),
                                                 ("granitemoe", "GraniteMoeForCausalLM")])
def test_a_family_without_registered_mappings_is_refused(families, tmp_path, family, architecture):
    with pytest.raises(UserError) as e:
        smoothquant_check.check(recipe_file(tmp_path, DEFAULT_RECIPE), families(family))
    message = str(e.value)
    assert f"{REFUSED} {architecture}" in message and "Llama-style defaults" in message
    assert "`mappings: [[<balance Linear layers>], <smooth norm layer>]`" in message
    assert "input_layernorm" in message  # what a decoder layer holds, to write the mappings from


def test_olmoe_is_listed_in_its_linearized_layout(families, tmp_path):
    with pytest.raises(UserError) as e:
        smoothquant_check.check(recipe_file(tmp_path, DEFAULT_RECIPE), families("olmoe"))
    assert "mlp.gate, mlp.experts.*.up_proj, mlp.experts.*.gate_proj, mlp.experts.*.down_proj" in str(e.value)


def test_explicit_mappings_that_fit_pass_for_an_unregistered_family(families, tmp_path):
    phi = recipe_file(tmp_path, PHI_SMOOTH_RECIPE)
    smoothquant_check.check(phi, families("phi"))


def test_explicit_mappings_reach_the_linearized_experts(families, tmp_path):
    """OLMoE's MLP mapping names the router and every expert's Linears, which
    exist only once the fused experts are linearized."""
    recipe = explicit(tmp_path, '[["re:.*q_proj", "re:.*k_proj", "re:.*v_proj"], "re:.*input_layernorm"]',
                      '[["re:.*mlp.gate$", "re:.*experts.*gate_proj", "re:.*experts.*up_proj"], '
                      '"re:.*post_attention_layernorm"]')
    smoothquant_check.check(recipe, families("olmoe"))


@pytest.mark.parametrize("family, mapping, message", [
    # down_proj takes the MLP's intermediate width (256), the norm puts out the hidden width (128)
    ("llama", '[["re:.*down_proj"], "re:.*post_attention_layernorm"]',
     r"balance layer model\.layers\.0\.mlp\.down_proj takes 256 input features "
     r"but its smooth layer model\.layers\.0\.post_attention_layernorm puts out 128"),
    # Qwen3-MoE's q_norm is per attention head (32 wide); the experts take the hidden width (128)
    ("qwen3_moe", '[["re:.*experts.*up_proj"], "re:.*self_attn.q_norm"]',
     r"experts\.\d+\.up_proj takes 128 input features "
     r"but its smooth layer model\.layers\.\d+\.self_attn\.q_norm puts out 32"),
])
def test_a_width_mismatch_is_refused(families, tmp_path, family, mapping, message):
    with pytest.raises(UserError, match=message):
        smoothquant_check.check(explicit(tmp_path, mapping), families(family))


def test_a_missing_layer_is_refused(families, tmp_path):
    recipe = explicit(tmp_path, '[["re:.*query_key_value"], "re:.*input_layernorm"]')
    with pytest.raises(UserError, match=r"mappings in the recipe name layers LlamaForCausalLM lacks "
                                        r"\(re:\.\*query_key_value\)"):
        smoothquant_check.check(recipe, families("llama"))


def test_a_smooth_layer_without_a_weight_is_refused(families, tmp_path):
    # the decoder layer itself matches as the "smooth layer": a module with no weight to divide
    recipe = explicit(tmp_path, '[["re:.*q_proj"], "re:.*layers\\\\.\\\\d+$"]')
    with pytest.raises(UserError, match="has no weight to scale"):
        smoothquant_check.check(recipe, families("llama"))


def test_widths_are_checked_on_a_meta_model_without_reading_weights(families):
    import torch
    model = smoothquant_check._meta_model(families("olmoe"))
    weights = [p for p in model.parameters()]
    assert weights and all(p.device == torch.device("meta") for p in weights)
    assert model.get_submodule("model.layers.0.mlp.experts.3.down_proj").in_features == 128


# ---- through the real CLI -----------------------------------------------------

@pytest.mark.parametrize("family,architecture", [("phi", "PhiForCausalLM"), ("olmoe", "OlmoeForCausalLM")])
def test_the_cli_refuses_an_unregistered_family_in_one_line_before_calibration(families, tmp_path, family,
                                                                               architecture):
    arts = tmp_path / "artifacts"
    proc = run_quantize("recipe=w8a8_smooth_gptq", f"model={families(family)}", *SMALL_CALIB,
                        f"artifacts_dir={arts}", cwd=tmp_path)
    assert proc.returncode == 2, tail(proc)
    line = last_line(proc.stderr)
    assert line.startswith("error: ") and "Traceback" not in proc.stdout + proc.stderr, tail(proc)
    assert f"{REFUSED} {architecture}" in line and "mappings: [[" in line, line
    assert "load tokenizer and calibration" not in proc.stdout + proc.stderr  # nothing loaded or calibrated
    assert not arts.exists()


@pytest.mark.extended
@pytest.mark.slow
def test_phi_with_explicit_mappings_is_checked_and_quantized(families, tmp_path):
    import json
    recipe = tmp_path / "w8a8_smooth_gptq_phi.yaml"
    recipe.write_text(PHI_SMOOTH_RECIPE)
    arts = tmp_path / "artifacts"
    check_ok(run_quantize(f"recipe={recipe}", f"model={families('phi')}", *SMALL_CALIB,
                          f"artifacts_dir={arts}", cwd=tmp_path))
    manifest_path = next(arts.rglob("manifest.json"))
    manifest = json.loads(manifest_path.read_text())
    assert manifest["model"]["architecture"] == "PhiForCausalLM"
    assert manifest["modules_changed"]["quantized"] > 0
    # Llama-style defaults made this 0.017; fitting mappings keep the model (0.973 measured, 0.992 without SQ)
    assert top1_agreement(families("phi"), manifest_path.parent) >= MIN_TOP1_AGREEMENT


MIN_TOP1_AGREEMENT = 0.9  # of the artifact's next-token argmax with its base's, on 4 x 64 random tokens


def top1_agreement(base_dir, artifact_dir) -> float:
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(1)
    models = [AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for d in (base_dir, artifact_dir)]
    ids = torch.randint(0, models[0].config.vocab_size, (4, 64))
    with torch.no_grad():
        base, quantized = (m(ids).logits.argmax(-1) for m in models)
    return (base == quantized).float().mean().item()
