"""The proposer on a synthetic sensitivity file over the tiny model's real
modules: k for each target, the edges, and the recipe it writes."""
import dataclasses
import math

import pytest
import yaml

from quantize import recipe as recipes
from quantize.common import recipe_choices
from quantize.common.errors import UserError
from quantize.common.recipe_edit import WeightScheme
from quantize.common.paths import RECIPES_DIR
from quantize.config import ModelChoice
from quantize.propose.config import ProposeConfig, Target
from quantize.propose.run import run
from tests.conftest import TINY_NAME
from tests.quantize.propose.synthetic import W4_G64_ASYM, cells_with_kl, linear_weights, write_sensitivity

TOP = "model.layers.1.mlp.down_proj"      # planted: the most sensitive
SECOND = "model.layers.0.self_attn.q_proj"
SIBLINGS = ["model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"]   # fused with SECOND in vLLM
KL = {TOP: 0.40, SECOND: 0.20}            # the 12 other groups: 0.01 nats each; sum 0.72
W4 = WeightScheme(num_bits=4, strategy="group", group_size=64, symmetric=False)


def planted_kl(layer: int, group: str) -> float:
    return KL.get(f"model.layers.{layer}.{group}", 0.01)


@pytest.fixture
def store(tmp_path, tiny_model):
    """A results store holding the tiny model's synthetic sensitivity file."""
    results = tmp_path / "results"
    write_sensitivity(results, tiny_model, cells_with_kl(tiny_model, planted_kl))
    return results


def config(tmp_path, tiny_model, store, target: str, value, **changes) -> ProposeConfig:
    base = ProposeConfig(model=ModelChoice(TINY_NAME, str(tiny_model)),
                         recipe=recipe_choices.find("w4a16_gptq"), target=Target(target, value),
                         results_dir=str(store), artifacts_dir=str(tmp_path / "artifacts"),
                         recipes_dir=str(tmp_path / "recipes"))
    return dataclasses.replace(base, **changes)


def dense_minus_w4_bytes(tiny_model, module: str) -> float:
    """What keeping one bf16 module dense costs over int4 g64 asymmetric, computed here."""
    rows, cols = linear_weights(tiny_model)[module]
    return rows * cols * 2 - (rows * cols / 2 + rows * (cols // 64) * (2 + 0.5))


# k=2 keeps SECOND's fused siblings too: 0.72 - 0.40 - 0.20 - 2 x 0.01 = 0.10 left
@pytest.mark.parametrize("max_kl,k,kept", [(0.8, 0, []), (0.72, 0, []), (0.35, 1, [TOP]),
                                           (0.105, 2, [TOP, SECOND, *SIBLINGS]), (0.095, 3, None)])
def test_max_kl_keeps_the_fewest_groups_that_reach_it(tmp_path, tiny_model, store, max_kl, k, kept):
    proposal = run(config(tmp_path, tiny_model, store, "max_kl", max_kl))
    assert proposal.chosen.k == k
    assert proposal.chosen.kl_nats <= max_kl + 1e-12
    if kept is not None:
        assert proposal.modules == kept
    assert proposal.path == tmp_path / "recipes" / f"w4a16_gptq_keep{k}.yaml"


def test_interacting_groups_scale_each_groups_share(tmp_path, tiny_model):
    """Measured with every group quantized, the KL is more than the groups'
    sum (0.72): each kept group removes its KL x 0.9 / 0.72."""
    results = tmp_path / "results"
    write_sensitivity(results, tiny_model, cells_with_kl(tiny_model, planted_kl), baseline_kl=0.9)

    def chosen(max_kl):
        return run(config(tmp_path, tiny_model, results, "max_kl", max_kl, force=True)).chosen

    assert chosen(0.9).k == 0
    assert (chosen(0.40).k, chosen(0.40).kl_nats) == (1, pytest.approx(0.40))
    assert (chosen(0.125).k, chosen(0.125).kl_nats) == (2, pytest.approx(0.125))   # 1.25 x 0.10
    every = run(config(tmp_path, tiny_model, results, "max_kl", 0, force=True))
    # the last groups come along as fused siblings before their own turn
    assert (every.chosen.kl_nats, len(every.modules), every.chosen.k) == (0, 14, 12)


def test_max_size_keeps_the_most_groups_that_fit(tmp_path, tiny_model, store):
    def chosen(max_size_mb):   # each target writes its own header: force the rewrite
        return run(config(tmp_path, tiny_model, store, "max_size_mb", max_size_mb, force=True)).chosen

    uniform = run(config(tmp_path, tiny_model, store, "kept_dense", 0)).uniform.bytes
    top = dense_minus_w4_bytes(tiny_model, TOP)
    second = sum(dense_minus_w4_bytes(tiny_model, m) for m in (SECOND, *SIBLINGS))
    exactly_one = (uniform + top) / 1e6
    assert chosen(exactly_one).k == 1
    assert chosen(exactly_one - 1e-6).k == 0
    halfway = chosen((uniform + top + second / 2) / 1e6)
    assert halfway.k == 1 and halfway.size_bytes == pytest.approx(uniform + top)
    assert chosen(1e6).k == 14


def test_max_size_below_the_base_recipe_names_its_size(tmp_path, tiny_model, store):
    uniform_mb = run(config(tmp_path, tiny_model, store, "kept_dense", 0)).uniform.bytes / 1e6
    with pytest.raises(UserError, match=rf"max_size_mb=1 MB is out of reach.*{uniform_mb:.2f} MB \(k=0\)"):
        run(config(tmp_path, tiny_model, store, "max_size_mb", 1.0, name="too_small"))
    assert not (tmp_path / "recipes" / "too_small.yaml").exists()


def test_uniform_size_estimate_counts_every_linear_at_4_bits(tmp_path, tiny_model, store):
    from quantize.propose.size import ModelWeights
    weights = ModelWeights.read(tiny_model)
    linears = linear_weights(tiny_model)
    dense_total = sum(2 * math.prod(shape) for _, shape in weights.tensors.values())
    saved = sum(dense_minus_w4_bytes(tiny_model, m) for m in linears)
    uniform = run(config(tmp_path, tiny_model, store, "kept_dense", 0)).uniform
    assert uniform.bytes == pytest.approx(dense_total - saved + weights.other_files_bytes)
    assert "estimated from the model's parameter count" in uniform.source


@pytest.mark.parametrize("k", [-1, 15])
def test_kept_dense_out_of_range(tmp_path, tiny_model, store, k):
    with pytest.raises(UserError, match=r"kept_dense=.* choose kept_dense=0\.\.14"):
        run(config(tmp_path, tiny_model, store, "kept_dense", k))


@pytest.mark.parametrize("kind,example", [("max_size_mb", "max_size_mb=120"), ("max_kl", "max_kl=0.05"),
                                          ("kept_dense", "kept_dense=12")])
def test_a_target_that_is_not_a_number_names_a_value_of_its_own_kind(kind, example):
    with pytest.raises(UserError, match=rf"{kind}='abc' is not a number; e\.g\. {example}$"):
        Target.from_config({kind: "abc"})


def test_written_recipe_is_a_normal_recipe(tmp_path, tiny_model, store, capsys):
    proposal = run(config(tmp_path, tiny_model, store, "kept_dense", 2, name="mixed"))
    loaded = recipes.load(recipe_choices.RecipeChoice("mixed", str(proposal.path)))
    recipes.check_with_llmcompressor(loaded)
    assert loaded.modifiers == ["GPTQModifier"]
    ignore = loaded.data["quant_stage"]["quant_modifiers"]["GPTQModifier"]["ignore"]
    assert ignore == ["lm_head", TOP, SECOND, *SIBLINGS]
    header = [line for line in loaded.text.splitlines() if line.startswith("#")]
    said = "\n".join(header)
    assert "w4a16-g64-asym" in said and "sensitivity.json" in said and "kept_dense=2" in said
    assert "the 2 most sensitive of 14 module groups kept dense" in said and "4 modules" in said
    assert "Estimated KL: 0.1 nats" in said
    out = capsys.readouterr().out
    assert f"python -m quantize recipe={proposal.path} model={tiny_model}" in out
    assert f"python -m evaluate recipe={proposal.path} model={tiny_model}" in out


def test_a_different_recipe_of_that_name_is_kept_unless_forced(tmp_path, tiny_model, store):
    first = run(config(tmp_path, tiny_model, store, "kept_dense", 1, name="mine"))
    before = first.path.read_text()
    run(config(tmp_path, tiny_model, store, "kept_dense", 1, name="mine"))   # the same recipe again: fine
    with pytest.raises(UserError, match="exists with other contents.*force=true"):
        run(config(tmp_path, tiny_model, store, "kept_dense", 2, name="mine"))
    assert first.path.read_text() == before
    run(config(tmp_path, tiny_model, store, "kept_dense", 2, name="mine", force=True))
    assert SECOND in yaml.safe_load(first.path.read_text())["quant_stage"]["quant_modifiers"]["GPTQModifier"]["ignore"]


def test_a_sensitivity_file_of_other_weights_is_refused(tmp_path, tiny_model):
    results = tmp_path / "results"
    path = write_sensitivity(results, tiny_model, cells_with_kl(tiny_model, planted_kl), weights_hash="0" * 64)
    with pytest.raises(UserError, match="measured on other weights.*python -m quantize.sensitivity recipe=w4a16_gptq"):
        run(config(tmp_path, tiny_model, results, "kept_dense", 1, sensitivity=str(path)))
    with pytest.raises(UserError, match="no sensitivity file for model tiny-llama"):
        run(config(tmp_path, tiny_model, results, "kept_dense", 1))


def test_auto_skips_a_file_of_another_scheme(tmp_path, tiny_model):
    results = tmp_path / "results"
    w8 = {"weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "group_size": None}}
    write_sensitivity(results, tiny_model, cells_with_kl(tiny_model, planted_kl), scheme=w8,
                      scheme_key="w8a16-channel-sym")
    with pytest.raises(UserError, match=r"scheme w4a16-g64-asym .*only for other schemes: w8a16-channel-sym"):
        run(config(tmp_path, tiny_model, results, "kept_dense", 1))


def test_auto_skips_a_newer_file_measured_on_other_modules(tmp_path, tiny_model):
    """A proposed recipe's own sensitivity (same weight scheme, a longer ignore
    list) has other cells and baseline: the base recipe keeps its own file."""
    results = tmp_path / "results"
    own = write_sensitivity(results, tiny_model, cells_with_kl(tiny_model, planted_kl), baseline_kl=0.9)
    mixed = W4_G64_ASYM | {"targets": ["Linear"], "ignore": ["lm_head", TOP]}
    write_sensitivity(results, tiny_model, [c for c in cells_with_kl(tiny_model, planted_kl) if TOP not in c.modules],
                      baseline_kl=0.3, scheme=mixed, scheme_key="w4a16-g64-asym-m3fea1c",
                      created="2026-12-01T00:00:00Z")
    proposal = run(config(tmp_path, tiny_model, results, "kept_dense", 0))
    assert proposal.sensitivity_path == own
    assert proposal.chosen.kl_nats == pytest.approx(0.9)


def test_the_size_estimate_counts_only_the_files_an_artifact_carries(tmp_path, tiny_model):
    """A training leftover (optimizer.pt) or a second copy of the weights
    (pytorch_model.bin) in the model's folder never reaches the artifact."""
    import shutil
    from quantize.propose.size import ModelWeights
    copy = tmp_path / "with-leftovers"
    shutil.copytree(tiny_model, copy)
    (copy / "optimizer.pt").write_bytes(b"\0" * 3_000_000)
    (copy / "pytorch_model.bin").write_bytes(b"\0" * 2_000_000)
    assert ModelWeights.read(copy).other_files_bytes == ModelWeights.read(tiny_model).other_files_bytes
    assert ModelWeights.read(tiny_model).other_files_bytes >= (tiny_model / "config.json").stat().st_size


@pytest.mark.parametrize("same_weights", [True, False])
def test_the_measured_base_size_is_taken_only_from_an_artifact_of_these_weights(tmp_path, tiny_model, store,
                                                                              same_weights):
    """The artifact folder is named by the model's name, which another
    checkpoint may share: its bytes_on_disk are no size of this model's."""
    from quantize.common import atomic
    from quantize.common.checkpoint import weight_files
    from quantize.common.provenance import sha256_bytes, sha256_files
    recipe = recipes.load(recipe_choices.find("w4a16_gptq"))
    weights = sha256_files(weight_files(tiny_model)) if same_weights else "0" * 64
    atomic.write_json(tmp_path / "artifacts" / TINY_NAME / "w4a16_gptq" / "manifest.json", {
        "artifact_id": "a" * 16, "model": {"name": TINY_NAME, "weights_sha256": weights},
        "recipe": {"name": "w4a16_gptq", "sha256": sha256_bytes(recipe.text.encode())}, "quantization": {},
        "bytes_on_disk": {"total": 123_456_789}})
    uniform = run(config(tmp_path, tiny_model, store, "kept_dense", 0)).uniform
    assert (uniform.bytes == 123_456_789) is same_weights
    assert ("measured" if same_weights else "built from other weights") in uniform.source


def test_the_size_estimate_quantizes_only_what_the_recipes_targets_match(tmp_path, tiny_model):
    """A recipe that targets the MLP alone leaves attention at 16 bits."""
    from quantize.propose.size import ModelWeights, expected_bytes
    text = yaml.safe_dump({"quant_stage": {"quant_modifiers": {"QuantizationModifier": {
        "ignore": ["lm_head"], "config_groups": {"group_0": {
            "targets": ["re:.*mlp\\..*_proj$"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64}}}}}}})
    recipe = tmp_path / "mlp_only.yaml"
    recipe.write_text(text)
    weights = ModelWeights.read(tiny_model)
    dense_total = sum(2 * math.prod(shape) for _, shape in weights.tensors.values())
    saved = sum(dense_minus_w4_bytes(tiny_model, m) for m in linear_weights(tiny_model) if ".mlp." in m)
    assert expected_bytes(tiny_model, recipe, yaml.safe_load(text)) == pytest.approx(
        dense_total - saved + weights.other_files_bytes)


def test_a_custom_model_name_is_in_every_command_it_suggests(tmp_path, tiny_model, store, capsys):
    """Files go under the model's name: a command without model.name= would
    write where this proposal never looks."""
    custom = ModelChoice("my-tiny", str(tiny_model))
    with pytest.raises(UserError, match=rf"measure it first: python -m quantize.sensitivity recipe=w4a16_gptq "
                                        rf"model={tiny_model} model.name=my-tiny"):
        run(config(tmp_path, tiny_model, tmp_path / "empty", "kept_dense", 1, model=custom))
    write_sensitivity(store, tiny_model, cells_with_kl(tiny_model, planted_kl), model_name="my-tiny")
    run(config(tmp_path, tiny_model, store, "kept_dense", 1, model=custom))
    out = capsys.readouterr().out
    assert f"python -m quantize recipe={tmp_path / 'recipes' / 'w4a16_gptq_keep1.yaml'} model={tiny_model} " \
           "model.name=my-tiny" in out


def test_a_base_recipe_given_as_a_file_is_named_by_its_path_in_the_sensitivity_command(tmp_path, tiny_model):
    """recipe=<stem> of a file outside recipes/ selects nothing."""
    mine = tmp_path / "elsewhere" / "my_w4.yaml"
    mine.parent.mkdir()
    mine.write_text((RECIPES_DIR / "w4a16_gptq.yaml").read_text())
    with pytest.raises(UserError, match=rf"python -m quantize.sensitivity recipe={mine} model="):
        run(config(tmp_path, tiny_model, tmp_path / "empty", "kept_dense", 1,
                   recipe=recipe_choices.RecipeChoice("my_w4", str(mine))))
    with pytest.raises(UserError, match=r"python -m quantize.sensitivity recipe=w4a16_gptq model="):
        run(config(tmp_path, tiny_model, tmp_path / "empty", "kept_dense", 1))


@pytest.mark.parametrize("field,value", [("kl", "0.4"), ("layer", "1"), ("modules", "model.layers.0.mlp.up_proj")])
def test_a_sensitivity_file_with_a_field_of_the_wrong_type_is_one_line(tmp_path, tiny_model, store, field, value):
    import json
    path = next((store / "sensitivity").glob("*/*/sensitivity.json"))
    record = json.loads(path.read_text())
    record["cells"][0][field] = value
    path.write_text(json.dumps(record))
    with pytest.raises(UserError, match=rf"is a damaged sensitivity file \(cells\[0\]\.{field} is"):
        run(config(tmp_path, tiny_model, store, "kept_dense", 1, sensitivity=str(path)))
    with pytest.raises(UserError, match="no sensitivity file for model"):   # auto passes it over, named
        run(config(tmp_path, tiny_model, store, "kept_dense", 1))
