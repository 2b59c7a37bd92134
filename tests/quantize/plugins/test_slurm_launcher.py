"""The Slurm launcher's time-limit warning: sent in time to be answered, and
recognised when it stopped a job before quantbench's handler could; the
request checked against the partition's time limits."""
import os

import pytest
from hydra_plugins.quantbench_launchers.slurm import check_request, stopped_by_warning, warn_in_time


def test_a_warning_as_long_as_the_limit_comes_at_half_the_limit_instead():
    asked = {"timeout_min": 1, "signal_delay_s": 120, "partition": "debug"}
    assert warn_in_time(asked) == {"timeout_min": 1, "signal_delay_s": 30, "partition": "debug"}
    assert asked["signal_delay_s"] == 120  # the preset's values are not changed in place
    assert warn_in_time({"timeout_min": 2, "signal_delay_s": 120})["signal_delay_s"] == 60


def test_a_warning_shorter_than_the_limit_is_kept():
    for params in ({"timeout_min": 60, "signal_delay_s": 120}, {"timeout_min": 0, "signal_delay_s": 120}):
        assert warn_in_time(params) == params


def fake_sacct(tmp_path, monkeypatch, exit_codes: str) -> None:
    sacct = tmp_path / "sacct"
    sacct.write_text(f"#!/bin/sh\nprintf '{exit_codes}'\n")
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_a_step_ended_by_the_warning_signal_is_a_time_limit(tmp_path, monkeypatch):
    # sacct -o ExitCode is <exit code>:<signal>; srun's step killed by SIGUSR2 (12) before Python started.
    fake_sacct(tmp_path, monkeypatch, "12:0\\n12:0\\n0:12\\n")
    assert stopped_by_warning("7", RuntimeError("Slurm job 7 ended FAILED without a result"))


def test_other_failures_are_not_a_time_limit(tmp_path, monkeypatch):
    fake_sacct(tmp_path, monkeypatch, "1:0\\n1:0\\n12:0\\n")
    assert not stopped_by_warning("7", RuntimeError("Slurm job 7 ended FAILED without a result"))


def test_submitit_raising_on_the_warning_is_a_time_limit(tmp_path, monkeypatch):
    fake_sacct(tmp_path, monkeypatch, "1:0\\n")
    error = RuntimeError("submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out too many times.")
    assert stopped_by_warning("7", error)


def fake_sinfo(tmp_path, monkeypatch, lines: str) -> None:
    """sinfo -h -N -o %P|%c|%m|%G|%l answering `lines`; sbatch only has to exist."""
    for name, body in (("sinfo", f"printf '{lines}'"), ("sbatch", "exit 0")):
        tool = tmp_path / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_a_partition_without_a_time_limit_takes_any_timeout(tmp_path, monkeypatch):
    fake_sinfo(tmp_path, monkeypatch, "debug*|2|4000|(null)|infinite\\ndebug*|2|4000|(null)|infinite\\n")
    check_request({"partition": "debug", "cpus_per_task": 1, "mem_gb": 1, "timeout_min": 10_000})
    fake_sinfo(tmp_path, monkeypatch, "debug*|2|4000|(null)|30:00\\ndebug*|2|4000|(null)|UNLIMITED\\n")
    check_request({"timeout_min": 10_000})  # one node has no limit: the job can run there


def test_a_timeout_over_every_nodes_limit_is_refused(tmp_path, monkeypatch, capsys):
    fake_sinfo(tmp_path, monkeypatch, "debug*|2|4000|(null)|30:00\\ndebug*|2|4000|(null)|1:00:00\\n")
    with pytest.raises(SystemExit) as e:
        check_request({"partition": "debug", "timeout_min": 61})
    assert e.value.code == 2
    assert "set hydra.launcher.timeout_min=60 or less" in capsys.readouterr().err


def run_setup_lines(preset: str, root, monkeypatch, last_line: str, env: dict) -> "subprocess.CompletedProcess":
    """The preset's setup lines, as a job runs them in bash before Python, for
    a project at `root` (a .venv there), then `last_line`."""
    import subprocess

    from omegaconf import OmegaConf

    from quantize.common import resolvers
    from quantize.common.paths import CONF_DIR
    monkeypatch.setattr(resolvers, "PROJECT_ROOT", root)
    resolvers.register_resolvers()
    setup = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hydra" / "launcher" / f"{preset}.yaml").setup,
                                   resolve=True)
    return subprocess.run(["bash", "-c", "\n".join([*setup, last_line])], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("preset", ["slurm_cpu", "slurm_gpu"])
def test_the_setup_lines_work_in_a_project_path_with_a_space(tmp_path, monkeypatch, preset):
    """Each job runs the preset's setup lines in bash before Python: in a
    checkout at /home/a b/quantbench they must still activate its venv and
    put it on PYTHONPATH."""
    root = tmp_path / "a b" / "quantbench"
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "activate").write_text("ACTIVATED=yes\n")
    out = run_setup_lines(preset, root, monkeypatch, 'printf "%s\\n%s" "$ACTIVATED" "$PYTHONPATH"',
                          {"PYTHONPATH": "/x"})
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.splitlines() == ["yes", f"{root}:/x"]


@pytest.mark.parametrize("preset", ["slurm_cpu", "slurm_gpu"])
def test_jobs_that_download_from_the_hub_stay_online(tmp_path, monkeypatch, preset):
    """A setup line exporting HF_HUB_OFFLINE=1 reads, in the job, as the user's
    value, which run_job keeps: hub calibration sets, a model=<hub id> and
    lm-eval hub tasks would fail on Slurm only. run_job sets it per job."""
    from quantize.common.jobs import offline_unless_set
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "activate").write_text("")
    out = run_setup_lines(preset, tmp_path, monkeypatch, 'printf "%s" "${HF_HUB_OFFLINE-unset}"', {})
    job_env = {} if out.stdout == "unset" else {"HF_HUB_OFFLINE": out.stdout}
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for key, value in job_env.items():
        monkeypatch.setenv(key, value)
    with offline_unless_set(False):  # a job with needs_hub=True
        assert "HF_HUB_OFFLINE" not in os.environ
