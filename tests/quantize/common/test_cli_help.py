"""Every entry point answers --help with exit 0, even without its required
keys: its purpose in one line, its own groups (with their options) and keys
(with their defaults and descriptions), two examples, and no other stage's groups."""
import subprocess
import sys

import pytest
import yaml

from quantize.common.cli_help import group_settings, help_text, key_settings
from quantize.common.paths import CONF_DIR
from tests.conftest import quantize_env

EVALUATE_GROUPS = {"model", "scenario", "engine", "accuracy", "lm_eval", "recipe", "load", "slo", "hardware",
                   "tracking"}
# module -> (its config, its groups, an override it takes)
ENTRIES = {
    "quantize": ("quantize", {"model", "recipe", "calibration", "sanity", "tracking"}, "recipe=w4a16_rtn"),
    "evaluate": ("evaluate", EVALUATE_GROUPS, "engine=hf"),
    "evaluate.report": ("report", {"sanity", "tracking"}, "out_dir=elsewhere"),
    "evaluate.track": ("track", {"tracking"}, "results_dir=elsewhere"),
    "evaluate.capabilities": ("capabilities", EVALUATE_GROUPS, "machine=avx2"),
    "evaluate.search": ("search", {"model", "search", "engine", "scenario", "accuracy"}, "search=tiny"),
    "quantize.sensitivity": ("sensitivity", {"model", "recipe"}, "recipe=w4a16_rtn"),
    "quantize.propose": ("propose", {"model", "recipe"}, "recipe=w4a16_rtn"),
}
ALL_GROUPS = {p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra"} | {"report/layout",
                                                                                         "report/output"}


def section(text: str, title: str) -> list[str]:
    """The lines under `title` up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title)) + 1
    return lines[start:lines.index("", start)]


def keys_of(config: str, values: dict | None = None, prefix: str = "") -> list[str]:
    values = yaml.safe_load((CONF_DIR / f"{config}.yaml").read_text()) if values is None else values
    keys = []
    for key, value in values.items():
        if prefix or key not in ("defaults", "hydra"):
            keys += keys_of(config, value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]
    return keys


@pytest.mark.parametrize("with_override", [False, True], ids=["alone", "with-override"])
@pytest.mark.parametrize("module", list(ENTRIES))
def test_help_exits_0_with_its_own_purpose_groups_keys_and_two_examples(module, with_override, tmp_path):
    config, groups, override = ENTRIES[module]
    args = [override, "--help"] if with_override else ["--help"]
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, env=quantize_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    purpose = text.splitlines()[0]
    assert purpose.startswith(f"python -m {module}: ") and len(purpose) > len(module) + 30
    shown_groups = {line.split()[0].partition("=")[0] for line in section(text, "groups")
                    if not line.startswith(" " * 4)}
    assert shown_groups == groups
    assert not [g for g in ALL_GROUPS - groups if f"\n  {g}=" in text or f"\n  {g} (required)" in text]
    assert "powered by Hydra" not in text and "report/layout" not in text
    for key in keys_of(config):
        assert f"\n  {key}=" in text, f"{key} missing from {module} --help"
    examples = section(text, "examples:")
    assert len(examples) == 2 and all(e.startswith(f"  python -m {module} ") for e in examples)
    assert list(tmp_path.iterdir()) == []   # no .hydra/, outputs/ or log


@pytest.mark.parametrize("config", sorted({config for config, _, _ in ENTRIES.values()}))
def test_every_group_and_key_has_a_one_line_description(config):
    """The help's descriptions are the comments on the config file's lines: none may be missing."""
    undescribed = [s.name for s in group_settings(config, [CONF_DIR]) + key_settings(config, [CONF_DIR])
                   if not s.about]
    assert not undescribed, f"conf/{config}.yaml: add a comment on the line of {undescribed}"


def test_a_required_group_leads_the_usage_and_options_list_what_the_group_offers():
    text = help_text("quantize", [CONF_DIR])
    assert "usage: python -m quantize recipe=<recipe> [group=option ...] [key=value ...]" in text
    recipe = "\n".join(section(text, "groups")).split("\n  recipe (required)", 1)[1].split("\n  calibration=")[0]
    assert "w4a16_rtn" in recipe and "original" in recipe and recipe.rstrip().endswith("(or a path)")
    assert "  artifact_dir=${artifacts_dir}/${model.name}/${recipe.name}\n" in text  # too long: description below


def test_a_key_naming_files_of_its_config_folder_lists_them(tmp_path):
    """report's layout= and output= pick files of conf/report/layout/ and output/, and of the search path's."""
    extra = tmp_path / "report" / "layout"
    extra.mkdir(parents=True)
    (extra / "greeting.yaml").write_text("_target_: greeting.Greeting\n")
    keys = {s.name: s for s in key_settings("report", [CONF_DIR, tmp_path])}
    assert keys["layout"].options == "batch_table, context_table, greeting, length_grid, oneline, summary"
    assert keys["output"].options == "csv, html, markdown, png"
    assert keys["accuracy_floor_pct"].default == 95 and keys["accuracy_floor_pct"].options == ""

