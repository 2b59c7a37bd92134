"""No code from a model folder, ever (quantize/common/hf_load.py): a folder
whose config.json or tokenizer_config.json names code under `auto_map`, or
whose model_type transformers does not ship, is refused by every stage in
one line (exit 2, nothing written) before anything loads, with "y" on
standard input as if answering transformers' "run the custom code? [y/N]".
Each of the folder's .py files writes a marker file when imported: the
marker must never appear."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import last_line, quantize_env, tail

CODE_FILES = ("configuration_planted.py", "modeling_planted.py", "tokenization_planted.py")
CONFIG_AUTO_MAP = {"AutoConfig": "configuration_planted.PlantedConfig",
                   "AutoModelForCausalLM": "modeling_planted.PlantedForCausalLM"}
TOKENIZER_AUTO_MAP = {"AutoTokenizer": ["tokenization_planted.PlantedTokenizer", None]}
UNKNOWN_TYPE = "planted_llama"   # no transformers release has it
# variant -> (config.json changes, tokenizer_config.json changes, what the line says)
VARIANTS = {
    "auto_map_on_a_stock_model_type": ({"auto_map": CONFIG_AUTO_MAP}, {},
                                       'delete "auto_map" from config.json'),
    "auto_map_on_an_unknown_model_type": ({"auto_map": CONFIG_AUTO_MAP, "model_type": UNKNOWN_TYPE}, {},
                                          "use a checkpoint of an architecture transformers ships"),
    "auto_map_in_tokenizer_config": ({}, {"auto_map": TOKENIZER_AUTO_MAP}, "tokenizer_config.json names code"),
    "unknown_model_type": ({"model_type": UNKNOWN_TYPE}, {}, f"model_type '{UNKNOWN_TYPE}' is not one transformers"),
}
TIMEOUT_S = 300  # a hang guard: every refusal comes before any model or engine loads


def planted_folder(tiny_model: Path, out: Path, marker: Path, variant: str) -> Path:
    """A copy of the tiny model whose config names code, per `variant`; each
    .py writes `marker` when imported."""
    shutil.copytree(tiny_model, out)
    config_changes, tokenizer_changes, _ = VARIANTS[variant]
    for name, changes in (("config.json", config_changes), ("tokenizer_config.json", tokenizer_changes)):
        path = out / name
        path.write_text(json.dumps(json.loads(path.read_text()) | changes, indent=2))
    for name in CODE_FILES:
        (out / name).write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n")
    return out


def snapshot(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime for p in folder.rglob("*")}


def run_with_yes(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m <module> args`, answering "y" to any prompt."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=quantize_env(), input="y\n" * 4,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def assert_refused(proc: subprocess.CompletedProcess, folder: Path, marker: Path, says: str) -> None:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, tail(proc)
    assert len(errors) == 1 and errors[0] == last_line(proc.stderr), tail(proc)
    assert str(folder) in errors[0] and "never runs code from a model folder" in errors[0] and says in errors[0]
    assert "Traceback" not in proc.stderr and "[y/N]" not in proc.stdout + proc.stderr
    assert not marker.exists(), "code from the model folder ran"


@pytest.fixture
def planted(tmp_path, tiny_model):
    """(folder, marker) for a variant: `planted(variant)`."""
    def make(variant: str) -> tuple[Path, Path]:
        marker = tmp_path / "CODE_RAN"
        return planted_folder(tiny_model, tmp_path / f"planted-{variant}", marker, variant), marker
    return make


# Each stage: its module, its arguments ({folder}: the planted folder, {tiny}:
# the clean tiny model, {out}: a fresh folder) and what it must not create under {out}.
STAGES = {
    "quantize": ("quantize", ["model={folder}", "recipe=original", "artifacts_dir={out}/artifacts"], ["artifacts"]),
    "evaluate_hf": ("evaluate", ["model={folder}", "engine=hf", "accuracy=none", "runs=1",
                                 "results_dir={out}/results"], ["results"]),
    # vLLM's own pre-start checks (capability table, args, memory) come later: the line comes before any of them
    "evaluate_vllm": ("evaluate", ["model={folder}", "engine=vllm", "accuracy=none", "runs=1",
                                   "results_dir={out}/results"], ["results"]),
    "evaluate_vllm_server": ("evaluate", ["model={folder}", "engine=vllm_server", "accuracy=none", "runs=1",
                                          "results_dir={out}/results"], ["results"]),
    "evaluate_openai": ("evaluate", ["model={folder}", "engine=openai", "engine.base_url=http://127.0.0.1:9/v1",
                                     "accuracy=none", "runs=1", "results_dir={out}/results"], ["results"]),
    # the accuracy reference is a model folder too, checked before any engine starts
    "evaluate_accuracy_reference": ("evaluate", ["model={tiny}", "engine=hf", "runs=1", "accuracy.reference={folder}",
                                                 "results_dir={out}/results"], ["results/results.jsonl"]),
    "sensitivity": ("quantize.sensitivity", ["model={folder}", "recipe=w4a16_rtn", "results_dir={out}/results"],
                    ["results"]),
    "propose": ("quantize.propose", ["model={folder}", "recipe=w4a16_gptq", "kept_dense=1",
                                     "results_dir={out}/results", "artifacts_dir={out}/artifacts",
                                     "recipes_dir={out}/recipes"], ["results", "artifacts", "recipes"]),
}


def run_stage(stage: str, folder: Path, tiny: Path, out: Path, cwd: Path) -> subprocess.CompletedProcess:
    module, args, _ = STAGES[stage]
    return run_with_yes(module, *(a.format(folder=folder, tiny=tiny, out=out) for a in args), cwd=cwd)


def assert_nothing_written(stage: str, out: Path) -> None:
    written = [name for name in STAGES[stage][2] if (out / name).exists()]
    assert not written, written


# The same refusal on the same path as evaluate_vllm: in the full suite only.
SLOW_STAGES = ("evaluate_vllm_server", "evaluate_openai", "evaluate_accuracy_reference")


@pytest.mark.parametrize("stage", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_STAGES else s for s in STAGES])
def test_every_stage_refuses_a_folder_that_names_code(tmp_path, workdir, tiny_model, planted, stage):
    folder, marker = planted("auto_map_on_a_stock_model_type")
    before = snapshot(folder)
    proc = run_stage(stage, folder, tiny_model, tmp_path / "out", workdir)
    assert_refused(proc, folder, marker, VARIANTS["auto_map_on_a_stock_model_type"][2])
    assert_nothing_written(stage, tmp_path / "out")
    assert snapshot(folder) == before


@pytest.mark.slow  # tests/quantize/common/test_hf_load.py checks each kind in-process, in the fast tier
@pytest.mark.parametrize("case", [
    "evaluate_hf-auto_map_on_an_unknown_model_type",  # where transformers asked "[y/N]" on stdin
    "evaluate_hf-unknown_model_type",
    "quantize-auto_map_in_tokenizer_config",
    "quantize-unknown_model_type",
])
def test_each_kind_of_code_folder_is_refused(tmp_path, workdir, tiny_model, planted, case):
    stage, variant = case.split("-")
    folder, marker = planted(variant)
    proc = run_stage(stage, folder, tiny_model, tmp_path / "out", workdir)
    assert_refused(proc, folder, marker, VARIANTS[variant][2])
    assert_nothing_written(stage, tmp_path / "out")


def test_the_report_reads_no_model_folder(tmp_path, workdir, planted):
    """The report reads result rows and, of an artifact folder, manifest.json
    as JSON (evaluate/analysis/suspect.py): never a config, tokenizer or
    model. Rows that point at a folder naming code report as usual, and its
    code never runs."""
    from tests.evaluate.report.rows import main_rows, store
    folder, marker = planted("auto_map_on_a_stock_model_type")
    store(tmp_path / "results", [row.but(artifact_path=str(folder)) for row in main_rows()])
    proc = run_with_yes("evaluate.report", f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}",
                        "output=[markdown]", cwd=workdir)
    assert proc.returncode == 0, tail(proc)
    assert (tmp_path / "out" / "report.md").is_file() and not marker.exists()
