"""quantbench's Optuna sweeper (evaluate/search/sweeper.py) driving a toy
search (toy_app.py) through the real Hydra CLI and real Optuna on SQLite:
a study killed with kill -9 resumes to its target with no trial lost or run
twice, a second sweeper on a live study refuses, a failing trial leaves the
search going with its error in study.json, and a storage that cannot be
opened stops the search with one line before any trial."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from hydra.core.utils import JobReturn, JobStatus

from evaluate.search import study_file
from evaluate.search.sweeper import _alive, _Ownership, _Progress, job_error
from quantize.common.errors import UserError
from tests.conftest import quantize_env

# The plugin builds Optuna's pre-3.0 distributions; Optuna 5 only warns.
pytestmark = pytest.mark.filterwarnings("ignore:.*Distribution has been deprecated:FutureWarning")

ROOT = Path(__file__).resolve().parents[3]
HANG_GUARD_S = 180  # a toy search that takes longer is a hang, not a slow machine


def toy(tmp_path: Path, *overrides: str) -> list[str]:
    """The toy search's command: its study, ledger and job folders under tmp_path."""
    return [sys.executable, "-m", "tests.evaluate.search.toy_app", "-m", f"hydra.searchpath=[file://{ROOT}/conf]",
            f"results_dir={tmp_path / 'res'}", f"ledger={tmp_path / 'ledger.txt'}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]


def env(extra: dict | None = None) -> dict:
    return quantize_env(extra)  # this checkout (and its hydra_plugins) on PYTHONPATH


def run(cmd: list[str], cwd: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env(extra_env), capture_output=True, text=True, timeout=HANG_GUARD_S)


def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'res' / 'search' / 'toy' / 'study.db'}"


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"no {what} (search exited {proc.poll()}): {proc.communicate()[0][-2000:]}")


def one_error_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, f"rc {out.returncode}\n{out.stderr[-3000:]}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def ledger(tmp_path: Path) -> Counter:
    """How often each trial number's toy job ran to the end."""
    path = tmp_path / "ledger.txt"
    return Counter(int(n) for n in path.read_text().split()) if path.exists() else Counter()


def test_a_study_killed_with_kill_9_resumes_with_no_trial_lost_or_run_twice(tmp_path):
    """6 trials, 2 a batch, one job after the other; trial 3's job holds until
    released. Killed there, the search has told the study trials 0 and 1, trial
    2's job has finished but the study has not been told its values (its batch
    is not over), and trial 3 is cut short: the same state on any host."""
    hold = tmp_path / "hold"
    cmd = toy(tmp_path, "sleep_s=0", "+hold_trial=3", f"+hold_dir={hold}")
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (hold / "waiting").exists(), first, "trial 3 held")
        downloads = tmp_path / "downloads.txt"   # refused before a hub id's weights are downloaded
        refused = one_error_line(run([*cmd, "+model.path=org/tiny"], tmp_path, {"TOY_HUB_DOWNLOADS": str(downloads)}))
        assert f"is being run by pid {first.pid} on {socket.gethostname()}" in refused and "toy" in refused
        assert not downloads.exists()
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=HANG_GUARD_S)
    finally:
        if first.poll() is None:
            first.kill()
    (hold / "go").write_text("")  # nothing held from here on
    killed = optuna.load_study(study_name="toy", storage=db_url(tmp_path)).trials
    assert Counter(t.state.name for t in killed) == Counter({"COMPLETE": 2, "RUNNING": 2})
    left_running = {t.number: t.params for t in killed if t.state == optuna.trial.TrialState.RUNNING}
    finished_untold = sorted(set(left_running) & set(ledger(tmp_path)))
    cut_short = sorted(set(left_running) - set(finished_untold))
    assert (finished_untold, cut_short) == ([2], [3])
    # study.json was rewritten when each batch started: it shows the study as the kill left it.
    snapshot = study_file.read(study_file.path_for(tmp_path / "res", "toy"))
    assert {t.number: t.state for t in snapshot.trials} == {t.number: t.state.name for t in killed}

    again = run(cmd, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in killed) + len(finished_untold)
    assert (f"resumed with {done} of 6 trial(s) finished, {6 - done} to run; trial(s) "
            f"{', '.join(map(str, finished_untold))} had finished: values from their jobs' records; "
            f"interrupted trial(s) {', '.join(map(str, cut_short))} run again first") in again.stdout
    study = optuna.load_study(study_name="toy", storage=db_url(tmp_path))
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 6
    assert all(study.trials[n].user_attrs.get("recovered") and study.trials[n].state.name == "COMPLETE"
               for n in finished_untold)
    failed = {t.number: t for t in study.trials if t.state == optuna.trial.TrialState.FAIL}
    assert sorted(failed) == cut_short and all(t.user_attrs.get("interrupted") for t in failed.values())
    for number in cut_short:  # each interrupted trial ran again, once, with its parameters
        retries = [t for t in complete if t.user_attrs.get("retry_of") == number]
        assert len(retries) == 1 and retries[0].params == left_running[number]
    # The seeded sampler was reseeded on resume: no fresh trial repeats an earlier one's point.
    fresh = [t.params["x"] for t in study.trials if t.params and "retry_of" not in t.user_attrs]
    assert len(set(fresh)) == len(fresh)
    # Every completed trial ran to the end exactly once, and no other job did.
    assert ledger(tmp_path) == Counter(t.number for t in complete)
    # Job folders follow trial numbers, so the rerun wrote beside the first run's, not over them.
    assert {int(p.name) for p in (tmp_path / "sweep").iterdir() if p.name.isdigit()} >= {t.number for t in complete}

    record = study_file.read(study_file.path_for(tmp_path / "res", "toy"))
    assert record.n_trials == 6 and record.storage == db_url(tmp_path)
    assert {t.number: t.state for t in record.trials} == {t.number: t.state.name for t in study.trials}
    assert len(record.complete()) == 6 and all(t.recipe and t.recipe.startswith("toy-k") for t in record.complete())
    assert all("interrupted" in (t.error or "") for t in record.trials if t.state == "FAIL")
    assert [o.name for o in record.objectives] == ["loss", "distance"]
    assert (record.engine, record.model, record.space) == ("toy-engine", "toy-model", "toy")


def test_a_failing_trial_is_recorded_the_search_goes_on_and_a_rerun_of_the_finished_study_runs_nothing(tmp_path):
    out = run(toy(tmp_path, "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1", "fail_trials=[1]"), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    record = study_file.read(study_file.path_for(tmp_path / "res", "toy"))
    states = {t.number: t.state for t in record.trials}
    assert states == {0: "COMPLETE", 1: "FAIL", 2: "COMPLETE"}
    failed = record.trials[1]
    assert failed.error == "toy trial 1 fails on purpose; drop it from fail_trials" and failed.values is None
    logs = out.stdout + out.stderr
    assert "trial 2/3 done (#1 FAIL)" in logs and "trial 3/3 done (#2 COMPLETE)" in logs
    assert Counter((tmp_path / "ledger.txt").read_text().split()) == Counter(["0", "2"])

    shutil.rmtree(tmp_path / "sweep")  # a later rerun has a new sweep folder, which no job creates
    again = run(toy(tmp_path, "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1", "fail_trials=[1]"), tmp_path)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert "3 of 3 trial(s) finished, 0 to run" in again.stdout + again.stderr
    assert Counter((tmp_path / "ledger.txt").read_text().split()) == Counter(["0", "2"])  # nothing ran again


def test_a_trial_killed_from_outside_runs_again_once_on_the_next_run(tmp_path):
    """A trial whose job was ended from outside (here kill -9 under the
    submitit launcher; on Slurm the time limit, scancel, preemption) was FAIL
    for good, as a trial whose config fails, and its error read "the job
    returned nothing". Now the next run retries it first, once."""
    def search(*overrides: str) -> subprocess.CompletedProcess:
        out = run(toy(tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1", "sleep_s=0",
                      "hydra/launcher=local_submitit", *overrides), tmp_path)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
        shutil.rmtree(tmp_path / "sweep")   # each rerun has a new sweep folder
        return out

    def trials() -> dict:
        return {t.number: t for t in study_file.read(study_file.path_for(tmp_path / "res", "toy")).trials}

    search("kill_trials=[0,1]")
    first = trials()
    assert {n: t.state for n, t in first.items()} == {0: "FAIL", 1: "FAIL"}
    assert all(t.error.startswith("killed: the job's process ended without a result") for t in first.values())

    again = search("kill_trials=[3]")   # trial 1's retry is killed too
    assert ("resumed with 0 of 2 trial(s) finished, 2 to run; trial(s) 0, 1, ended from outside "
            "(time limit, cancelled, killed), run again first") in again.stdout + again.stderr
    second = trials()
    assert {n: t.state for n, t in second.items()} == {0: "FAIL", 1: "FAIL", 2: "COMPLETE", 3: "FAIL"}
    assert (second[2].params, second[3].params) == (first[0].params, first[1].params)

    last = search()   # a retry ended from outside again counts as failed
    assert "2 of 2 trial(s) finished, 0 to run" in last.stdout + last.stderr
    assert ledger(tmp_path) == Counter([2])


def test_the_errors_of_a_job_ended_from_outside_are_the_launchers_own_but_out_of_memory_and_a_failed_exit():
    """The sweeper tells them by how the launchers begin them: a new or
    reworded one would be FAIL for good again, unnoticed."""
    from evaluate.search.sweeper import ENDED_FROM_OUTSIDE
    from hydra_plugins.quantbench_launchers import local, slurm
    from quantize.common import jobs
    own = {"OUT_OF_MEMORY", "FAILED"}   # the trial's: it asked for more memory, or its job failed
    outside = [m for k, m in slurm.ENDED_BY_SLURM.items() if k not in own] + [local.TIME_LIMIT, local.KILLED,
                                                                               jobs.TIME_LIMIT]
    assert all(m.startswith(ENDED_FROM_OUTSIDE) for m in outside)
    assert not any(slurm.ENDED_BY_SLURM[k].startswith(ENDED_FROM_OUTSIDE) for k in own)


def test_a_storage_url_given_on_the_command_line_shows_its_password_nowhere(tmp_path):
    """`storage=` is a task override, so the plugin made it a fixed param:
    each trial's user attr (optuna-dashboard shows them) and each job's
    overrides (the console, .hydra/overrides.yaml, config.yaml, FAILED.json)."""
    password = "FAKEPW-4d1f"
    url = f"mysql+pymysql://optuna:{password}@127.0.0.1:9/optuna"   # the toy's sweeper keeps its own SQLite
    out = run(toy(tmp_path, f"+storage='{url}'", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1",
                  "fail_trials=[1]"), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert list(tmp_path.glob("sweep/*/.hydra/overrides.yaml")) and list(tmp_path.glob("sweep/*/FAILED.json"))
    assert password not in out.stdout + out.stderr
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and password.encode() in p.read_bytes()]
    assert not leaks   # study.db holds the user attrs
    study = optuna.load_study(study_name="toy", storage=db_url(tmp_path))
    assert all(not any("storage" in key for key in t.user_attrs) for t in study.trials)

    # hydra.sweeper.storage= (SQLite takes no password: the file's name stands for one) stays out of the jobs'
    # .hydra/hydra.yaml, where Hydra saves its hydra overrides
    marked = f"sqlite:///{tmp_path / 'res' / 'search' / 'toy' / password}.db"
    shutil.rmtree(tmp_path / "sweep")
    out = run(toy(tmp_path, f"hydra.sweeper.storage={marked}", "hydra.sweeper.n_trials=1"), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert list(tmp_path.glob("sweep/*/.hydra/hydra.yaml"))
    assert not [p for p in (tmp_path / "sweep").rglob("*") if p.is_file() and password.encode() in p.read_bytes()]


@pytest.mark.parametrize("change", ["search.objectives.1.scenario=other", "search.objectives.1.name=gap"])
def test_a_study_resumed_with_other_objectives_stops_with_one_line(tmp_path, change):
    """The study's name does not say the scenario: a rerun at another one
    would mix its values with the first run's, labelled as the new ones."""
    first = run(toy(tmp_path, "hydra.sweeper.n_trials=1", "hydra.sweeper.n_jobs=1"), tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run(toy(tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1", change), tmp_path)
    line = one_error_line(again)
    assert "study toy in sqlite:///" in line and "measured loss (minimize), distance (minimize at toy)" in line
    assert "use study=<new name>" in line
    assert ledger(tmp_path) == Counter([0])   # no trial ran on the mixed study
    same = run(toy(tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1"), tmp_path)
    assert same.returncode == 0 and ledger(tmp_path) == Counter([0, 1]), same.stderr[-3000:]


def test_a_study_resumed_with_other_choices_of_a_param_stops_with_one_line(tmp_path):
    """Optuna raised "CategoricalDistribution does not support dynamic value
    space" mid-sweep and left the new trial RUNNING."""
    first = run(toy(tmp_path, "hydra.sweeper.n_trials=1", "hydra.sweeper.n_jobs=1"), tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run(toy(tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1", "k=choice(0,1,5)"), tmp_path)
    line = one_error_line(again)
    assert "study toy in sqlite:///" in line and "was searched with k in [0, 1, 2]; use study=<new name>" in line
    study = optuna.load_study(study_name="toy", storage=db_url(tmp_path))
    assert [t.state.name for t in study.trials] == ["COMPLETE"]   # no trial asked, none left RUNNING
    fixed = run(toy(tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1", "k=1"), tmp_path)
    assert fixed.returncode == 0 and ledger(tmp_path) == Counter([0, 1]), fixed.stderr[-3000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bad_input(case: str, tmp_path: Path, port: int) -> tuple[list[str], list[str]]:
    """A case's overrides, and what its one error line must say."""
    mariadb = f"mysql+pymysql://optuna:s3cret@127.0.0.1:{port}/optuna"
    return {
        "unreachable MariaDB": (
            [f"hydra.sweeper.storage='{mariadb}'"],
            [f"cannot open the study storage {mariadb.replace('s3cret', '***')}", "Can't connect",
             "scripts/slurm_local.sh start"]),
        "unwritable folder": (
            [f"results_dir={tmp_path / 'a-file' / 'res'}"],
            ["cannot create the folder of the study storage sqlite:///", "a-file",
             "set results_dir or hydra.sweeper.storage"]),
        "not a URL": (
            ["hydra.sweeper.storage=nonsense"],
            ["hydra.sweeper.storage=nonsense is not a database URL", "sqlite:///<file>"]),
        "directions": (
            ["hydra.sweeper.direction=[maximize,minimize]"],
            ["search.objectives (loss: minimize, distance: minimize) do not match",
             "set hydra.sweeper.direction to ['minimize', 'minimize']"]),
        "stored directions": (
            [],
            [f"study toy in {db_url(tmp_path)} optimizes ['maximize', 'minimize'], this search "
             "['minimize', 'minimize']; use study=<new name>"]),
        "sweeper's own study name": (  # the jobs would write under study=toy: the sweeper could not find them
            ["hydra.sweeper.study_name=fresh"],
            ["hydra.sweeper.study_name=fresh differs from study=toy, the name the trials record under",
             "pass study=fresh instead"]),
        "study name with a slash": (
            ["study=a/b"],
            ["study='a/b' is not a folder name: it becomes one folder under results_dir/search"]),
        "objective": (
            ["search.objectives=[{unit: MB}]"],
            ["search.objectives entry {'unit': 'MB'} lacks a name or direction",
             "{name: <metric>, direction: maximize|minimize, unit: <unit>}"]),
    }[case]


@pytest.mark.parametrize("case", ["unreachable MariaDB", "unwritable folder", "not a URL", "directions", "objective",
                                  "stored directions", "sweeper's own study name", "study name with a slash"])
def test_a_storage_or_setting_that_cannot_work_stops_before_any_trial_with_one_line(tmp_path, case):
    (tmp_path / "a-file").write_text("in the way\n")
    if case == "stored directions":  # a study of the same name made for other objectives
        (tmp_path / "res" / "search" / "toy").mkdir(parents=True)
        optuna.create_study(study_name="toy", storage=db_url(tmp_path), directions=["maximize", "minimize"])
    overrides, expected = bad_input(case, tmp_path, free_port())
    downloads = tmp_path / "downloads.txt"   # a hub id's weights are downloaded only after every cheap refusal
    out = run(toy(tmp_path, *overrides, "+model.path=org/tiny"), tmp_path, {"TOY_HUB_DOWNLOADS": str(downloads)})
    line = one_error_line(out)
    assert all(part in line for part in expected), line
    assert not downloads.exists()
    assert "s3cret" not in out.stdout + out.stderr
    assert not (tmp_path / "ledger.txt").exists() and not list(tmp_path.glob("sweep/*/.hydra"))
    assert not list(tmp_path.glob("res/search/*/study.json"))
    if case in ("sweeper's own study name", "study name with a slash", "directions", "objective"):
        assert not (tmp_path / "res" / "search").exists()   # refused before a storage was made


def returned(value, status=JobStatus.COMPLETED) -> JobReturn:
    ret = JobReturn(status=status)
    ret.return_value = value
    return ret


def test_a_job_that_gives_no_usable_values_has_its_reason_in_one_line():
    assert job_error(returned([1.0, 2]), 2) is None
    assert job_error(returned(3.5), 1) is None
    assert job_error(returned([1.0]), 2) == "the job returned 1 value(s) for 2 objective(s)"
    assert job_error(returned(["fast", 1.0]), 2) == "the job returned ['fast', 1.0], not 2 number(s)"
    died = returned(RuntimeError("engine died\nat line 3"), JobStatus.FAILED)
    assert job_error(died, 2) == "RuntimeError: engine died"
    assert job_error(returned(None), 2) == "the job returned nothing"


def test_progress_counts_the_study_total_and_estimates_from_this_runs_pace(monkeypatch):
    clock = iter([100.0, 160.0])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    progress = _Progress(target=10, done_before=4)  # resumed: 4 finished before this run
    line = progress.line(6, ["COMPLETE", "FAIL"], [7, 8])  # 2 trials in 60 s: 4 left take 120 s
    assert line == "trials 5-6/10 done (#7 COMPLETE, #8 FAIL), elapsed 1 min 0 s, ETA 2 min 0 s"


def test_a_sweeper_counts_as_alive_while_its_heartbeat_is_fresh_and_on_this_host_its_pid_lives():
    assert _alive({"host": "elsewhere", "pid": 1, "heartbeat": time.time() - 10})
    assert not _alive({"host": "elsewhere", "pid": 1, "heartbeat": time.time() - 3600})
    here = socket.gethostname()
    assert _alive({"host": here, "pid": os.getpid(), "heartbeat": time.time() - 10})
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not _alive({"host": here, "pid": dead.pid, "heartbeat": time.time() - 10})
    # killed with kill -9 a day ago, its pid since reused (here: this process): the study can be resumed
    assert not _alive({"host": here, "pid": os.getpid(), "heartbeat": time.time() - 86400})


def test_a_study_whose_dead_sweepers_pid_was_reused_is_claimed(tmp_path):
    """It refused "is being run by pid ... one sweeper per study" forever."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    # a live pid not this process's (so not taken for this sweeper's own claim)
    reused = {"host": socket.gethostname(), "pid": os.getppid(), "heartbeat": 0, "started": "2026-01-01T00:00:00+00:00"}
    study.set_user_attr("sweeper", reused)
    with _Ownership(study, url):
        assert study.user_attrs["sweeper"]["started"] != "2026-01-01T00:00:00+00:00"
    study.set_user_attr("sweeper", {**reused, "heartbeat": time.time()})   # a live sweeper's: refused
    with pytest.raises(UserError, match="one sweeper per study: wait for it, stop it, or use study=<new name>"):
        with _Ownership(study, url):
            pass


def start_time(pid: int) -> int:
    """The process's start time: /proc/<pid>/stat field 22 (after the command name in parentheses)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="start times from Linux's /proc")
def test_a_sweeper_stopped_with_ctrl_z_keeps_its_study_and_a_reused_pid_does_not(tmp_path):
    """A sweeper stopped past 2 min (no heartbeat) was taken over by a second
    one; after `fg` both ran the study, each failing the other's trials."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    stopped = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        owner = {"host": socket.gethostname(), "pid": stopped.pid, "pid_start": start_time(stopped.pid),
                 "heartbeat": time.time() - 3600, "started": "2026-01-01T00:00:00+00:00"}
        study.set_user_attr("sweeper", owner)
        with pytest.raises(UserError, match=f"is being run by pid {stopped.pid} on "):
            with _Ownership(study, url):
                pass
        assert study.user_attrs["sweeper"] == owner
        # another start time with a fresh heartbeat: a sweeper in another pid namespace of this hostname runs
        study.set_user_attr("sweeper", {**owner, "pid_start": owner["pid_start"] - 1, "heartbeat": time.time()})
        with pytest.raises(UserError, match="is being run by pid"):
            with _Ownership(study, url):
                pass
        # the pid now another process's (its start time differs), heartbeat stale: claimed
        study.set_user_attr("sweeper", {**owner, "pid_start": owner["pid_start"] - 1})
        with _Ownership(study, url):
            assert study.user_attrs["sweeper"]["pid"] == os.getpid()
            assert study.user_attrs["sweeper"]["pid_start"] == start_time(os.getpid())
    finally:
        stopped.kill()
        stopped.wait()


def test_a_study_resumed_with_another_seed_stops_with_one_line(tmp_path):
    """The study's name does not say the seed, the weights or the stages'
    overrides: a rerun with others reported the first run's front as its own."""
    first = run(toy(tmp_path, "hydra.sweeper.n_trials=1", "hydra.sweeper.n_jobs=1", "+seed=0"), tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run(toy(tmp_path, "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1", "+seed=3"), tmp_path)
    line = one_error_line(again)
    assert "study toy in sqlite:///" in line and "was searched with seed=0 (now 3); use study=<new name>" in line
    assert ledger(tmp_path) == Counter([0])   # no trial ran on the mixed study


def write_weights(folder: Path, value: float) -> Path:
    from safetensors.numpy import save_file
    import numpy as np
    folder.mkdir(parents=True)
    save_file({"w": np.full((4, 4), value, dtype=np.float32)}, str(folder / "model.safetensors"))
    return folder


def test_a_study_is_identified_by_its_weights_not_their_folder(tmp_path):
    from evaluate.search.sweeper import _check_identity, _identity

    def identity(path: Path, *overrides: str) -> dict:
        return _identity({"model.path": str(path), "seed": 0, "evaluate_overrides": list(overrides)})
    a = write_weights(tmp_path / "a" / "final", 1.0)
    moved = shutil.copytree(a, tmp_path / "moved" / "final")
    b = write_weights(tmp_path / "b" / "final", 2.0)
    assert identity(a)["model weights"] == identity(moved)["model weights"] != identity(b)["model weights"]
    assert identity(tmp_path / "not-local")["model.path"] == str(tmp_path / "not-local")   # a hub id: by its name
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    study.enqueue_trial({})   # a study from before identities were recorded resumes, and records this one
    _check_identity(study, identity(a), url)
    _check_identity(study, identity(moved), url)
    with pytest.raises(UserError, match=r"was searched with model weights=\w{12} \(now \w{12}\), "
                                        r"evaluate_overrides=\[\] \(now \['runs=1'\]\); use study=<new name>"):
        _check_identity(study, identity(b, "runs=1"), url)


def test_a_password_in_a_searchs_overrides_is_neither_stored_nor_shown_nor_a_new_search(tmp_path):
    """The identity stored quantize_overrides as typed: the password was in
    the study (optuna-dashboard shows it), in the refusal's words, and a
    changed password refused the resume."""
    from evaluate.search.sweeper import IDENTITY_ATTR, _check_identity, _identity

    def identity(uri: str, seed: int = 0) -> dict:
        return _identity({"model.path": str(tmp_path / "m"), "seed": seed,
                          "quantize_overrides": [f"tracking.uri={uri}"], "evaluate_overrides": [f"tracking.uri={uri}"]})
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    _check_identity(study, identity("postgresql://u:s3cret@h/db"), url)
    assert "s3cret" not in str(study.user_attrs)
    _check_identity(study, identity("postgresql://u:n3wpass@h/db"), url)   # the same search: resumes
    with pytest.raises(UserError) as refused:
        _check_identity(study, identity("postgresql://u:n3wpass@h/db", seed=1), url)
    assert "n3wpass" not in str(refused.value) and "seed=0 (now 1)" in str(refused.value)

    older = optuna.create_study(study_name="older", storage=url)   # recorded before passwords were redacted
    typed = ["tracking.uri=postgresql://u:s3cret@h/db"]
    older.set_user_attr(IDENTITY_ATTR, {**identity("x"), "quantize_overrides": typed, "evaluate_overrides": typed})
    _check_identity(older, identity("postgresql://u:n3wpass@h/db"), url)
    assert "s3cret" not in str(optuna.load_study(study_name="older", storage=url).user_attrs)


def test_a_study_whose_weights_appear_after_its_first_run_resumes_and_then_knows_them(tmp_path):
    """The default model's folder is made by trial 0's quantize: the study
    recorded the path, its weights' fingerprint on every rerun, and refused
    them all ("was searched with other model weights, model.path=...")."""
    from evaluate.search.sweeper import _check_identity, _identity

    def identity(path: Path) -> dict:
        return _identity({"model.path": str(path), "seed": 0})
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    cache = tmp_path / "models" / "SmolLM2-135M-Instruct"
    _check_identity(study, identity(cache), url)          # first run: the cache is empty
    write_weights(cache, 1.0)                               # its first trial downloads the weights
    _check_identity(study, identity(cache), url)          # the rerun resumes
    assert study.user_attrs["identity"]["model weights"] == identity(cache)["model weights"]
    shutil.rmtree(cache)
    _check_identity(study, identity(cache), url)          # a host that does not see them: by the path
    assert "model weights" in study.user_attrs["identity"]
    write_weights(cache, 2.0)                               # other weights under that path: refused
    with pytest.raises(UserError, match=r"was searched with model weights=\w{12} \(now \w{12}\); use study="):
        _check_identity(study, identity(cache), url)
    with pytest.raises(UserError, match=rf"was searched with model.path={cache} \(now {tmp_path}/other\); "):
        _check_identity(study, identity(tmp_path / "other"), url)   # another path nobody sees: refused


def cache_snapshot(cache: Path, repo_id: str, commit: str, value: float) -> None:
    """A Hugging Face cache holding `repo_id` at `commit`, its main branch pointing there."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    write_weights(repo / "snapshots" / commit, value)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def test_a_hub_models_study_is_identified_by_the_snapshot_its_id_resolves_to(tmp_path, monkeypatch):
    """A hub id was recorded by its name alone: a resume after the repo got
    new weights counted the old model's trials as the new one's."""
    from huggingface_hub import constants
    from evaluate.search.sweeper import _check_identity, _identity
    from quantize.common import hub
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "main_commit", lambda repo_id: None)   # the hub unreachable: the cache decides
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    _check_identity(study, _identity({"model.path": "org/tiny", "seed": 0}), url)   # not cached yet: by its id
    assert study.user_attrs["identity"] == {"model.path": "org/tiny", "seed": 0}
    cache_snapshot(tmp_path / "hub", "org/tiny", "a" * 40, 1.0)                        # its first trial downloaded it
    first = _identity({"model.path": "org/tiny", "seed": 0})
    assert first["model revision"] == "a" * 40 and "model weights" in first
    _check_identity(study, first, url)                                                  # the same model: resumes
    assert study.user_attrs["identity"] == first
    cache_snapshot(tmp_path / "hub", "org/tiny", "c" * 40, 1.0)                        # a README commit: same weights
    _check_identity(study, _identity({"model.path": "org/tiny", "seed": 0}), url)
    assert study.user_attrs["identity"]["model revision"] == "c" * 40
    cache_snapshot(tmp_path / "hub", "org/tiny", "b" * 40, 2.0)                        # the repo got new weights
    with pytest.raises(UserError, match=r"was searched with model weights=\w{12} \(now \w{12}\), "
                                        r"model revision=c{12} \(now b{12}\); use study=<new name>"):
        _check_identity(study, _identity({"model.path": "org/tiny", "seed": 0}), url)


def test_a_hub_models_study_is_identified_by_the_hubs_main_not_a_stale_cache(tmp_path, monkeypatch):
    """The identity read the sweeper host's cache while each trial's quantize
    downloads the hub's main: a stale cache recorded weights no trial used
    (a false refusal later), and a resume after the repo changed, with the
    cache not yet moved on, took the new weights' trials for the old ones'."""
    from huggingface_hub import constants
    from evaluate.search.sweeper import _check_identity, _identity
    from quantize.common import hub
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    main = {"commit": "b" * 40, "b" * 40: 2.0, "c" * 40: 3.0}   # the hub: its main, each commit's weights

    def download(repo_id, revision, patterns):   # what the hub's download leaves in the cache
        commit = revision or main["commit"]
        if not (tmp_path / "hub" / "models--org--tiny" / "snapshots" / commit).exists():
            cache_snapshot(tmp_path / "hub", repo_id, commit, main[commit])
        return str(tmp_path / "hub" / "models--org--tiny" / "snapshots" / commit)
    monkeypatch.setattr(hub, "main_commit", lambda repo_id: main["commit"])
    monkeypatch.setattr(hub, "_snapshot", download)
    cache_snapshot(tmp_path / "hub", "org/tiny", "a" * 40, 1.0)   # an old copy in this host's cache
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url)
    first = _identity({"model.path": "org/tiny", "seed": 0})
    assert first["model revision"] == "b" * 40   # what the trials quantize, not the cached a
    _check_identity(study, first, url)
    _check_identity(study, _identity({"model.path": "org/tiny", "seed": 0}), url)   # a resume: the same model
    main["commit"] = "c" * 40   # the repo got new weights; the cache still holds b
    with pytest.raises(UserError, match=r"model weights=\w{12} \(now \w{12}\), model revision=b{12} \(now c{12}\)"):
        _check_identity(study, _identity({"model.path": "org/tiny", "seed": 0}), url)
