"""A run's progress and ETA (quantize.common.progress): the arithmetic from a
job-times file, and the Hydra callback that writes it and prints the line."""
import json
from types import SimpleNamespace

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from quantize.common import progress
from quantize.common.progress import JobProgress, JobTime, PlannedJob, RunFile, duration, eta, read_times

HOST, OTHER = "AMD EPYC, 2 cores; avx2", "Xeon, 64 cores; avx512f"


def took(seconds, stage="quantize", recipe="w4a16_gptq", work=1, host=HOST, ok=True, run="old", model="m"):
    return JobTime(run=run, stage=stage, model=model, recipe=recipe, host=host, seconds=seconds, work=work, ok=ok)


def job(stage="quantize", recipe="w4a16_gptq", work=1, model="m"):
    return PlannedJob(stage, model, recipe, work)


def test_durations_carry_units():
    assert [duration(s) for s in (0, 42.4, 60, 190, 3599, 3600, 7500)] == [
        "0 s", "42 s", "1 min 0 s", "3 min 10 s", "59 min 59 s", "1 h 0 min", "2 h 5 min"]


def test_eta_sums_the_mean_of_the_same_recipe_on_this_host():
    history = [took(100), took(140), took(10, recipe="w4a16_rtn"), took(999, host=OTHER),
               took(5000, ok=False), took(300, stage="evaluate", recipe="w4a16_gptq", work=9)]
    jobs = [job(), job(recipe="w4a16_rtn"), job("evaluate", work=3)]
    # the evaluate job: 3 of the 9 measurements that took 300 s
    assert eta(jobs, HOST, history).seconds == 120 + 10 + 100
    assert str(eta(jobs, HOST, history)) == "ETA 3 min 50 s"


def test_an_evaluate_job_takes_the_time_of_the_measurements_it_has_left():
    """After a 4-measurement job of 120 s, 49 measurements left are not 120 s,
    nor is 1 left (a resumed job)."""
    one = [took(120, stage="evaluate", work=4)]
    assert [eta([job("evaluate", work=n)], HOST, one).seconds for n in (49, 1)] == [1470, 30]
    # jobs of 2 and 10 measurements: 20 s to start the engine, 5 s a measurement
    two = [took(30, stage="evaluate", work=2), took(70, stage="evaluate", work=10)]
    assert [eta([job("evaluate", work=n)], HOST, two).seconds for n in (1, 49)] == [25, 265]
    # a fit with no fixed part >= 0 (the longer job was the quicker one per measurement): in proportion
    noisy = [took(60, stage="evaluate", work=2), took(50, stage="evaluate", work=10)]
    assert eta([job("evaluate", work=24)], HOST, noisy).seconds == 220
    # a build is one build, whatever its plan said
    assert eta([job(work=1)], HOST, [took(100), took(200, work=1)]).seconds == 150


def test_a_recipe_never_measured_takes_the_stage_mean_of_its_model():
    history = [took(100), took(20, recipe="w4a16_rtn"), took(5000, recipe="w4a16_awq", model="big")]
    assert eta([job(recipe="w8a8_smooth_gptq")], HOST, history).seconds == 60


def test_a_job_with_nothing_left_takes_what_skips_took_or_nothing():
    history = [took(600), took(4, work=0), took(6, work=0)]
    assert eta([job(work=0), job(work=0)], HOST, history).seconds == 10
    assert eta([job(work=0)], HOST, []).seconds == 0


def test_unknown_says_why():
    first = eta([job(), job("evaluate")], HOST, [took(100, host=OTHER)])
    assert first.seconds is None and str(first) == "ETA unknown (first run on this host)"
    evaluate_unmeasured = eta([job(), job("evaluate")], HOST, [took(100)])
    assert str(evaluate_unmeasured) == "ETA unknown (no evaluate job of m measured on this host yet)"


def test_progress_counts_this_runs_jobs_failed_ones_too(tmp_path):
    run = RunFile(run_id="now", started=1000.0, times=str(tmp_path / "t.jsonl"),
                  jobs=[job(), job(recipe="w4a16_rtn"), job("evaluate", work=3), job("evaluate", "w4a16_rtn", 3)])
    history = [took(100, run="old"), took(200, stage="evaluate", work=3, run="old"),
               took(90, run="now"), took(3, recipe="w4a16_rtn", run="now", ok=False)]
    line = run.progress(history, HOST, now=1190.0)
    # left: the two evaluate jobs, 200 s each (the gptq one measured, rtn takes the stage mean)
    assert line == "progress: 2/4 done (1 failed), elapsed 3 min 10 s, ETA 6 min 40 s"


def test_a_line_cut_short_by_a_crash_is_passed_over(tmp_path):
    times = tmp_path / "job_times.jsonl"
    times.write_text(json.dumps(took(5).__dict__) + "\n" + '{"run": "x", "stage"' + "\n")
    assert read_times(times) == [took(5)] and read_times(tmp_path / "none.jsonl") == []


def job_config(out_dir, recipe="w4a16_rtn"):
    return OmegaConf.create({"model": {"name": "m"}, "recipe": {"name": recipe},
                             "hydra": {"runtime": {"output_dir": str(out_dir)}}})


def test_the_callback_records_each_job_and_prints_k_of_n(tmp_path, monkeypatch, capsys):
    """Two jobs through the callback as Hydra calls it: one ok, one failed
    (its FAILED.json); each appends its time, the second line counts both.
    The callback's clock is the test's: the run began at 1000 s, the first job
    ran from 1003 s to 1015 s, the second from 1015 s to 1020 s."""
    clock = iter([1003.0, 1015.0, 1015.0, 1020.0])  # start, end of each job: one reading each
    monkeypatch.setattr(progress, "time", SimpleNamespace(time=lambda: next(clock)))
    monkeypatch.setattr(progress, "host_kind", lambda: HOST)
    run_file = tmp_path / "progress" / "run-1.json"
    RunFile(run_id="run-1", started=1000.0, times=str(tmp_path / "progress" / progress.TIMES_FILE),
            jobs=[job(recipe="w4a16_rtn"), job(recipe="w4a16_gptq"), job("evaluate", "w4a16_rtn", 2)]).write(run_file)
    monkeypatch.setenv(progress.RUN_ENV, str(run_file))
    callback = JobProgress(stage="quantize")
    for recipe, status in (("w4a16_rtn", JobStatus.COMPLETED), ("w4a16_gptq", JobStatus.COMPLETED)):
        out_dir = tmp_path / recipe
        out_dir.mkdir()
        if recipe == "w4a16_gptq":
            (out_dir / "FAILED.json").write_text("{}")  # run_job caught the error: the job "completes"
        callback.on_job_start(job_config(out_dir, recipe))
        callback.on_job_end(job_config(out_dir, recipe), JobReturn(status=status))
    unknown = "ETA unknown (no evaluate job of m measured on this host yet)"
    assert capsys.readouterr().out.splitlines() == [
        f"progress: 1/3 done, elapsed 15 s, {unknown} (quantize w4a16_rtn ok in 12 s)",
        f"progress: 2/3 done (1 failed), elapsed 20 s, {unknown} (quantize w4a16_gptq failed in 5 s)"]
    recorded = read_times(tmp_path / "progress" / progress.TIMES_FILE)
    assert [(t.run, t.recipe, t.ok, t.work, t.host, t.seconds) for t in recorded] == [
        ("run-1", "w4a16_rtn", True, 1, HOST, 12.0), ("run-1", "w4a16_gptq", False, 1, HOST, 5.0)]


def test_outside_a_planned_run_the_callback_does_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(progress.RUN_ENV, raising=False)
    callback = JobProgress(stage="quantize")
    callback.on_job_start(job_config(tmp_path))
    callback.on_job_end(job_config(tmp_path), JobReturn(status=JobStatus.COMPLETED))
    assert capsys.readouterr().out == "" and list(tmp_path.iterdir()) == []
