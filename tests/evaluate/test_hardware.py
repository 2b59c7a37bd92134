"""Defaults that follow the hardware (conf/hardware/, evaluate/hardware.py):
picked once at the entry point from the machine facts, recorded in every row
and named in the report header; the command line still wins. The CUDA
machine is simulated (injected facts), so these run on any host."""
import pytest
from hydra import compose, initialize_config_dir

from evaluate import hardware
from evaluate.report.markdown import render_method
from evaluate.results import Row
import quantize.common.machine
from quantize.common.config import register
from quantize.common.errors import UserError
from quantize.common.machine import Machine
from quantize.common.paths import CONF_DIR

GPU = Machine(arch="x86_64", cuda=((9, 0),), gpu_names=("NVIDIA H200",))
CPU = Machine(arch="x86_64", isa=frozenset({"avx2", "avx512f"}))


@pytest.fixture
def on(monkeypatch):
    """Make this process see `machine` (as the entry point and the engines ask it)."""
    def use(machine):
        monkeypatch.setattr(quantize.common.machine, "detect", lambda: machine)
        gpus = {"cuda": machine.cuda, "gpu_names": machine.gpu_names} if machine.cuda else {}
        monkeypatch.setattr(quantize.common.machine, "gpus", lambda: gpus)
    return use


def composed(argv: list[str]):
    """The config `python -m evaluate <argv>` runs with on the machine `on` set."""
    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose("evaluate", overrides=hardware.with_default(argv))


def defaults(cfg) -> dict:
    return {"hardware": cfg.hardware.name, "scenario": cfg.scenario.name, "slo": cfg.slo.name,
            "load": cfg.load.name, "saturation": cfg.load.get("saturation_concurrency"),
            "reference_device": cfg.accuracy.reference_device}


def test_a_cuda_machine_gets_the_gpu_defaults(on):
    on(GPU)
    cfg = composed([])
    assert defaults(cfg) == {"hardware": "cuda", "scenario": "reference", "slo": "interactive_gpu",
                             "load": "sweep", "saturation": 256, "reference_device": "cuda"}
    assert cfg.scenario.include == ["interactive", "decode_bound", "prefill_bound", "long_context",
                                    "medium_batch", "base", "high_concurrency"]
    assert cfg.engine.name == "vllm"  # the engine stays in-process: see the load default below


def test_a_cpu_machine_gets_todays_defaults_and_its_command_line_is_left_as_typed(on):
    on(CPU)
    argv = ["recipe=original", "runs=2"]
    assert hardware.with_default(argv) == argv  # so a CPU row's repro is what it was
    assert defaults(composed(argv)) == {"hardware": "cpu", "scenario": "cpu", "slo": "none", "load": "none",
                                        "saturation": None, "reference_device": "cpu"}


@pytest.mark.parametrize("argv, changed", [
    (["scenario=interactive"], {"scenario": "interactive"}),
    (["slo=interactive_cpu"], {"slo": "interactive_cpu"}),
    (["load=sweep"], {"saturation": 16}),
    (["load=none"], {"load": "none", "saturation": None}),
    (["accuracy.reference_device=cpu"], {"reference_device": "cpu"}),
    (["hardware=cpu"], {"hardware": "cpu", "scenario": "cpu", "slo": "none", "load": "none", "saturation": None,
                        "reference_device": "cpu"}),
])
def test_the_command_line_wins_over_the_gpu_defaults(on, argv, changed):
    on(GPU)
    gpu = defaults(composed([]))
    assert defaults(composed(argv)) == gpu | changed


def test_the_gpu_defaults_can_be_asked_for_on_a_cpu_machine(on):
    """E.g. a sweep launched from a CPU login node to GPU nodes."""
    on(CPU)
    assert hardware.with_default(["hardware=cuda"]) == ["hardware=cuda"]
    assert defaults(composed(["hardware=cuda"]))["scenario"] == "reference"


@pytest.mark.parametrize("argv, expect", [
    (["-m", "recipe=a,b", "runs=1"], ["-m", "hardware=cuda", "recipe=a,b", "runs=1"]),
    (["--config-name", "evaluate", "runs=1", "--info"], ["--config-name", "evaluate", "hardware=cuda", "runs=1", "--info"]),
    (["--info"], ["hardware=cuda", "--info"]),
    ([], ["hardware=cuda"]),
])
def test_the_gpu_profile_joins_the_overrides_where_hydras_parser_takes_them(on, argv, expect):
    """A sweep (`python -m evaluate -m a=b` on a GPU) keeps every override: Hydra
    takes one run of them, so `hardware=cuda -m a=b` would leave `a=b` unrecognized."""
    from hydra._internal.utils import get_args_parser
    on(GPU)
    assert hardware.with_default(argv) == expect
    args = get_args_parser().parse_args(expect)
    assert args.overrides == [a for a in expect if "=" in a]


def test_a_job_on_a_gpu_with_the_cpu_defaults_is_warned_about():
    assert "hardware=cuda" in hardware.mismatch("cpu", GPU)
    assert hardware.mismatch("cpu", CPU) is None and hardware.mismatch("cuda", GPU) is None


def test_the_gpu_load_default_applies_where_the_engine_serves_http(on):
    """A plain `python -m evaluate` on a GPU (engine=vllm, in-process) runs the
    batch scenarios; engine=vllm_server gets the GPU sweep; a profile named on
    the command line still needs a server engine."""
    from evaluate.engines.vllm import VllmEngine
    from evaluate.engines.vllm_server import VllmServerEngine
    from evaluate.config import EvaluateConfig
    from evaluate.serving import run

    def configure(cfg, engine_cls, name):
        config = EvaluateConfig.from_cfg(cfg)
        return run.configure(config.load, config.slo, engine_cls, name), config.slo
    on(GPU)
    cfg = composed([])
    load, slo = configure(cfg, VllmEngine, "vllm")
    assert load is None and slo.name == "interactive_gpu"
    load, _ = configure(composed(["engine=vllm_server"]), VllmServerEngine, "vllm_server")
    assert (load.name, load.saturation_concurrency, load.max_requests) == ("sweep", 256, 1000)
    with pytest.raises(UserError, match="load=sweep needs a server engine"):
        configure(composed(["load=sweep_gpu"]), VllmEngine, "vllm")


def test_a_gpu_reference_on_a_machine_without_one_fails_before_any_engine_starts(on):
    from quantize.common.machine import check_device
    on(CPU)
    with pytest.raises(UserError, match="accuracy.reference_device=cuda: this machine has no CUDA device"):
        check_device("accuracy.reference_device", "cuda")
    check_device("accuracy.reference_device", "cpu")
    with pytest.raises(UserError, match=r"accuracy.reference_device=zzz is not a device quantbench runs models on; "
                                        r"pass accuracy.reference_device=auto, cpu or cuda"):
        check_device("accuracy.reference_device", "zzz")
    on(GPU)
    check_device("accuracy.reference_device", "cuda:1")


def test_the_report_header_names_the_profiles_of_its_rows(tmp_path):
    rows = [Row(kind="speed", status="ok", recipe="original", hardware_defaults=p) for p in ("cuda", "cpu", "cuda")]
    header = render_method(rows).splitlines()
    assert "- Defaults: `hardware=cpu`, `hardware=cuda` (conf/hardware/; command-line choices override them)" in header
    # rows written before the profile was recorded: no line, the header is what it was
    assert not [line for line in render_method([Row(kind="speed", status="ok")]).splitlines()
                if line.startswith("- Defaults")]


def test_the_profile_round_trips_through_the_store(tmp_path):
    from evaluate import results
    results.append(tmp_path / "results.jsonl", Row(kind="speed", status="ok", artifact_id="a", metrics={"latency_s": 1.0},
                                                     hardware_defaults="cuda"))
    (row,) = results.read(tmp_path)
    assert row.hardware_defaults == "cuda" and not row.extra


STUB_PY = """#!/usr/bin/env bash
# stands in for .venv/bin/python: the machine kind evaluate.hardware would print, everything
# servable, and the stages' command lines logged instead of run
case "$2" in
  evaluate.hardware) echo "$FAKE_HARDWARE" ;;
  evaluate.capabilities) r="${3#servable=[}"; echo "${r%]}" ;;
  *) echo "$*" >> "$CALLS" ;;
esac
"""


@pytest.mark.parametrize("machine, preset, expect", [
    ("cuda", [], "gpu"),
    ("cpu", [], "cpu"),
    ("cuda", ["cpu"], "cpu"),   # a preset named on the command line wins
])
def test_run_matrix_picks_the_gpu_preset_on_a_cuda_machine(tmp_path, machine, preset, expect):
    import subprocess

    from tests.conftest import ROOT
    stub = tmp_path / "python"
    stub.write_text(STUB_PY)
    stub.chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": "/usr/bin:/bin", "PY": str(stub), "FAKE_HARDWARE": machine, "CALLS": str(calls),
           "RESULTS": str(tmp_path / "results"), "REPORT": str(tmp_path / "reports")}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "run_matrix.sh"), *preset], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    preset_file = (CONF_DIR / "matrix" / f"{expect}.env").read_text()
    recipes = next(line.split("=", 1)[1] for line in preset_file.splitlines() if line.startswith("RECIPES="))
    evaluate = next(line for line in calls.read_text().splitlines() if line.startswith("-m evaluate -m"))
    assert f"recipe={recipes}" in evaluate.split()
    from quantize.common.paths import RECIPES_DIR
    assert all((CONF_DIR / "recipe" / f"{r}.yaml").is_file() or (RECIPES_DIR / f"{r}.yaml").is_file()
               for r in recipes.split(","))
    if expect == "gpu":
        assert recipes.split(",") == ["original", "w8a8_smooth_ptq", "w8a8_smooth_gptq", "w8a8_sparse_smooth_gptq",
                                      "w8a16_awq", "w8a16_smooth_awq", "w8a16_sparse_awq", "w4a16_gptq",
                                      "w4a16_awq", "fp8_dynamic"]
        assert "scenario=reference" in evaluate.split()


def test_the_gpu_question_skips_torch_only_where_its_build_has_no_gpu_support():
    """The entry point's profile comes from the GPUs alone; where the installed
    torch is built without CUDA and ROCm it is answered without importing torch,
    and the answer is the one torch gives."""
    import torch
    built_for_gpu = torch.version.cuda is not None or torch.version.hip is not None
    assert quantize.common.machine._torch_may_see_a_gpu() == built_for_gpu
    assert bool(quantize.common.machine.gpus()) == torch.cuda.is_available()
    assert hardware.detected() == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("args, code, expect", [
    ([], 0, ("cpu", "cuda")),
    (["--help"], 0, ("python -m evaluate.hardware: print the hardware profile this machine gets",)),
    (["--bogus"], 2, ("error: python -m evaluate.hardware takes no arguments, not '--bogus'",)),
    (["hardware=cuda"], 2, ("error: python -m evaluate.hardware takes no arguments, not 'hardware=cuda'",)),
])
def test_the_profile_command_says_what_it_prints_and_takes_no_arguments(tmp_path, args, code, expect):
    """scripts/run_matrix.sh reads its one word; --help and a stray argument printed that word too."""
    import subprocess
    import sys

    from tests.conftest import quantize_env
    out = subprocess.run([sys.executable, "-m", "evaluate.hardware", *args], cwd=tmp_path, env=quantize_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == code, out.stderr
    said = (out.stdout + out.stderr).strip()
    assert len(said.splitlines()) == 1 and said.startswith(expect), said
