"""A recipe of several config groups: the modules it quantizes, with which
weight scheme, are one answer for the size estimate (propose, quantize's disk
check) and for which sensitivity file fits it (sensitivity, propose)."""
import dataclasses
import math

import pytest
import torch
import yaml

from quantize import recipe as recipes
from quantize.common import recipe_choices
from quantize.common.errors import UserError
from quantize.common.recipe_edit import ConfigGroup, config_groups, group_of
from quantize.common.sensitivity_file import modules_of
from quantize.config import ModelChoice
from quantize.propose.config import ProposeConfig, Target
from quantize.propose.run import run
from quantize.propose.size import ModelWeights, expected_bytes
from quantize.sensitivity import measure, scheme as schemes
from tests.conftest import RECIPES_DIR, TINY_NAME
from tests.quantize.propose.synthetic import W4_G64_ASYM, cells_with_kl, linear_weights, write_sensitivity

W4 = W4_G64_ASYM["weights"]
W8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
A8_TOKEN = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
ATTENTION, MLP = "re:.*self_attn\\..*_proj$", "re:.*mlp\\..*_proj$"


def recipe_text(groups: dict, ignore=("lm_head",)) -> str:
    return yaml.safe_dump({"quant_stage": {"quant_modifiers": {"QuantizationModifier": {
        "ignore": list(ignore), "config_groups": groups}}}})


# One scheme in two groups: every decoder Linear at int4.
TWO_GROUPS = recipe_text({"attention": {"targets": [ATTENTION], "weights": W4},
                          "mlp": {"targets": [MLP], "weights": W4}})
ATTENTION_ONLY = recipe_text({"group_0": {"targets": [ATTENTION], "weights": W4}})
# Two schemes: down_proj matches both groups; compressed-tensors gives it the
# group of its more specific target (a pattern before the class Linear).
TWO_SCHEMES = recipe_text({"group_0": {"targets": ["Linear"], "weights": W4},
                           "group_1": {"targets": ["re:.*down_proj$"], "weights": W8}})
# down_proj's own group quantizes its input alone: its weights stay dense.
ACTS_ONLY = recipe_text({"group_0": {"targets": ["Linear"], "weights": W4},
                         "group_1": {"targets": ["re:.*down_proj$"], "input_activations": A8_TOKEN}})
# A KV cache alone, its scheme written out as null: no group quantizes weights.
KV_ONLY = yaml.safe_dump({"quant_stage": {"quant_modifiers": {"QuantizationModifier": {
    "ignore": ["lm_head"], "scheme": None,
    "kv_cache_scheme": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}}}}})
MADE = {"two_groups": TWO_GROUPS, "two_schemes": TWO_SCHEMES, "acts_only": ACTS_ONLY, "kv_only": KV_ONLY}


def load(tmp_path, name: str, text: str) -> recipes.RecipeFile:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return recipes.load(recipe_choices.RecipeChoice(name, str(path)))


def config(tmp_path, tiny_model, recipe: recipes.RecipeFile, results, **changes) -> ProposeConfig:
    base = ProposeConfig(model=ModelChoice(TINY_NAME, str(tiny_model)),
                         recipe=recipe_choices.RecipeChoice(recipe.name, str(recipe.path)),
                         target=Target("kept_dense", 1), results_dir=str(results),
                         artifacts_dir=str(tmp_path / "artifacts"), recipes_dir=str(tmp_path / "recipes"))
    return dataclasses.replace(base, **changes)


def top_down_proj(layer: int, group: str) -> float:
    return 0.5 if (layer, group) == (1, "mlp.down_proj") else 0.01


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def test_sensitivity_measures_every_group_of_one_scheme(tmp_path, tiny):
    scheme = schemes.from_recipe(load(tmp_path, "two_groups", TWO_GROUPS))
    assert modules_of(scheme.targets, scheme.ignore) == modules_of([ATTENTION, MLP], ["lm_head"])
    measured = {f"{g.layer}.{g.name}" for g in measure.groups(tiny, scheme)}
    assert {"0.mlp.down_proj", "1.mlp.gate_proj", "0.self_attn.q_proj"} <= measured and len(measured) == 14
    assert scheme.key != schemes.from_recipe(load(tmp_path, "attention_only", ATTENTION_ONLY)).key


def test_propose_takes_no_file_of_the_first_groups_modules_alone(tmp_path, tiny_model):
    """A file measured on attention alone does not fit a recipe that also
    quantizes the MLP: its cells and baseline leave the MLP out."""
    results = tmp_path / "results"
    recipe = load(tmp_path, "two_groups", TWO_GROUPS)
    attention_cells = [c for c in cells_with_kl(tiny_model, top_down_proj) if c.group.startswith("self_attn.")]
    attention = schemes.from_recipe(load(tmp_path, "attention_only", ATTENTION_ONLY))
    write_sensitivity(results, tiny_model, attention_cells, scheme=attention.as_dict(), scheme_key=attention.key)
    with pytest.raises(UserError, match="no sensitivity file for model .*only for other schemes"):
        run(config(tmp_path, tiny_model, recipe, results))
    both = schemes.from_recipe(recipe)
    own = write_sensitivity(results, tiny_model, cells_with_kl(tiny_model, top_down_proj), scheme=both.as_dict(),
                            scheme_key=both.key)
    proposal = run(config(tmp_path, tiny_model, recipe, results))
    assert proposal.sensitivity_path == own and proposal.modules == ["model.layers.1.mlp.down_proj"]


@pytest.mark.parametrize("name", [p.stem for p in sorted(RECIPES_DIR.glob("*.yaml"))] + sorted(MADE))
def test_the_config_groups_are_those_llm_compressor_resolves(tmp_path, name):
    """Read from the recipe as llm-compressor resolves its modifiers (but the
    observer and GPTQ's activation order it adds, which size no weight)."""
    from llmcompressor.recipe import Recipe
    text = MADE.get(name) or (RECIPES_DIR / f"{name}.yaml").read_text()
    (tmp_path / "recipe.yaml").write_text(text)
    modifiers = [m for m in Recipe.create_instance(str(tmp_path / "recipe.yaml")).modifiers
                 if hasattr(m, "resolve_quantization_config")]
    resolved = [(tuple(g.targets), tuple(config.ignore or ()),
                 ConfigGroup("", g.weights, g.input_activations, (), ()).scheme)
                for config in [m.resolve_quantization_config() for m in modifiers]
                for g in config.config_groups.values()]
    mine = [(g.targets, g.ignore, g.scheme) for g in config_groups(yaml.safe_load(text) or {}, name)]
    assert mine == resolved


@pytest.mark.parametrize("name,down_proj_bits", [("two_schemes", 8), ("acts_only", None)])
def test_each_linear_gets_the_group_compressed_tensors_gives_it(tiny, name, down_proj_bits):
    """Checked against compressed-tensors itself on the tiny model."""
    import copy
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    data = yaml.safe_load(MADE[name])
    model = copy.deepcopy(tiny)
    args = data["quant_stage"]["quant_modifiers"]["QuantizationModifier"]
    apply_quantization_config(model, QuantizationConfig(config_groups=args["config_groups"], ignore=args["ignore"]),
                              show_progress=False)
    groups = config_groups(data, name)

    def bits(module: str) -> int | None:
        scheme = (group := group_of(module, groups)) and group.scheme
        return scheme.num_bits if scheme else None

    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            applied = getattr(module, "quantization_scheme", None)
            assert bits(module_name) == (applied.weights.num_bits if applied and applied.weights else None)
    assert (bits("model.layers.0.mlp.down_proj"), bits("model.layers.0.mlp.up_proj")) == (down_proj_bits, 4)
    assert bits("lm_head") is None


def w_bytes(rows: int, cols: int, weights: dict) -> float:
    """A bf16 weight quantized, computed here: its values, and per group a
    2-byte scale and, asymmetric, a zero point."""
    bits = weights["num_bits"]
    groups = rows * (cols // weights["group_size"]) if weights["strategy"] == "group" else rows
    return rows * cols * bits / 8 + groups * (2 + (0 if weights["symmetric"] else bits / 8))


def test_the_size_estimate_gives_each_module_its_own_groups_scheme(tmp_path, tiny_model):
    recipe = load(tmp_path, "two_schemes", TWO_SCHEMES)
    weights = ModelWeights.read(tiny_model)
    quantized = sum(w_bytes(*shape, W8 if m.endswith("down_proj") else W4)
                    for m, shape in linear_weights(tiny_model).items())
    linears = sum(2 * math.prod(shape) for shape in linear_weights(tiny_model).values())
    dense = sum(2 * math.prod(shape) for _, shape in weights.tensors.values())
    expected = dense - linears + quantized + weights.other_files_bytes
    assert expected_bytes(tiny_model, recipe.path, recipe.data) == pytest.approx(expected)
    # propose (a file of another scheme, given by path: a guide only): its base size, and a kept
    # down_proj adds its bf16 bytes over int8, not over int4
    given = write_sensitivity(tmp_path / "results", tiny_model, cells_with_kl(tiny_model, top_down_proj))
    proposal = run(config(tmp_path, tiny_model, recipe, tmp_path / "results", sensitivity=str(given)))
    rows, cols = linear_weights(tiny_model)["model.layers.1.mlp.down_proj"]
    assert proposal.uniform.bytes == pytest.approx(expected)
    kept = proposal.chosen.size_bytes - proposal.uniform.bytes
    assert kept == pytest.approx(2 * rows * cols - w_bytes(rows, cols, W8))


def test_a_recipe_whose_scheme_is_null_sizes_its_weights_dense(tmp_path, tiny_model):
    """A KV-cache-only recipe written with `scheme: null` (llm-compressor takes
    it): the size estimate, and so quantize's disk check, was an AttributeError."""
    recipe = load(tmp_path, "kv_only", KV_ONLY)
    weights = ModelWeights.read(tiny_model)
    dense = sum(2 * math.prod(shape) for _, shape in weights.tensors.values())
    assert expected_bytes(tiny_model, recipe.path, recipe.data) == pytest.approx(dense + weights.other_files_bytes)


def test_sensitivity_refuses_what_one_targets_and_ignore_list_cannot_say(tmp_path):
    with pytest.raises(UserError, match="2 different schemes"):
        schemes.from_recipe(load(tmp_path, "two_schemes", TWO_SCHEMES))
    three_groups = recipe_text({"attention": {"targets": [ATTENTION], "weights": W4},
                                "mlp": {"targets": [MLP], "weights": W4},
                                "down": {"targets": ["re:.*down_proj$"], "weights": W8}})
    with pytest.raises(UserError, match="2 different schemes"):   # schemes counted, not groups
        schemes.from_recipe(load(tmp_path, "three_groups", three_groups))
    two_modifiers = yaml.safe_dump({
        "attention_stage": {"modifiers": {"QuantizationModifier": {
            "ignore": ["lm_head", "model.layers.0.self_attn.q_proj"],
            "config_groups": {"group_0": {"targets": [ATTENTION], "weights": W4}}}}},
        "mlp_stage": {"modifiers": {"QuantizationModifier": {
            "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": [MLP], "weights": W4}}}}}})
    with pytest.raises(UserError, match="ignore lists"):
        schemes.from_recipe(load(tmp_path, "two_modifiers", two_modifiers))
    with pytest.raises(UserError, match="a config group that quantizes no weights"):
        schemes.from_recipe(load(tmp_path, "acts_only", ACTS_ONLY))


def test_no_file_names_the_key_a_file_of_the_recipes_modules_has(tmp_path, tiny_model):
    """A recipe that quantizes other modules than every Linear has a key with
    -m<hash>: the folder `python -m quantize.sensitivity` writes is named by it."""
    recipe = load(tmp_path, "two_groups", TWO_GROUPS)
    key = schemes.from_recipe(recipe).key
    assert key.startswith("w4a16-g64-asym-m")
    with pytest.raises(UserError, match=rf"and scheme {key} under .*measure it first: "
                                        rf"python -m quantize.sensitivity recipe={recipe.path} "):
        run(config(tmp_path, tiny_model, recipe, tmp_path / "empty"))


def test_a_recipe_sensitivity_cannot_measure_is_told_what_file_to_pass(tmp_path, tiny_model):
    """Two weight schemes: no file fits, and measuring the recipe itself is
    refused; the error names a command that measures a file to pass as a guide."""
    import re
    recipe = load(tmp_path, "two_schemes", TWO_SCHEMES)
    with pytest.raises(UserError) as refused:
        run(config(tmp_path, tiny_model, recipe, tmp_path / "empty"))
    message = str(refused.value)
    assert f"recipe={recipe.path}" not in message and "2 different schemes" in message
    assert "sensitivity=<path" in message
    suggested = re.search(r"python -m quantize\.sensitivity recipe=(\S+)", message).group(1)
    schemes.from_recipe(recipes.load(recipe_choices.find(suggested)))   # one sensitivity measures
    guide = write_sensitivity(tmp_path / "results", tiny_model, cells_with_kl(tiny_model, top_down_proj))
    with pytest.raises(UserError, match=rf"files of these weights: {guide}"):   # auto names it, to pass
        run(config(tmp_path, tiny_model, recipe, tmp_path / "results"))
    other = write_sensitivity(tmp_path / "results", tiny_model, cells_with_kl(tiny_model, top_down_proj),
                              weights_hash="0" * 64)
    with pytest.raises(UserError, match="measured on other weights") as refused:
        run(config(tmp_path, tiny_model, recipe, tmp_path / "results", sensitivity=str(other)))
    assert f"recipe={recipe.path}" not in str(refused.value)
