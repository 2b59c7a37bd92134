"""The plan of a matrix run (evaluate.matrix_plan): each job composed from the
real conf/, what is left read from artifacts and result rows."""
import json

import pytest

from evaluate import matrix_plan, results
from evaluate.matrix_plan import Request
from evaluate.results import Row
from quantize.common.progress import RunFile

MODEL = "smollm2-135m-instruct"  # conf/model/smollm2_135m.yaml


@pytest.fixture(autouse=True)
def cpu_profile(monkeypatch):
    """The counts below are the CPU profile's (one accuracy pass); a CUDA host's adds the lm-eval task."""
    from evaluate import hardware
    monkeypatch.setattr(hardware, "detected", lambda machine=None: hardware.DEFAULT)


@pytest.fixture
def setup(tmp_path):
    """Two-scenario set x 2 runs; `original` built, half measured;
    `w4a16_rtn` built, recorded unsupported; `w8a8_smooth_ptq` not built."""
    for name, length in (("short", 16), ("longer", 32)):
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nbatch_size: 1\ninput_len: {length}\noutput_len: 4\n")
    (tmp_path / "pair.yaml").write_text("name: pair\ninclude: [short, longer]\n")
    for recipe in ("original", "w4a16_rtn"):
        (tmp_path / "artifacts" / MODEL / recipe).mkdir(parents=True)
        (tmp_path / "artifacts" / MODEL / recipe / "manifest.json").write_text("{}")
    store = tmp_path / "results" / results.RESULTS_FILE
    base = Row(kind="speed", model_name=MODEL, artifact_id="a", batch_size=1, output_len=4,
               metrics={"output_throughput": 9.0})
    results.append(store, base.but(status="ok", recipe="original", scenario="short", input_len=16, run_index=0))
    results.append(store, base.but(status="ok", recipe="original", scenario="short", input_len=16, run_index=1))
    results.append(store, base.but(status="failed", recipe="original", scenario="longer", input_len=32,
                                   run_index=0))
    results.append(store, base.but(status="unsupported", recipe="w4a16_rtn", scenario="short", input_len=16))
    results.append(store, base.but(status="unsupported", recipe="w4a16_rtn", scenario="longer", input_len=32))
    results.append(store, base.but(kind="accuracy", status="unsupported", recipe="w4a16_rtn", scenario="austen"))
    return tmp_path


def request(tmp_path, **changes) -> Request:
    fields = dict(quantize=["original", "w8a8_smooth_ptq"], evaluate=["original", "w4a16_rtn", "w8a8_smooth_ptq"],
                  servable=None, scenario=str(tmp_path / "pair.yaml"), runs="2",
                  results_dir=str(tmp_path / "results"), overrides=[f"artifacts_dir={tmp_path / 'artifacts'}"])
    return Request(**(fields | changes))


def test_the_plan_counts_what_each_job_has_left(setup):
    plan = matrix_plan.plan(request(setup))
    assert [(j.recipe, j.work) for j in plan.quantize] == [("original", 0), ("w8a8_smooth_ptq", 1)]
    # original: `longer` owes both runs, `short` none; the accuracy pass (conf default austen) is owed
    assert [(j.recipe, j.work) for j in plan.evaluate] == [("original", 3), ("w4a16_rtn", 0),
                                                           ("w8a8_smooth_ptq", 2 + 2 + 1)]
    assert plan.scenario_count == 2
    lines = plan.lines([])
    assert lines[1] == "  quantize: build w8a8_smooth_ptq; complete, skipped: original"
    assert lines[2].endswith("x 2 runs: 2 engines to start (measurements left: original 3, w8a8_smooth_ptq 5); "
                             "nothing to measure: w4a16_rtn (every run stored or unsupported)")
    assert lines[3] == "  ETA unknown (first run on this host)"


def test_runs_and_servable_change_the_plan(setup):
    plan = matrix_plan.plan(request(setup, runs="1", servable=["original", "w8a8_smooth_ptq"],
                                   quantize=["original"]))
    assert [(j.recipe, j.work, j.note) for j in plan.evaluate] == [
        ("original", 2, ""), ("w4a16_rtn", 0, "not servable here: recorded unsupported"),
        ("w8a8_smooth_ptq", 0, f"no artifact at {setup / 'artifacts' / MODEL / 'w8a8_smooth_ptq'}")]


def test_the_command_prints_the_plan_and_writes_the_run_file(setup, capsys):
    run_file = setup / "results" / "progress" / "run-7.json"
    args = ["--quantize", "original", "--evaluate", "original", "--scenario", str(setup / "pair.yaml"),
            "--runs", "2", "--results-dir", str(setup / "results"), "--run-file", str(run_file),
            f"artifacts_dir={setup / 'artifacts'}"]
    assert matrix_plan.main(args) == 0
    assert capsys.readouterr().out.startswith("plan: 2 jobs (1 quantize, 1 evaluate) on ")
    run = RunFile.read(run_file)
    assert run.run_id == "run-7" and run.times == str(run_file.parent / "job_times.jsonl")
    assert [(j.stage, j.recipe, j.work) for j in run.jobs] == [("quantize", "original", 0), ("evaluate", "original", 3)]
    assert json.loads(run_file.read_text())["jobs"][0]["model"] == MODEL


def test_check_composes_every_job_and_prints_and_writes_nothing(setup, capsys):
    """run_matrix.sh's check before the capability check: 0 and silent for
    good overrides, the plan's one line for a setting of one stage only."""
    args = ["--check", "--quantize", "original", "--evaluate", "original", "--scenario", str(setup / "pair.yaml"),
            "--runs", "2", "--results-dir", str(setup / "results"), f"artifacts_dir={setup / 'artifacts'}"]
    assert matrix_plan.main(args) == 0
    assert capsys.readouterr() == ("", "")
    assert not (setup / "results" / "progress").exists()
    assert matrix_plan.main(args + ["force=true"]) == 2
    assert capsys.readouterr().err.startswith("error: force is a setting of quantize only")


def test_a_bad_override_is_one_line_and_no_run_file(setup, capsys):
    run_file = setup / "run.json"
    args = ["--evaluate", "original", "--scenario", "cpu", "--runs", "2", "--results-dir", str(setup),
            "--run-file", str(run_file), "no_such_key=1"]
    assert matrix_plan.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no_such_key" in err and len(err.strip().splitlines()) == 1
    assert not run_file.exists()


@pytest.mark.parametrize("override, only_in", [("engine=hf", "evaluate"), ("runs=5", "evaluate"),
                                               ("results_dir=elsewhere", "evaluate"),
                                               ("calibration.num_samples=8", "quantize")])
def test_a_setting_of_one_stage_says_where_it_goes(setup, capsys, override, only_in):
    """run_matrix.sh gives its extra arguments to both stages: a key of one
    stage only is one line naming the stage that has it and the way to set it,
    not Hydra's "Could not override"."""
    args = ["--quantize", "original", "--evaluate", "original", "--scenario", "cpu", "--runs", "2",
            "--results-dir", str(setup / "results"), "--run-file", str(setup / "run.json"), override]
    assert matrix_plan.main(args) == 2
    err = capsys.readouterr().err
    key = override.partition("=")[0]
    assert err.startswith(f"error: {key} is a setting of {only_in} only") and len(err.strip().splitlines()) == 1
    assert "RUNS=" in err and "Could not override" not in err and "Exception" not in err


def test_a_key_of_neither_stage_gets_the_nearest_key(setup, capsys):
    args = ["--quantize", "original", "--evaluate", "original", "--scenario", "cpu", "--runs", "2",
            "--results-dir", str(setup / "results"), "--run-file", str(setup / "run.json"), "recipee=x"]
    assert matrix_plan.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: python -m quantize has no key recipee") and "did you mean recipe?" in err


INTERRUPTED_PLAN = """
import os, runpy, signal, sys, time
from evaluate import results
def read(*args, **kwargs):   # Ctrl-C while the plan reads the rows
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
results.read = read
sys.argv = ["matrix_plan", *sys.argv[1:]]
runpy.run_module("evaluate.matrix_plan", run_name="__main__")
"""


@pytest.mark.parametrize("check", [True, False])
def test_ctrl_c_while_planning_ends_in_one_line_with_130(tmp_path, check):
    """Ctrl-C during `python -m evaluate.matrix_plan` (--check too) printed a
    KeyboardInterrupt traceback."""
    import subprocess
    import sys
    from tests.conftest import quantize_env
    args = ["--quantize", "original", "--evaluate", "original", "--scenario", "cpu", "--runs", "auto",
            "--results-dir", tmp_path / "res", *(["--check"] if check else ["--run-file", tmp_path / "r.json"])]
    out = subprocess.run([sys.executable, "-c", INTERRUPTED_PLAN, *map(str, args)], env=quantize_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 130, out.stderr[-3000:]
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("error: interrupted"), out.stderr
    assert not (tmp_path / "r.json").exists()


def test_an_unresolvable_override_points_to_a_help_that_lists_the_keys(tmp_path):
    """The hint named `python -m evaluate.matrix_plan --help`, whose argparse
    help lists none of the keys the overrides set."""
    import subprocess
    import sys
    from tests.conftest import quantize_env
    out = subprocess.run([sys.executable, "-m", "evaluate.matrix_plan", "--check", "--quantize", "original",
                          "--evaluate", "original", "--scenario", "cpu", "--runs", "2",
                          "--results-dir", str(tmp_path / "res"), "artifact_dir=${nope}"],
                         cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "nope" in out.stderr and "(python -m evaluate --help lists its groups and keys)" in out.stderr
