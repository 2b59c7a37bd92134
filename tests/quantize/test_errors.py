"""Bad inputs: non-zero exit, a short error whose last line names the fix, no
traceback, and nothing written to the artifacts dir."""
from pathlib import Path

import pytest

from tests.conftest import ROOT, SMALL_CALIB, last_line, run_quantize, shipped_recipes, w4_rtn_recipe


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def checkpoint_without_config(tmp: Path, tiny: Path) -> Path:
    """A directory with the model's weights and tokenizer but no config.json."""
    d = tmp / "no-config"
    d.mkdir()
    for p in tiny.iterdir():
        if p.name != "config.json":
            (d / p.name).write_bytes(p.read_bytes())
    return d


BROKEN_YAML = "quant_stage:\n  quant_modifiers: [oops\n"
LIST_YAML = "- QuantizationModifier\n"
TYPO_MODIFIER = w4_rtn_recipe(64).replace("QuantizationModifier", "QuantizationModifer")
EXTRA_ARGUMENT = w4_rtn_recipe(64).replace("ignore:", "ignored_layers:")


def with_recipe(filename: str, text: str):
    """Overrides for quantizing the tiny model with a recipe file written in tmp."""
    return lambda tmp, tiny: [f"recipe={write(tmp / filename, text)}", f"model={tiny}", *SMALL_CALIB]


CALIBRATED = "w8a8_smooth_ptq"  # a recipe that reads calibration text (w4a16_rtn reads none)


def with_calibration(make_path):
    return lambda tmp, tiny: [f"recipe={CALIBRATED}", f"model={tiny}", *SMALL_CALIB,
                              f"calibration={make_path(tmp)}"]


# name -> (overrides(tmp, tiny_model), words the last stderr line must contain)
CASES = {
    "model_dir_missing": (
        lambda tmp, tiny: ["recipe=original", f"model={tmp / 'no-such-model'}"],
        ["no-such-model", "model=<preset>", "model=<local checkpoint dir>"]),
    "model_dir_without_config": (
        lambda tmp, tiny: ["recipe=original", f"model={checkpoint_without_config(tmp, tiny)}"],
        ["no-config", "no config.json", "model=<local checkpoint dir>"]),
    "calibration_file_missing": (
        with_calibration(lambda tmp: tmp / "missing.txt"),
        ["missing.txt", "does not exist", "calibration=<path"]),
    "calibration_file_wrong_suffix": (
        with_calibration(lambda tmp: write(tmp / "austen.csv", "Emma Woodhouse")),
        ["austen.csv", "must end in .txt, .json or .jsonl"]),
    # the calibration is checked in a second, before llm-compressor's import validates the recipe
    "calibration_typo_reported_before_the_recipe_check": (
        lambda tmp, tiny: [*with_recipe("typo.yaml", TYPO_MODIFIER)(tmp, tiny), f"calibration={tmp / 'missing.txt'}"],
        ["missing.txt", "does not exist"]),
    "calibration_too_small": (
        with_calibration(lambda tmp: write(tmp / "small.txt", "Emma Woodhouse, handsome, clever, and rich.")),
        ["small.txt", "calibration.num_samples=8", "lower num_samples or max_seq_len"]),
    # the sanity check would score text the model was calibrated on, and pass a broken artifact
    "calibration_on_a_held_out_book": (
        lambda tmp, tiny: [f"recipe={CALIBRATED}", f"model={tiny}", *SMALL_CALIB,
                           "calibration.books=[emma,persuasion]"],
        ["calibration.books and sanity.books share persuasion", "calibrate on other books", "sanity.enabled=false"]),
    "group_size_does_not_divide": (
        with_recipe("w4_g48.yaml", w4_rtn_recipe(48)),
        ["group_size 48", "in_features 128", "use group_size", "strategy: channel"]),
    "unknown_modifier": (
        with_recipe("typo.yaml", TYPO_MODIFIER),
        ["llm-compressor rejected recipe", "QuantizationModifer"]),
    "bad_modifier_argument": (
        with_recipe("badarg.yaml", EXTRA_ARGUMENT),
        ["llm-compressor rejected recipe", "ignored_layers"]),
    "invalid_yaml": (
        with_recipe("broken.yaml", BROKEN_YAML),
        ["broken.yaml", "not valid YAML", "fix the file"]),
    "recipe_not_a_mapping": (
        with_recipe("list.yaml", LIST_YAML),
        ["list.yaml", "must be a YAML mapping"]),
    "recipe_file_missing": (
        lambda tmp, tiny: [f"recipe={tmp / 'nowhere.yaml'}", f"model={tiny}", *SMALL_CALIB],
        ["nowhere.yaml", "does not exist", "recipe=<name>"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_with_one_line(case, tmp_path, workdir, tiny_model):
    make_args, words = CASES[case]
    arts = tmp_path / "artifacts"
    proc = run_quantize(*make_args(tmp_path, tiny_model), f"artifacts_dir={arts}", cwd=workdir)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = last_line(proc.stderr)
    assert line.startswith("error: "), proc.stderr[-3000:]
    assert len(line) < 600
    assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [line]
    for word in words:
        assert word in line, f"{word!r} not in: {line}"
    assert not arts.exists(), f"wrote into the artifacts dir: {sorted(arts.rglob('*'))}"


@pytest.mark.parametrize("group, options", [
    ("recipe", shipped_recipes()),
    ("model", sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml") if p.stem != "local")),
])
def test_unknown_preset_is_one_line_listing_options(group, options, tmp_path, workdir, recipes_dir_lock):
    arts = tmp_path / "artifacts"
    args = [f"{group}=original,no_such_preset" if group == "recipe" else f"{group}=no_such_preset",
            f"artifacts_dir={arts}"]
    if group == "model":
        args.append("recipe=original")
    proc = run_quantize(*args, cwd=workdir)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: unknown {group} 'no_such_preset'; choose from ")
    listed = line.split("choose from ", 1)[1].split(" (or", 1)[0].split(", ")
    assert sorted(listed) == sorted(options)
    assert not arts.exists()
