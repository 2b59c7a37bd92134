"""The recipe search space: trial values -> a recipe named by its hash,
values that cannot apply normalised away, kept-dense modules taken from the
model's sensitivity file in sensitivity order."""
import re
from pathlib import Path

import pytest
import yaml

from evaluate.search import kept_dense
from evaluate.search.space import KeptDense, RecipeSpace, TrialValues
from quantize.common import fingerprint, sensitivity_file
from quantize.common.errors import UserError
from quantize.common.extensions import build
from quantize.common.paths import CONF_DIR

SMOLLM2_WIDTHS = {576, 1536}   # hidden, intermediate (attention output = 9 heads x 64 = 576)


@pytest.fixture
def space() -> RecipeSpace:
    return RecipeSpace(name="test", objectives=[{"name": "size_mb", "direction": "minimize", "unit": "MB"}])


def quant_modifiers(text: str) -> dict:
    return yaml.safe_load(text)["quant_stage"]["quant_modifiers"]


def test_equal_values_give_one_name_and_text_and_other_values_another(space):
    a = space.recipe(TrialValues(scheme="w4a16", group_size=64, dampening=0.01))
    assert a == space.recipe(TrialValues(scheme="w4a16", group_size=64, dampening=0.01))
    assert re.fullmatch(r"search-[0-9a-f]{8}", a[0])
    others = {space.recipe(TrialValues(scheme="w4a16", group_size=32))[0],
              space.recipe(TrialValues(scheme="w4a16", group_size=64, dampening=0.05))[0],
              space.recipe(TrialValues(scheme="w8a8"))[0],
              space.recipe(TrialValues(scheme="w4a16", sparse_2_4=True))[0]}
    assert a[0] not in others and len(others) == 4


def test_values_that_cannot_apply_are_normalised_to_one_recipe(space):
    # SmoothQuant only for activation-quantized schemes; group size only for group-quantized ones
    assert space.recipe(TrialValues(scheme="w4a16", smoothquant=0.8)) == space.recipe(TrialValues(scheme="w4a16"))
    assert space.recipe(TrialValues(scheme="w8a8", group_size=32)) == space.recipe(TrialValues(scheme="w8a8", group_size=128))
    w8a8 = quant_modifiers(space.recipe(TrialValues(scheme="w8a8", smoothquant=0.5))[1])
    assert w8a8["SmoothQuantModifier"] == {"smoothing_strength": 0.5}
    group = w8a8["GPTQModifier"]["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "channel" and group["input_activations"]["num_bits"] == 8
    assert "SmoothQuantModifier" not in quant_modifiers(space.recipe(TrialValues(scheme="w4a16", smoothquant=0.8))[1])


def test_a_group_size_that_does_not_divide_the_model_falls_to_one_that_does(space):
    """SmolLM2's 576 is not a multiple of 128: its recipe says 64 (quantize
    would refuse 128), and so it is the group-64 recipe."""
    name, text = space.recipe(TrialValues(scheme="w4a16", group_size=128), widths=SMOLLM2_WIDTHS)
    weights = quant_modifiers(text)["GPTQModifier"]["config_groups"]["group_0"]["weights"]
    assert weights["group_size"] == 64 and weights["num_bits"] == 4
    assert name == space.recipe(TrialValues(scheme="w4a16", group_size=64), widths=SMOLLM2_WIDTHS)[0]
    channel = space.recipe(TrialValues(scheme="w4a16", group_size=64), widths={100})[1]
    assert quant_modifiers(channel)["GPTQModifier"]["config_groups"]["group_0"]["weights"]["strategy"] == "channel"


def test_kept_dense_modules_join_every_ignore_list_and_the_header_names_their_source(space):
    kept = KeptDense(["model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj"], "sensitivity/m/x/sensitivity.json")
    name, text = space.recipe(TrialValues(scheme="w8a8", keep_dense=2, sparse_2_4=True, smoothquant=0.5), kept)
    recipe = yaml.safe_load(text)
    assert quant_modifiers(text)["GPTQModifier"]["ignore"] == ["lm_head", *kept.modules]
    for stage, modifiers, modifier in (("sparsity_stage", "sparsity_modifiers", "SparseGPTModifier"),
                                       ("mask_stage", "mask_modifiers", "WandaPruningModifier")):
        ignore = recipe[stage][modifiers][modifier]["ignore"]
        assert ignore[0] == "re:.*lm_head" and len(ignore) == 3
        # pruning names a module with a trailing dot: the patterns match both spellings, and nothing else
        assert re.match(ignore[1][3:], "model.layers.1.mlp.down_proj.")
        assert not re.match(ignore[1][3:], "model.layers.11.mlp.down_proj.")
    assert "keep_dense=2" in text.splitlines()[0] and kept.source in text.splitlines()[1]
    assert list(recipe) == ["sparsity_stage", "quant_stage", "mask_stage"]
    assert name != space.recipe(TrialValues(scheme="w8a8", keep_dense=0, sparse_2_4=True, smoothquant=0.5))[0]


def test_every_point_is_a_recipe_llm_compressor_accepts(space, tmp_path):
    from llmcompressor.recipe import Recipe
    kept = KeptDense(["model.layers.0.mlp.up_proj"], "sensitivity.json")
    for values in (TrialValues(scheme="w4a16", group_size=32, dampening=0.1),
                   TrialValues(scheme="w8a16", group_size=64, keep_dense=1),
                   TrialValues(scheme="w8a8", smoothquant=0.8, sparse_2_4=True, keep_dense=1)):
        name, text = space.recipe(values, kept)
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        Recipe.create_instance(str(path))   # raises on an unknown modifier or argument


def test_bad_trial_values_are_one_line(space):
    with pytest.raises(UserError, match="unknown scheme family 'w3a16'"):
        space.recipe(TrialValues(scheme="w3a16"))
    with pytest.raises(UserError, match="trial.bits is not a search value"):
        TrialValues.from_values({"bits": 4})
    assert TrialValues.from_values({"sparse_2_4": "False", "group_size": "32", "keep_dense": "2"}) == \
        TrialValues(sparse_2_4=False, group_size=32, keep_dense=2)
    # out of range as read, not only as a recipe is built: a group size of -1 divided every width
    for values in ({"group_size": -1}, {"group_size": 0}, {"dampening": -1}, {"keep_dense": -1},
                   {"smoothquant": 1.0}):
        with pytest.raises(UserError, match=r"trial values out of range \(.*\): keep_dense >= 0, dampening > 0, "
                                            r"0 <= smoothquant < 1, group_size >= 1 \(or none: per channel\)$"):
            TrialValues.from_values(values)
    assert TrialValues.from_values({"group_size": "channel"}).group_size is None
    # int(2.5) is 2 and int(True) 1: refused, not truncated
    for values, said in (({"group_size": 2.5}, "trial.group_size=2.5 is not an integer"),
                         ({"group_size": True}, "trial.group_size=true is not an integer"),
                         ({"dampening": True}, "trial.dampening=true is not a number"),
                         ({"dampening": "nan"}, "trial.dampening=nan is not a number"),     # passed the range check
                         ({"sparse_2_4": "maybe"}, "trial.sparse_2_4=maybe is not true or false")):
        with pytest.raises(UserError, match=f"^{re.escape(said)}; fix it on the command line or in the search"):
            TrialValues.from_values(values)


def test_the_shipped_spaces_build(tmp_path):
    for path in sorted((CONF_DIR / "search").glob("*.yaml")):
        values = yaml.safe_load(path.read_text())
        values["objectives"] = [{**o, "scenario": "x"} if "scenario" in o else o for o in values["objectives"]]
        space = build(values, RecipeSpace, str(path))
        assert space.name == path.stem and {o["name"] for o in space.objectives} >= {"size_mb"}
        assert all(key.startswith("trial.") for key in space.params)


@pytest.mark.parametrize("expression,top", [("range(0, 8)", 8), ("choice(0, 2, 5)", 5), ("int(interval(0, 3))", 3),
                                            ("0", 0)])
def test_the_largest_keep_dense_a_params_expression_gives(expression, top):
    assert kept_dense.upper_bound(expression) == top


def write_sensitivity(results_dir: Path, model: Path, kls: dict[tuple[int, str], float], scheme_key="w4a16-g64-asym",
                      weights_hash: str | None = None) -> Path:
    cells = [sensitivity_file.Cell(layer, group, [f"model.layers.{layer}.{group}"], kl, 1000)
             for (layer, group), kl in kls.items()]
    weights_hash = weights_hash or fingerprint.compute(sorted(model.glob("*.safetensors"))).sha256
    record = sensitivity_file.Sensitivity(model_name=model.name, model_path=str(model), weights_hash=weights_hash,
                                          recipe="w4a16_gptq", scheme_key=scheme_key, scheme={}, text={}, cells=cells)
    folder = sensitivity_file.folder_for(results_dir, model.name, scheme_key, weights_hash)
    return sensitivity_file.write(folder, record)


def test_kept_dense_takes_the_most_sensitive_groups_of_the_models_file(tiny_model, tmp_path, space):
    kls = {(0, "self_attn.q_proj"): 0.01, (1, "mlp.down_proj"): 0.9, (0, "mlp.up_proj"): 0.3, (1, "self_attn.o_proj"): 0.02,
           (0, "mlp.gate_proj"): 0.001}
    path = write_sensitivity(tmp_path, tiny_model, kls)
    kept = kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 2, "auto")
    # up_proj takes its fused sibling gate_proj along: vLLM loads the pair with one scheme
    assert kept.modules == ["model.layers.1.mlp.down_proj", "model.layers.0.mlp.up_proj",
                            "model.layers.0.mlp.gate_proj"]
    assert kept.source == str(path.relative_to(tmp_path))
    _, text = space.recipe(TrialValues(keep_dense=2), kept)
    assert quant_modifiers(text)["GPTQModifier"]["ignore"] == ["lm_head", *kept.modules]
    # a path names the file itself; k beyond its groups is one line
    assert kept_dense.kept(tmp_path, "other-name", str(tiny_model), "w4a16", 1, str(path)).modules == \
        ["model.layers.1.mlp.down_proj"]
    with pytest.raises(UserError, match="cannot keep 6 groups dense"):
        kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 6, "auto")


def test_a_file_of_other_weights_or_none_at_all_names_the_sensitivity_command(tiny_model, tmp_path):
    with pytest.raises(UserError, match=re.escape("python -m quantize.sensitivity recipe=w4a16_gptq")):
        kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 1, "auto")
    write_sensitivity(tmp_path, tiny_model, {(0, "mlp.up_proj"): 0.1}, weights_hash="0" * 64)
    with pytest.raises(UserError, match="none for these weights"):
        kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 1, "auto")
    assert kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 0, "auto").modules == []


def test_a_named_file_of_other_weights_or_modules_is_one_line_as_under_auto(tiny_model, tmp_path):
    """sensitivity=<path> was read as it was: a file measured on another
    model's weights ranked the searched model's layers."""
    other = write_sensitivity(tmp_path / "elsewhere", tiny_model, {(0, "mlp.up_proj"): 0.1}, weights_hash="0" * 64)
    with pytest.raises(UserError, match=rf"^sensitivity={re.escape(str(other))} was measured on other weights "
                                        r"\(tiny-llama, 000000000000\) than model tiny-llama .*sensitivity=auto"):
        kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 1, str(other))
    proposed = write_sensitivity(tmp_path / "elsewhere", tiny_model, {(0, "mlp.up_proj"): 0.1},
                                 "w8a8-channel-sym-m3fea1c")
    with pytest.raises(UserError, match="on other modules than a trial quantizes"):
        kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 1, str(proposed.parent))
    assert kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 0, str(other)).modules == []


def test_auto_prefers_the_file_of_the_trials_scheme_family(tiny_model, tmp_path):
    write_sensitivity(tmp_path, tiny_model, {(0, "mlp.up_proj"): 0.1, (1, "mlp.up_proj"): 0.2}, "w4a16-g64-asym")
    write_sensitivity(tmp_path, tiny_model, {(0, "mlp.up_proj"): 0.2, (1, "mlp.up_proj"): 0.1}, "w8a8-channel")
    assert kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w8a8", 1, "auto").modules == \
        ["model.layers.0.mlp.up_proj"]
    assert kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 1, "auto").modules == \
        ["model.layers.1.mlp.up_proj"]


def test_auto_passes_over_a_file_measured_on_other_modules(tiny_model, tmp_path):
    """A proposed recipe's sensitivity (another ignore list, -m<hash> in its
    key) lacks the cells it keeps dense: a trial never ranks by it."""
    write_sensitivity(tmp_path, tiny_model, {(0, "mlp.up_proj"): 0.1, (1, "mlp.up_proj"): 0.2}, "w4a16-g64-asym")
    write_sensitivity(tmp_path, tiny_model, {(0, "mlp.up_proj"): 0.2}, "w8a8-channel-sym-m3fea1c")
    assert kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w8a8", 1, "auto").modules == \
        ["model.layers.1.mlp.up_proj"]


def test_a_damaged_sensitivity_file_of_another_scheme_blocks_no_trial(tiny_model, tmp_path, capsys):
    """One mistyped file stopped the pre-sweep check and every trial, though
    a sound file of the trial's scheme was there (propose passed over it)."""
    write_sensitivity(tmp_path, tiny_model, {(0, "mlp.up_proj"): 0.1, (1, "mlp.up_proj"): 0.2}, "w4a16-g64-asym")
    damaged = write_sensitivity(tmp_path, tiny_model, {(0, "mlp.up_proj"): 0.3}, "w8a16-channel-sym")
    damaged.write_text(damaged.read_text().replace('"kl": 0.3', '"kl": "0.3"'))
    assert kept_dense.kept(tmp_path, tiny_model.name, str(tiny_model), "w4a16", 1, "auto").modules == \
        ["model.layers.1.mlp.up_proj"]
    err = capsys.readouterr().err
    assert "warning: skipped:" in err and "damaged sensitivity file" in err


def test_linear_widths_come_from_the_models_config(tiny_model, tmp_path):
    assert kept_dense.linear_widths(str(tiny_model)) == {128, 256}   # hidden 128 = 4 heads x 32, intermediate 256
    assert kept_dense.linear_widths(str(tmp_path)) == set()
