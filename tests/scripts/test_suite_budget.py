"""scripts/suite_budget.py: the host's kind from its CPU facts, a real
pytest JUnit report read back per test and per file, the budget verdict
(over twice the budget fails, listing the slowest tests), and `record`
keeping a run's times for the next run's file order."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantize.common.machine import Machine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "suite_budget.py"
spec = importlib.util.spec_from_file_location("suite_budget", SCRIPT)
suite_budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite_budget)


@pytest.mark.parametrize("arch, isa, kind", [
    ("x86_64", {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"}, "x86 AMX"),
    ("x86_64", {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}, "x86 AVX-512 + BF16 (no AMX)"),
    ("x86_64", {"avx2", "avx512f", "avx512_vnni"}, "x86 AVX-512 without BF16"),
    ("x86_64", {"avx2"}, "x86 AVX2"),
    ("aarch64", {"asimd", "bf16"}, "aarch64"),
])
def test_the_four_cpu_kinds_are_told_apart(arch, isa, kind):
    assert suite_budget.host_kind(Machine(arch=arch, isa=frozenset(isa))) == kind


def junit(path: Path, wall_s: float, cases: list[tuple[str, str, float]], failures: int = 0) -> Path:
    rows = "".join(f'<testcase classname="{c}" name="{n}" time="{t}"/>' for c, n, t in cases)
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="0" failures="{failures}" '
                    f'skipped="0" tests="{len(cases)}" time="{wall_s}">{rows}</testsuite></testsuites>')
    return path


CASES = [("tests.evaluate.test_pipeline", "test_a", 300.0), ("tests.evaluate.test_pipeline", "test_b", 50.0),
         ("tests.scripts.test_suite_budget", "test_c", 10.0), ("tests.evaluate.test_sweeps", "test_d[ray_local]", 170.0)]


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_a_run_within_budget_passes_and_says_its_time(tmp_path):
    out = run_script("check", "all", str(junit(tmp_path / "r.xml", 1500, CASES)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 tests, 0 failed, 25 min 0 s of pytest" in out.stdout and "budget 30 min 0 s" in out.stdout
    assert "slowest" not in out.stdout


def test_over_budget_lists_the_slowest_and_past_twice_the_budget_fails(tmp_path):
    over = run_script("check", "all", str(junit(tmp_path / "over.xml", 2400, CASES)))
    assert over.returncode == 0 and "over its budget by 1.33x" in over.stdout
    slowest = [line.split()[1] for line in over.stdout.splitlines() if line.startswith("  ")]
    assert slowest == ["tests/evaluate/test_pipeline.py::test_a", "tests/evaluate/test_sweeps.py::test_d[ray_local]",
                       "tests/evaluate/test_pipeline.py::test_b", "tests/scripts/test_suite_budget.py::test_c"]
    far = run_script("check", "fast", str(junit(tmp_path / "far.xml", 601, CASES)))
    assert far.returncode == 1 and "more than 2x its budget" in far.stdout


def test_a_missing_report_is_one_line_naming_the_fix(tmp_path):
    out = run_script("check", "all", str(tmp_path / "none.xml"))
    assert out.returncode == 2 and out.stdout.strip().count("\n") == 0 and "make test" in out.stdout


def test_a_real_pytest_report_is_read_per_test_and_per_file(tmp_path):
    """pytest itself writes the report (one test of this file, and one of another)."""
    xml = tmp_path / "real.xml"
    inner = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                            f"{__file__}::test_the_four_cpu_kinds_are_told_apart",
                            "tests/test_robustness_table.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert inner.returncode == 0, inner.stdout[-2000:]
    run = suite_budget.read_run(xml)
    files = run.seconds_per_file()
    assert set(files) == {"tests/scripts/test_suite_budget.py", "tests/test_robustness_table.py"}
    assert run.tests == len(run.times) >= 6 and run.failed == 0 and run.wall_s > 0
    assert sum(files.values()) == pytest.approx(sum(t.seconds for t in run.times), abs=0.1 * len(files))


def test_record_keeps_the_run_for_this_kind_and_the_files_longest_first(tmp_path, monkeypatch):
    timings = tmp_path / "suite_timings.json"
    timings.write_text(json.dumps({"runs": {"all": {"x86 AMX": {"wall_s": 1197, "tests": 676, "date": "2026-11-26"}}},
                                   "files": {}}))
    monkeypatch.setattr(suite_budget, "TIMINGS", timings)
    monkeypatch.setattr(suite_budget, "this_host", lambda: Machine(arch="x86_64", isa=frozenset({"avx2"})))
    assert suite_budget.record("all", junit(tmp_path / "r.xml", 1500, CASES)) == 0
    saved = json.loads(timings.read_text())
    assert saved["runs"]["all"]["x86 AVX2"]["wall_s"] == 1500 and saved["runs"]["all"]["x86 AMX"]["tests"] == 676
    assert list(saved["files"]) == ["tests/evaluate/test_pipeline.py", "tests/evaluate/test_sweeps.py",
                                    "tests/scripts/test_suite_budget.py"]
    assert saved["files"]["tests/evaluate/test_pipeline.py"] == 350.0
    assert saved["slow_tests"] == ["tests/evaluate/test_pipeline.py::test_a", "tests/evaluate/test_pipeline.py::test_b",
                                   "tests/evaluate/test_sweeps.py::test_d[ray_local]",
                                   "tests/scripts/test_suite_budget.py::test_c"]


def test_a_test_slow_in_an_earlier_record_stays_slow_while_the_suite_has_it(tmp_path, monkeypatch):
    """A faster host's run does not move a test into the fast tier of the
    slower kinds; a test the run no longer has leaves the list."""
    timings = tmp_path / "suite_timings.json"
    earlier = ["tests/evaluate/test_pipeline.py::test_gone", "tests/evaluate/test_sweeps.py::test_e"]
    timings.write_text(json.dumps({"runs": {}, "files": {}, "slow_tests": earlier}))
    monkeypatch.setattr(suite_budget, "TIMINGS", timings)
    monkeypatch.setattr(suite_budget, "this_host", lambda: Machine(arch="x86_64", isa=frozenset({"avx2"})))
    cases = [*CASES, ("tests.evaluate.test_sweeps", "test_e", 1.0)]
    assert suite_budget.record("all", junit(tmp_path / "r.xml", 1500, cases)) == 0
    slow = json.loads(timings.read_text())["slow_tests"]
    assert "tests/evaluate/test_sweeps.py::test_e" in slow                # 1 s here, slow before: kept
    assert "tests/evaluate/test_pipeline.py::test_gone" not in slow       # no longer in the suite
    assert "tests/evaluate/test_pipeline.py::test_a" in slow              # slow in this run


def collect(timings: dict, tmp_path: Path, *args: str) -> list[str]:
    """The node ids pytest collects, in run order, with `timings` as the recorded run."""
    path = tmp_path / "timings.json"
    path.write_text(json.dumps(timings))
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "QUANTBENCH_SUITE_TIMINGS": str(path)})
    assert out.returncode in (0, 5), out.stdout[-2000:]  # 5: every test deselected
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_the_suite_starts_recorded_files_longest_first_then_new_slow_ones_first(tmp_path):
    """tests/conftest.py orders files as the xdist workers will take them:
    a file not recorded yet that has slow tests first (it may be long), then
    recorded files longest first, then new files without slow tests."""
    new_slow, new_fast = "tests/evaluate/test_store_lock.py", "tests/test_robustness_table.py"
    recorded = {"tests/evaluate/test_results.py": 5.0, "tests/scripts/test_suite_budget.py": 30.0,
                "tests/evaluate/test_scenarios.py": 12.0}
    nodes = collect({"files": recorded}, tmp_path, new_fast, *recorded, new_slow)
    order = list(dict.fromkeys(node.split("::")[0] for node in nodes))
    assert order == [new_slow, "tests/scripts/test_suite_budget.py", "tests/evaluate/test_scenarios.py",
                     "tests/evaluate/test_results.py", new_fast]


def test_a_test_recorded_as_long_is_left_out_of_the_fast_tier(tmp_path):
    """A test the recorded run saw take SLOW_FROM_S or more is marked slow,
    so `-m "not slow"` deselects it; its neighbours stay."""
    file = "tests/scripts/test_suite_budget.py"
    long_one = f"{file}::test_a_missing_report_is_one_line_naming_the_fix"
    everything = collect({}, tmp_path, file)
    fast = collect({"slow_tests": [long_one]}, tmp_path, "-m", "not slow", file)
    assert long_one in everything and long_one not in fast
    assert set(everything) - set(fast) == {long_one}
