"""AWQ mappings are checked, not assumed, before calibration.

Without `mappings:` llm-compressor's AWQModifier falls back to Llama-style
defaults for an architecture it has none for: on Mixtral/OLMoE/GraniteMoE the
norm is divided by the scales and the router reading it is not compensated
(exit 0, a wrong checkpoint); on Phi/Olmo2/GPT-NeoX/Falcon it failed only after
loading and calibrating. Through the real CLI such a family is one line (exit
2) before the tokenizer or the calibration set is loaded. In process, on meta
models: registered families pass, explicit mappings that fit pass, and ones
naming missing layers, mismatched widths, or that do not group into decoder
layers are refused."""
import pytest

from quantize import awq_check
from quantize import recipe as recipes
from quantize.common.errors import UserError
from quantize.common.recipe_choices import RecipeChoice
from quantize.common.tiny_model import build_tiny
from quantize.recipe import RecipeFile
from tests.conftest import SMALL_CALIB, last_line, run_quantize, tail

REFUSED = "llm-compressor has no AWQ mappings for"
QUANTIZE = """\
    QuantizationModifier:
      ignore: [lm_head]
      config_groups:
        group_0:
          targets: [Linear]
          weights: {num_bits: 4, type: int, symmetric: false, strategy: group, group_size: 64}
"""
# Mixtral's MLP mapping balances the router with the experts, as llm-compressor's MoE mappings do
MIXTRAL_MAPPINGS = """\
        - smooth_layer: "re:.*input_layernorm$"
          balance_layers: ["re:.*q_proj$", "re:.*k_proj$", "re:.*v_proj$"]
        - smooth_layer: "re:.*post_attention_layernorm$"
          balance_layers: ["re:.*mlp.gate$", "re:.*experts.*.gate_proj$", "re:.*experts.*.up_proj$"]
"""


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


def awq_recipe(tmp_path, mappings: str | None = None) -> RecipeFile:
    path = tmp_path / "awq.yaml"
    given = f"      mappings:\n{mappings}" if mappings else ""
    path.write_text(f"quant_stage:\n  quant_modifiers:\n    AWQModifier:\n      duo_scaling: true\n{given}{QUANTIZE}")
    return recipes.load(RecipeChoice(name=path.stem, path=str(path)))


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma2", "qwen3_moe"])
def test_a_registered_family_passes_with_llm_compressors_mappings(families, tmp_path, family):
    awq_check.check(awq_recipe(tmp_path), families(family))


@pytest.mark.parametrize("family, architecture", [
    ("mixtral", "MixtralForCausalLM"), ("olmoe", "OlmoeForCausalLM"), ("granitemoe", "GraniteMoeForCausalLM"),
    ("phi", "PhiForCausalLM"), ("olmo2", "Olmo2ForCausalLM")])
def test_a_family_without_registered_mappings_is_refused(families, tmp_path, family, architecture):
    with pytest.raises(UserError) as e:
        awq_check.check(awq_recipe(tmp_path), families(family))
    message = str(e.value)
    assert f"{REFUSED} {architecture}" in message and "Llama-style defaults" in message
    assert "`mappings: [{smooth_layer: <norm layer>, balance_layers: [" in message
    assert "input_layernorm" in message and "\n" not in message


def test_the_refusal_lists_the_router_a_moe_layer_holds(families, tmp_path):
    with pytest.raises(UserError, match=r"mlp\.gate, mlp\.experts\.\*\.up_proj"):
        awq_check.check(awq_recipe(tmp_path), families("mixtral"))


def test_explicit_mappings_that_fit_pass_for_an_unregistered_moe_family(families, tmp_path):
    awq_check.check(awq_recipe(tmp_path, MIXTRAL_MAPPINGS), families("mixtral"))


def test_explicit_mappings_naming_a_missing_layer_are_refused(families, tmp_path):
    bad = '        - smooth_layer: "re:.*input_layernorm$"\n          balance_layers: ["re:.*query_key_value$"]\n'
    with pytest.raises(UserError, match=r"AWQ mappings in the recipe name layers MixtralForCausalLM lacks "
                                        r"\(re:\.\*query_key_value\$\)"):
        awq_check.check(awq_recipe(tmp_path, bad), families("mixtral"))


def test_a_width_mismatch_is_refused(families, tmp_path):
    # down_proj takes the MLP's intermediate width (256), the norm puts out the hidden width (128)
    bad = '        - smooth_layer: "re:.*post_attention_layernorm$"\n          balance_layers: ["re:.*down_proj$"]\n'
    with pytest.raises(UserError, match=r"balance layer model\.layers\.0\.mlp\.down_proj takes 256 input features "
                                        r"but its smooth layer model\.layers\.0\.post_attention_layernorm puts out 128"):
        awq_check.check(awq_recipe(tmp_path, bad), families("llama"))


def test_registered_mappings_that_do_not_group_are_refused_before_calibration(families, tmp_path):
    """The tiny DeepSeek-V3's first layer is dense (no router): llm-compressor's
    mapping groups two layers' norms together and oneshot raised "AWQ needs to
    match a single smoothlayer" after loading the model."""
    with pytest.raises(UserError, match=r"matches several smooth layers in one block \(model\.layers\.0\."
                                        r"post_attention_layernorm, model\.layers\.1\.post_attention_layernorm\)"):
        awq_check.check(awq_recipe(tmp_path), families("deepseek_v3"))


def test_the_cli_refuses_an_unregistered_moe_family_in_one_line_before_calibration(families, tmp_path):
    arts = tmp_path / "artifacts"
    proc = run_quantize("recipe=w4a16_awq", f"model={families('mixtral')}", *SMALL_CALIB,
                        f"artifacts_dir={arts}", cwd=tmp_path)
    assert proc.returncode == 2, tail(proc)
    line = last_line(proc.stderr)
    assert line.startswith("error: ") and "Traceback" not in proc.stdout + proc.stderr, tail(proc)
    assert f"{REFUSED} MixtralForCausalLM" in line and "mappings: [{smooth_layer" in line, line
    assert "load tokenizer and calibration" not in proc.stdout + proc.stderr  # nothing loaded or calibrated
    assert not arts.exists()
