"""runs=auto and warmup_runs=auto end to end: `python -m evaluate` on the
fake-clock dummy engine (tests/evaluate/engines/), noise-free or with its
deterministic jitter. Correctness only: no timing is asserted."""
import pytest

from tests.conftest import tail
from evaluate import results
from evaluate.precision import CAP_REACHED, TARGET_MET, ci_pct
from tests.evaluate.engines.test_base import evaluate_with_dummy

BASE = ("accuracy=none", "scenario=interactive")


def run(tiny_model, tmp_path, *args):
    out = evaluate_with_dummy(f"model={tiny_model}", *BASE, f"results_dir={tmp_path / 'res'}", *args, cwd=tmp_path)
    assert out.returncode == 0, tail(out)
    return out, sorted(results.read(tmp_path / "res"), key=lambda r: r.run_index)


def throughputs(rows) -> list[float]:
    return [r.metrics["output_throughput"] for r in rows]


def test_noise_free_runs_stop_at_min_runs(tiny_model, tmp_path):
    _, rows = run(tiny_model, tmp_path, "runs=auto", "min_runs=3", "max_runs=6")
    assert [r.run_index for r in rows] == [0, 1, 2]
    last = rows[-1].precision
    assert last["rule"] == "auto" and last["stopped"] == TARGET_MET and last["runs"] == 3
    assert last["achieved_ci_pct"] == pytest.approx(0, abs=1e-6) and last["target_ci_pct"] == 5
    assert [r.precision["stopped"] for r in rows[:-1]] == [None, None]  # each row as it stood
    assert rows[0].precision["achieved_ci_pct"] is None  # one run: no interval yet
    assert "warmup_runs" not in last  # warm-up fixed


def test_an_unreachable_target_stops_at_max_runs_and_says_so(tiny_model, tmp_path):
    _, rows = run(tiny_model, tmp_path, "runs=auto", "min_runs=3", "max_runs=5", "target_ci_pct=0.5",
                  "engine.args.jitter_pct=20")
    assert [r.run_index for r in rows] == [0, 1, 2, 3, 4]
    last = rows[-1].precision
    assert last["stopped"] == CAP_REACHED and last["runs"] == 5
    assert last["achieved_ci_pct"] == pytest.approx(ci_pct(throughputs(rows)), abs=1e-3)
    assert last["achieved_ci_pct"] > 0.5
    assert all(r.precision["stopped"] is None for r in rows[:-1])


def test_a_noisy_engine_runs_past_min_runs_until_the_target_is_met(tiny_model, tmp_path):
    _, rows = run(tiny_model, tmp_path, "runs=auto", "min_runs=3", "max_runs=30", "target_ci_pct=3",
                  "engine.args.jitter_pct=8")
    values, last = throughputs(rows), rows[-1].precision
    assert 3 < len(rows) < 30 and last["stopped"] == TARGET_MET
    assert ci_pct(values) <= 3 < ci_pct(values[:-1])  # the first run count that met it


@pytest.mark.extended
def test_a_rerun_continues_from_the_stored_runs(tiny_model, tmp_path):
    noisy = ("runs=auto", "min_runs=3", "target_ci_pct=0.5", "engine.args.jitter_pct=20")
    run(tiny_model, tmp_path, *noisy, "max_runs=4")
    out, rows = run(tiny_model, tmp_path, *noisy, "max_runs=6")
    assert [r.run_index for r in rows] == list(range(6))  # 4 stored, 2 more
    assert rows[3].precision["stopped"] == CAP_REACHED and rows[3].precision["max_runs"] == 4
    assert rows[-1].precision["runs"] == 6 and rows[-1].precision["stopped"] == CAP_REACHED
    assert rows[-1].precision["achieved_ci_pct"] == pytest.approx(ci_pct(throughputs(rows)), abs=1e-3)
    out, again = run(tiny_model, tmp_path, *noisy, "max_runs=6")
    assert len(again) == 6 and "nothing to do" in out.stdout + out.stderr


@pytest.mark.extended
def test_stored_fixed_runs_count_towards_auto(tiny_model, tmp_path):
    run(tiny_model, tmp_path, "runs=2")
    _, rows = run(tiny_model, tmp_path, "runs=auto", "min_runs=3")
    assert [r.run_index for r in rows] == [0, 1, 2]
    assert [r.precision for r in rows[:2]] == [None, None]  # runs=2 rows as before
    assert rows[2].precision["runs"] == 3 and rows[2].precision["stopped"] == TARGET_MET


@pytest.mark.extended
def test_fixed_runs_write_rows_as_before(tiny_model, tmp_path):
    _, rows = run(tiny_model, tmp_path, "runs=2", "engine.args.jitter_pct=20")
    assert [r.run_index for r in rows] == [0, 1]
    assert all(r.precision is None and "precision" not in r.to_dict() for r in rows)


def test_auto_warm_up_lasts_until_the_throughput_is_stable(tiny_model, tmp_path):
    # two cold runs (2x, 1.5x slower), then steady: warm-ups 1.5x and 1x still differ, 1x and 1x do not
    out, rows = run(tiny_model, tmp_path, "runs=2", "warmup_runs=auto", "engine.args.cold_runs=2")
    assert "warm-up: 4 runs" in out.stdout + out.stderr
    assert [r.precision for r in rows] == [{"rule": "fixed", "runs": 1, "warmup_runs": 4},
                                           {"rule": "fixed", "runs": 2, "warmup_runs": 4}]
    assert throughputs(rows)[0] == pytest.approx(throughputs(rows)[1])  # no cold run was timed


@pytest.mark.extended
def test_auto_warm_up_is_capped(tiny_model, tmp_path):
    out, rows = run(tiny_model, tmp_path, "runs=1", "warmup_runs=auto", "max_warmup_runs=3",
                    "engine.args.cold_runs=9")
    assert "warm-up: 3 runs" in out.stdout + out.stderr and rows[0].precision["warmup_runs"] == 3


@pytest.mark.parametrize("args, expect", [
    (["runs=auto", "max_runs=1", "min_runs=3"],
     "error: max_runs=1: pass max_runs=<an integer >= 3> (at least min_runs=3, for runs=auto)"),
    (["runs=auto", "min_runs=1"], "error: min_runs=1: pass min_runs=<an integer >= 2>"),
    (["runs=3", "target_ci_pct=zzz"], "error: target_ci_pct=zzz: pass a number > 0"),   # with runs=3 it ran
    (["warmup_runs=1", "max_warmup_runs=[1]"], "error: max_warmup_runs=[1]: pass max_warmup_runs=<an integer >= 2>"),
    (["runs=auto", "target_ci_pct=0"], "error: target_ci_pct=0: pass a number > 0"),
    (["runs=foo"], "error: runs=foo: pass an integer >= 1 or auto"),
    (["runs=0"], "error: runs=0: pass an integer >= 1 or auto"),
    (["runs=2.5"], "error: runs=2.5: pass an integer >= 1 or auto"),
    (["warmup_runs=-1"], "error: warmup_runs=-1: pass an integer >= 0 or auto"),
    (["warmup_runs=auto", "max_warmup_runs=1"], "error: max_warmup_runs=1: pass max_warmup_runs=<an integer >= 2>"),
    (["warmup_runs=auto", "warmup_tolerance_pct=0"], "error: warmup_tolerance_pct=0: pass a number > 0"),
])
def test_bad_run_settings_are_one_line_before_any_engine_starts(tiny_model, tmp_path, args, expect):
    out = evaluate_with_dummy(f"model={tiny_model}", *BASE, f"results_dir={tmp_path / 'res'}", *args, cwd=tmp_path)
    assert out.returncode == 2, tail(out)
    assert out.stderr.strip().splitlines()[-1].startswith(expect)
    assert "Traceback" not in out.stderr and not (tmp_path / "res").exists()
