"""Every shipped recipe quantizes the tiny model into a complete artifact whose
files and manifest are checked against what the test measures itself."""
import os
import platform
import re
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from tests.conftest import (MAX_SEQ_LEN, NUM_SAMPLES, TINY_NAME, file_sha256, recipe_source,
                      sha256_files_by_hand, shipped_recipes, sparse_recipes, w4_rtn_recipe)
from tests.quantize.test_data_free import DATA_FREE

RECIPES = shipped_recipes()
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def planned_weights(recipe: str) -> list[tuple[dict, bool]]:
    """(weight arguments, whether activations are quantized too) of each
    scheme the recipe's file plans, as llm-compressor resolves it: recipe
    names are free, so what a recipe must save as is read from the recipe."""
    from quantize.common.checkpoint import planned_quantization_config
    planned = planned_quantization_config(recipe_source(recipe)) or {}
    return [(group.get("weights") or {}, bool(group.get("input_activations")))
            for group in (planned.get("config_groups") or {}).values()]


def expected_format(recipe: str) -> str:
    """compressed-tensors format the recipe's schemes must save as."""
    schemes = planned_weights(recipe)
    if not schemes:
        return "dense"
    weights, with_activations = schemes[0]
    if weights.get("type") == "float":
        return "float-quantized"
    if with_activations:
        return "int-quantized"          # int8 weights and activations
    return "pack-quantized"             # weight-only ints packed into int32


def weight_bits(recipe: str) -> int | None:
    bits = {weights.get("num_bits") for weights, _ in planned_weights(recipe)}
    return bits.pop() if len(bits) == 1 else None


def linear_names(model) -> list[str]:
    import torch
    return [n for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")]


def load_checkpoint(path: Path):
    """Load like a user would: transformers, compressed-tensors decompressed to dense."""
    import json

    from transformers import AutoModelForCausalLM, CompressedTensorsConfig
    kwargs = {}
    if "quantization_config" in json.loads((path / "config.json").read_text()):
        kwargs["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    return AutoModelForCausalLM.from_pretrained(path, dtype="auto", **kwargs).eval()


_loaded: dict[Path, object] = {}


def loaded(path: Path):
    """Each checkpoint is loaded once per module (several tests read it)."""
    if path not in _loaded:
        _loaded[path] = load_checkpoint(path)
    return _loaded[path]


@pytest.fixture(scope="module")
def prompt_ids(tokenizer_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return tok("It is a truth universally acknowledged, that a single man", return_tensors="pt")["input_ids"]


def test_recipes_are_discovered():
    assert "original" in RECIPES and "file" not in RECIPES
    assert sparse_recipes(), "no sparse recipe found"
    for r in RECIPES:
        assert recipe_source(r).is_file(), f"recipe={r} points at a missing recipe file"


def quantizers(recipe: str) -> list:
    """The recipe's modifiers that attach a quantization scheme, as llm-compressor builds them."""
    from llmcompressor.modifiers.quantization.quantization.mixin import QuantizationMixin
    from llmcompressor.recipe import Recipe
    modifiers = Recipe.create_instance(str(recipe_source(recipe))).modifiers
    return [m for m in modifiers if isinstance(m, QuantizationMixin) and (m.scheme or m.config_groups)]


@pytest.mark.parametrize("recipe", [r for r in RECIPES if r != "original"])
def test_recipe_fits_the_default_model(tokenizer_dir, recipe):
    """llm-compressor's own scheme set-up accepts each shipped recipe on the
    default model's real shapes. The tiny model's sizes are multiples of 128, so
    a group size that does not divide SmolLM2's hidden size 576 shows only here."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    found = quantizers(recipe)
    assert found, f"{recipe} has no quantization modifier"
    for modifier in found:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tokenizer_dir))
        modifier.initialize_quantization(model)  # raises on an indivisible group
        assert any(hasattr(m, "quantization_scheme") for m in model.modules())


@pytest.mark.parametrize("recipe", RECIPES)
def test_artifact_files(build_artifact, recipe):
    art = build_artifact(recipe)
    assert art.dir == art.dir.parent.parent / TINY_NAME / recipe
    assert (art.dir / "config.json").is_file()
    weights = sorted(art.dir.glob("*.safetensors"))
    assert weights and all(p.stat().st_size > 0 for p in weights)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (art.dir / name).is_file(), f"{name} missing"
    # recipe.yaml is exactly the source recipe, and safe-loadable.
    source = recipe_source(recipe)
    text = (art.dir / "recipe.yaml").read_text()
    assert text == source.read_text()
    assert yaml.safe_load(text) == yaml.safe_load(source.read_text())
    # Shareable: another user (or an evaluate container) can read every file.
    modes = {p.name: p.stat().st_mode & 0o777 for p in art.dir.rglob("*")}
    assert (art.dir.stat().st_mode & 0o755) == 0o755
    assert all(m & 0o444 == 0o444 for m in modes.values()), {k: oct(m) for k, m in modes.items()}
    # Staging dirs are gone once the artifact is in place.
    assert not [p.name for p in art.dir.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


@pytest.mark.parametrize("recipe", RECIPES)
def test_manifest_provenance(build_artifact, tiny_model, recipe):
    art = build_artifact(recipe)
    m = art.manifest
    assert re.fullmatch(r"[0-9a-f]{16}", m["artifact_id"])

    assert m["model"]["name"] == TINY_NAME
    assert m["model"]["weights_sha256"] == sha256_files_by_hand(tiny_model.glob("*.safetensors"))

    source = recipe_source(recipe)
    assert m["recipe"]["name"] == recipe
    assert m["recipe"]["sha256"] == file_sha256(source)

    if recipe in ("original", *DATA_FREE):
        # the baseline is saved as is; a data-free recipe's modifiers read no text
        assert m["calibration"] is None and m["seed"] is None
    else:
        cal = m["calibration"]
        assert cal["source"] == "austen" and cal["name"] == "austen"
        assert (cal["num_samples"], cal["max_seq_len"]) == (NUM_SAMPLES, MAX_SEQ_LEN)
        assert cal["num_tokens"] == NUM_SAMPLES * MAX_SEQ_LEN
        assert HEX64.match(cal["sha256"])

    for pkg in ("torch", "transformers", "llmcompressor", "compressed-tensors"):
        assert m["versions"][pkg] == metadata.version(pkg), pkg
    assert m["hardware"]["cpu_count"] == os.cpu_count()
    assert m["hardware"]["machine"] == platform.machine()

    timings = m["timings_s"]
    phases = {k: v for k, v in timings.items() if k != "total"}
    assert phases and all(isinstance(v, (int, float)) and v >= 0 for v in timings.values())
    assert timings["total"] == pytest.approx(sum(phases.values()), abs=0.01)
    assert timings["total"] > 0
    if recipe != "original":
        assert any("oneshot" in k for k in phases), phases

    # Sizes: the manifest describes every file of the artifact but itself
    # (it is written last, after the sizes are known).
    files = [p for p in art.dir.rglob("*") if p.is_file()]
    assert m["bytes_on_disk"]["total"] == sum(p.stat().st_size for p in files if p.name != "manifest.json")
    assert m["bytes_on_disk"]["weights"] == sum(p.stat().st_size for p in art.dir.glob("*.safetensors"))

    assert m["quantization"]["format"] == expected_format(recipe)
    checks = m["checks"]
    assert checks["verified_by"] == "tensors"
    assert checks["layout_matches_model"] is True and checks["values_finite"] is True
    # Every saved tensor was compared with the layout; the floating-point ones were read.
    saved = saved_dtypes(art.dir)
    assert checks["tensors_checked"] == len(saved)
    assert checks["tensors_read"] == sum(d.is_floating_point for d in saved.values()) > 0


@pytest.mark.parametrize("recipe", RECIPES)
def test_saved_tensors_match_format(build_artifact, recipe):
    """Read the safetensors directly: the dtypes must be what the format claims."""
    import json

    import torch
    from safetensors import safe_open

    art = build_artifact(recipe)
    fmt = expected_format(recipe)
    config = json.loads((art.dir / "config.json").read_text())
    assert (config.get("quantization_config") or {}).get("format", "dense") == fmt
    tensors = {}
    for path in art.dir.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    proj = sorted({k.rsplit(".", 1)[0] for k in tensors if re.search(r"layers\.\d+\.\w+\.\w+_proj\.", k)})
    assert len(proj) == 2 * 7, proj  # 2 layers x (q, k, v, o, gate, up, down)
    # Saved in the checkpoint's dtype even where calibration ran in float32.
    assert tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    for layer in proj:
        if fmt == "dense":
            assert tensors[f"{layer}.weight"].dtype == torch.bfloat16
            assert f"{layer}.weight_scale" not in tensors
        elif fmt == "int-quantized":
            assert tensors[f"{layer}.weight"].dtype == torch.int8
            assert tensors[f"{layer}.weight_scale"].dtype == torch.bfloat16
        elif fmt == "float-quantized":
            assert tensors[f"{layer}.weight"].dtype == torch.float8_e4m3fn
            assert f"{layer}.weight_scale" in tensors
        else:  # pack-quantized: `bits`-wide ints packed 32 / bits per int32
            packed = tensors[f"{layer}.weight_packed"]
            out_features, in_features = tensors[f"{layer}.weight_shape"].tolist()
            assert packed.dtype == torch.int32
            assert tensors[f"{layer}.weight_scale"].dtype == torch.bfloat16
            assert tuple(packed.shape) == (out_features, in_features * weight_bits(recipe) // 32)
            assert f"{layer}.weight" not in tensors


@pytest.mark.parametrize("recipe", RECIPES)
def test_reloads_in_transformers(build_artifact, tiny_model, prompt_ids, recipe):
    import torch
    art = build_artifact(recipe)
    model = loaded(art.dir)
    base = loaded(tiny_model)
    with torch.no_grad():
        logits = model(input_ids=prompt_ids).logits
        base_logits = base(input_ids=prompt_ids).logits
    assert logits.shape == base_logits.shape
    assert torch.isfinite(logits).all()

    base_modules, modules = dict(base.named_modules()), dict(model.named_modules())
    names = linear_names(base)
    assert names == linear_names(model)
    if recipe == "original":
        for n in names:
            assert torch.equal(modules[n].weight, base_modules[n].weight), n
        assert torch.equal(logits, base_logits)
        return
    # A quantizing recipe must change every targeted Linear (a recipe that
    # silently matches nothing would leave them bit-identical).
    unchanged = [n for n in names if torch.equal(modules[n].weight, base_modules[n].weight)]
    assert not unchanged, f"weights untouched by {recipe}: {unchanged}"
    if weight_bits(recipe) == 4:
        # int4 with group size g: every g consecutive input weights hold at most 16 values.
        g = weight_group_size(art.dir)
        for n in names:
            w = modules[n].weight.float()
            s = w.reshape(w.shape[0], -1, g).sort(dim=-1).values
            distinct = int(((s[..., 1:] != s[..., :-1]).sum(-1) + 1).max())
            assert distinct <= 16, f"{n}: a group of {g} holds {distinct} distinct values"


def weight_group_size(artifact_dir: Path) -> int:
    import json
    q = json.loads((artifact_dir / "config.json").read_text())["quantization_config"]
    sizes = {g["weights"]["group_size"] for g in q["config_groups"].values()}
    assert len(sizes) == 1, sizes
    return sizes.pop()


@pytest.mark.parametrize("recipe", sparse_recipes())
def test_sparse_recipes_save_2_4_weights(build_artifact, recipe):
    """The manifest's 2:4 claim, and an independent check on the saved weights."""
    art = build_artifact(recipe)
    report = art.manifest["checks"]["sparsity"]
    assert report["all_layers_hold_pattern"] is True
    assert report["measured_sparsity"] == pytest.approx(0.5, abs=0.02)
    assert report["layers_breaking_pattern"] == []

    model = loaded(art.dir)
    zeros = total = 0
    names = linear_names(model)
    modules = dict(model.named_modules())
    assert len(names) == 14 and report["pruned_layers"] == len(names)
    for n in names:
        w = modules[n].weight.detach()
        assert w.shape[1] % 4 == 0
        zeros_per_group = (w == 0).reshape(w.shape[0], -1, 4).sum(-1)
        bad = int((zeros_per_group < 2).sum())
        assert bad == 0, f"{n}: {bad} groups of 4 hold fewer than 2 zeros"
        zeros += int((w == 0).sum())
        total += w.numel()
    assert zeros / total == pytest.approx(report["measured_sparsity"], abs=1e-6)
    # the output layer (and the embeddings tied to it) stays dense
    assert (model.get_output_embeddings().weight == 0).float().mean() < 0.01


def test_non_sparse_recipes_are_not_pruned(build_artifact):
    """Sanity on the checker: dense recipes do not claim (or show) a 2:4 pattern."""
    for recipe in ("original", "w8a8_smooth_ptq"):
        if recipe not in RECIPES:
            continue
        art = build_artifact(recipe)
        assert "sparsity" not in art.manifest["checks"]
        model = loaded(art.dir)
        modules = dict(model.named_modules())
        w = modules[linear_names(model)[0]].weight
        assert float((w == 0).float().mean()) < 0.25


def test_same_calibration_same_hash_across_recipes(build_artifact):
    """All recipes calibrated on the same text record the same calibration hash
    and distinct artifact ids."""
    manifests = [build_artifact(r).manifest for r in RECIPES]
    calib = {m["calibration"]["sha256"] for m in manifests if m["calibration"]}
    assert len(calib) == 1
    ids = [m["artifact_id"] for m in manifests]
    assert len(set(ids)) == len(ids)


def saved_dtypes(artifact_dir: Path) -> dict:
    from safetensors import safe_open
    out = {}
    for path in artifact_dir.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            out |= {k: f.get_tensor(k).dtype for k in f.keys()}
    return out


def copy_artifact(art, dest: Path) -> Path:
    import shutil
    shutil.copytree(art.dir, dest)
    return dest


def rewrite_tensors(artifact_dir: Path, change) -> None:
    """Load the artifact's tensors, let `change(tensors)` edit the dict, save them back."""
    from safetensors.torch import load_file, save_file
    path = artifact_dir / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


QUANTIZED = [r for r in ("w8a8_smooth_ptq", "w4a16_rtn") if r in RECIPES]
LAYER = "model.layers.1.mlp.down_proj"


@pytest.mark.parametrize("recipe", QUANTIZED)
def test_tensor_check_catches_broken_checkpoints(build_artifact, tmp_path, recipe):
    """verify=tensors fails, naming the tensor, on each way a saved checkpoint
    can be broken, and passes the untouched copy."""
    import torch

    from quantize import verify
    art = build_artifact(recipe)
    saved_checks = {k: v for k, v in art.manifest["checks"].items() if k != "sanity"}  # quantize's, not verify's
    assert verify.check(copy_artifact(art, tmp_path / "ok"), "tensors", prunes=False) == saved_checks

    scale = f"{LAYER}.weight_scale"
    norm = "model.norm.weight"
    breakages = {
        "missing scale": (lambda t: t.pop(scale), [f"missing tensor {scale}"]),
        "missing norm": (lambda t: t.pop(norm), [f"missing tensor {norm}"]),
        "orphan": (lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(4)}),
                   ["unexpected tensor model.layers.0.extra.weight"]),
        "shape": (lambda t: t.update({norm: t[norm][:-1].clone()}),
                  [f"{norm} is bfloat16 (127,), the model needs bfloat16 (128,)"]),
        "dtype": (lambda t: t.update({norm: t[norm].float()}),
                  [f"{norm} is float32 (128,), the model needs bfloat16 (128,)"]),
        "nan scale": (lambda t: t[scale].view(-1)[0].fill_(float("nan")), [f"{scale} holds non-finite values"]),
        "zero scale": (lambda t: t[scale].view(-1)[0].fill_(0), [f"{scale} holds a scale <= 0"]),
        "inf weight": (lambda t: t["model.embed_tokens.weight"][0].fill_(float("inf")),
                       ["model.embed_tokens.weight holds non-finite values"]),
    }
    for name, (change, says) in breakages.items():
        broken = copy_artifact(art, tmp_path / name.replace(" ", "_"))
        rewrite_tensors(broken, change)
        with pytest.raises(RuntimeError) as err:
            verify.check(broken, "tensors", prunes=False)
        assert all(s in str(err.value) for s in says), (name, str(err.value))


@pytest.mark.parametrize("recipe", sparse_recipes())
def test_tensor_check_sees_a_broken_2_4_group(build_artifact, tmp_path, recipe):
    """The 2:4 check reads the saved (quantized) weights: one group of 4 made
    dense in one layer breaks the pattern for that layer only."""
    import torch

    from quantize import verify
    art = build_artifact(recipe)
    key = next(k for k in (f"{LAYER}.weight", f"{LAYER}.weight_packed") if k in verify.read_headers(art.dir))
    broken = copy_artifact(art, tmp_path / "broken")

    def fill_first_group(tensors):
        w = tensors[key]
        w[0, : (4 if w.dtype != torch.int32 else 1)] = 1  # int32: one word packs >= 4 weights

    rewrite_tensors(broken, fill_first_group)
    report = verify.check(broken, "tensors", prunes=True)["sparsity"]
    assert report["all_layers_hold_pattern"] is False
    assert report["layers_breaking_pattern"] == [LAYER]
    assert report["pruned_layers"] == art.manifest["checks"]["sparsity"]["pruned_layers"]


@pytest.mark.parametrize("recipe", [r for r in ("w4a16_rtn", *sparse_recipes()[:1]) if r in RECIPES])
def test_reload_check_agrees_with_the_tensor_check(build_artifact, recipe):
    """verify=reload (transformers, whole model, forward pass) reaches the same
    verdict and the same 2:4 numbers as the default tensor check."""
    from quantize import verify
    art = build_artifact(recipe)
    prunes = recipe in sparse_recipes()
    reload = verify.check(art.dir, "reload", prunes)
    assert reload["verified_by"] == "reload"
    assert reload["reloads_in_transformers"] is True and reload["logits_finite"] is True
    assert reload.get("sparsity") == art.manifest["checks"].get("sparsity")


def test_verify_setting_is_checked_before_any_work():
    from quantize import verify
    from quantize.common.errors import UserError
    assert [verify.mode(v) for v in (True, "tensors", "reload", False, None)] == [
        "tensors", "tensors", "reload", None, None]
    with pytest.raises(UserError, match="verify=full: pass verify=tensors"):
        verify.mode("full")


def test_what_llm_compressor_applies_and_checks_is_the_text_read_once(tmp_path, monkeypatch):
    """The manifest's recipe, its sha256 and the artifact id are the text read
    at the start; oneshot and the checks re-read the file, so an edit during a
    sweep was applied while the old text was recorded."""
    import llmcompressor
    from quantize import pipeline, recipe as recipes
    from quantize.common.recipe_choices import RecipeChoice
    path = tmp_path / "mine.yaml"
    path.write_text(w4_rtn_recipe(64))
    loaded = recipes.load(RecipeChoice(name="mine", path=str(path)))
    path.write_text(w4_rtn_recipe(32))                     # edited after it was read
    recipes.check_with_llmcompressor(loaded)               # parses the text read, not the file
    applied = {}
    monkeypatch.setattr(llmcompressor, "oneshot", lambda **kw: applied.update(kw))
    calib = type("Calib", (), {"to_dataset": lambda self: None, "samples": [[1, 2, 3]]})()
    pipeline._oneshot(model=None, tokenizer=None, recipe=loaded, calib=calib, seed=0)
    assert applied["recipe"] == loaded.text == w4_rtn_recipe(64)
