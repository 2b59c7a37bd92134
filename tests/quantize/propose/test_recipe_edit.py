"""recipe_edit: kept-dense modules join the ignore list of every quantization
and pruning modifier, as llm-compressor matches them; the weight scheme and
its bytes per matrix."""
import re

import pytest
import yaml

from quantize.common.errors import UserError
from quantize.common.recipe_edit import (WeightScheme, config_groups, expert_siblings, fused_siblings, weight_scheme,
                                        with_kept_dense)
from tests.conftest import RECIPES_DIR

KEPT = ["model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj"]


def modifier_args(text: str) -> dict:
    """{modifier name: args} of a recipe's stage/group nesting."""
    out = {}

    def walk(node):
        for key, value in node.items():
            if key.endswith("Modifier"):
                out[key] = value
            elif isinstance(value, dict):
                walk(value)
    walk(yaml.safe_load(text))
    return out


def test_kept_modules_join_every_quantization_and_pruning_modifier():
    edited = modifier_args(with_kept_dense((RECIPES_DIR / "w8a16_sparse_awq.yaml").read_text(), KEPT))
    # pruning names a module "model.layers.1.mlp.down_proj.": a pattern that takes the dot
    pruning = edited["SparseGPTModifier"]["ignore"]
    assert pruning[0] == "re:.*lm_head" and len(pruning) == 1 + len(KEPT)
    for pattern, name in zip(pruning[1:], KEPT):
        assert re.match(pattern.removeprefix("re:"), name + ".")
    assert not re.match(pruning[1].removeprefix("re:"), "model.layers.11.mlp.down_proj.")   # layer 1 only
    assert edited["QuantizationModifier"]["ignore"] == ["lm_head", *KEPT]
    # AWQ here only rescales (no scheme of its own): its mappings stay whole
    assert "ignore" not in edited["AWQModifier"]
    # the rest of the recipe is unchanged
    assert edited["SparseGPTModifier"]["mask_structure"] == "2:4"
    assert edited["QuantizationModifier"]["config_groups"]["group_0"]["weights"]["num_bits"] == 8


def test_existing_entries_are_kept_and_none_repeated():
    text = """\
stage:
  modifiers:
    GPTQModifier:
      ignore: lm_head
      scheme: W4A16
      targets: [Linear]
"""
    once = with_kept_dense(text, KEPT + KEPT[:1])
    assert modifier_args(once)["GPTQModifier"]["ignore"] == ["lm_head", *KEPT]
    assert with_kept_dense(once, KEPT) == once


def test_a_modifier_without_an_ignore_list_gets_one():
    text = "stage:\n  modifiers:\n    QuantizationModifier:\n      scheme: FP8_DYNAMIC\n      targets: [Linear]\n"
    assert modifier_args(with_kept_dense(text, KEPT))["QuantizationModifier"]["ignore"] == KEPT


def test_a_recipe_that_neither_quantizes_nor_prunes_is_refused():
    with pytest.raises(UserError, match="no quantization or pruning modifier"):
        with_kept_dense((RECIPES_DIR / "original.yaml").read_text(), KEPT)


def test_llm_compressor_matches_the_full_module_names():
    """The names the sensitivity file gives are what compressed-tensors'
    ignore matching takes: exact, not a suffix."""
    from compressed_tensors.utils.match import match_name
    assert match_name("model.layers.1.mlp.down_proj", KEPT[0])
    assert not match_name("model.layers.11.mlp.down_proj", KEPT[0])
    assert not match_name("model.layers.1.mlp.down_proj", "mlp.down_proj")


def scheme_of(recipe: str) -> WeightScheme | None:
    return weight_scheme(config_groups(yaml.safe_load((RECIPES_DIR / f"{recipe}.yaml").read_text()), recipe))


def test_the_weight_scheme_of_a_config_group_or_a_preset():
    assert scheme_of("w4a16_gptq") == WeightScheme(num_bits=4, strategy="group", group_size=64, symmetric=False,
                                                   type="int")
    fp8 = scheme_of("fp8_dynamic")
    assert (fp8.num_bits, fp8.type, fp8.strategy, fp8.activation_bits, fp8.key) == (
        8, "float", "channel", 8, "w8a8-fp8-channel-sym")
    assert scheme_of("w4a16_gptq").key == "w4a16-g64-asym"
    assert scheme_of("original") is None


def test_bytes_per_matrix_counts_values_scales_and_zero_points():
    w4 = WeightScheme(num_bits=4, strategy="group", group_size=64, symmetric=False)
    # 256x128 int4: 16384 B of values; 256 rows x 2 groups, each a 2-byte scale and a 4-bit zero point
    assert w4.bytes_per_matrix(256, 128, scale_bytes=2) == 16384 + 512 * 2.5
    channel = WeightScheme(num_bits=8, strategy="channel", symmetric=True)
    assert channel.bytes_per_matrix(256, 128, scale_bytes=2) == 256 * 128 + 256 * 2


def test_fused_siblings_are_the_other_shards_of_vllms_fused_matrices():
    assert fused_siblings("model.layers.3.self_attn.v_proj") == ["model.layers.3.self_attn.q_proj",
                                                                 "model.layers.3.self_attn.k_proj"]
    assert fused_siblings("mlp.up_proj") == ["mlp.gate_proj"]
    assert fused_siblings("model.layers.3.mlp.down_proj") == fused_siblings("self_attn.o_proj") == []


def test_mlas_compressed_q_and_kv_projections_are_one_fused_matrix_in_vllm():
    """DeepSeek-V2/V3 with q_lora_rank: vLLM loads q_a_proj and
    kv_a_proj_with_mqa as fused_qkv_a_proj, and refuses them with two schemes."""
    assert fused_siblings("model.layers.3.self_attn.kv_a_proj_with_mqa") == ["model.layers.3.self_attn.q_a_proj"]
    assert fused_siblings("self_attn.q_a_proj") == ["self_attn.kv_a_proj_with_mqa"]
    assert fused_siblings("self_attn.kv_b_proj") == fused_siblings("self_attn.q_b_proj") == []


def test_kept_dense_cells_take_their_fused_siblings_along():
    from quantize.common.sensitivity_file import Cell, Sensitivity
    kl = {"self_attn.v_proj": 0.5, "mlp.down_proj": 0.3, "self_attn.q_proj": 0.1, "self_attn.k_proj": 0.05,
          "self_attn.o_proj": 0.02, "mlp.up_proj": 0.01, "mlp.gate_proj": 0.2}
    cells = [Cell(layer=0, group=g, modules=[f"model.layers.0.{g}"], kl=v, params=1) for g, v in kl.items()]
    sens = Sensitivity(model_name="m", model_path="", weights_hash="0" * 64, recipe="r", scheme_key="s", scheme={},
                       text={}, cells=cells)
    names = [[c.group for c in sens.kept_dense(k)] for k in range(4)]
    assert names == [[], ["self_attn.v_proj", "self_attn.q_proj", "self_attn.k_proj"],
                     ["self_attn.v_proj", "self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"],
                     ["self_attn.v_proj", "self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj",
                      "mlp.gate_proj", "mlp.up_proj"]]
    assert sens.most_sensitive_modules(1) == ["model.layers.0.self_attn.v_proj"]   # unchanged: the ranking alone


def test_a_kept_expert_takes_every_expert_of_its_moe_block_along():
    """vLLM runs a block's routed experts as one FusedMoE with one scheme
    (taken from expert 0): one expert dense alone does not load."""
    from quantize.common.sensitivity_file import Cell, Sensitivity
    experts = [f"mlp.experts.{e}.{p}" for e in range(2) for p in ("gate_proj", "up_proj", "down_proj")]
    kl = {"mlp.experts.1.down_proj": 0.5, "self_attn.o_proj": 0.3, "mlp.shared_experts.up_proj": 0.01}
    cells = [Cell(layer=layer, group=g, modules=[f"model.layers.{layer}.{g}"], kl=kl.get(g, 0.001) / (layer + 1),
                  params=1) for layer in (0, 1) for g in [*experts, "self_attn.o_proj", "mlp.shared_experts.up_proj"]]
    sens = Sensitivity(model_name="m", model_path="", weights_hash="0" * 64, recipe="r", scheme_key="s", scheme={},
                       text={}, cells=cells)
    kept = [(c.layer, c.group) for c in sens.kept_dense(1)]
    assert kept[0] == (0, "mlp.experts.1.down_proj") and sorted(kept) == sorted((0, g) for g in experts)
    assert expert_siblings("mlp.shared_experts.up_proj", experts + ["mlp.shared_experts.up_proj"]) == []
