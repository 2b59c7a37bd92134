"""quantize/common/jobs.py: the command that reruns a job."""
import os
import shlex
import signal

import pytest

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from quantize.common.config import register
from quantize.common.jobs import job_command, run_job
from quantize.common.paths import CONF_DIR


def composed_command(overrides: list[str], drop=()) -> str:
    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        HydraConfig.instance().set_config(compose("quantize", overrides=overrides, return_hydra_config=True))
        try:
            return job_command("quantize", drop=drop)
        finally:
            HydraConfig.instance().cfg = None


def test_the_command_reruns_the_job_from_its_folder_without_dropped_keys(tmp_path):
    cmd = composed_command(["recipe=w4a16_rtn", "force=true", f"artifacts_dir={tmp_path}/a b",
                            "hydra.run.dir=/tmp/x"], drop=("force",))
    cd, _, rest = cmd.partition(" && ")
    assert shlex.split(cd) == ["cd", os.getcwd()]
    assert shlex.split(rest) == ["python", "-m", "quantize", "recipe=w4a16_rtn", f"artifacts_dir={tmp_path}/a b"]


def test_a_password_in_a_uri_override_is_not_in_the_command():
    """The command goes into every manifest and result row."""
    uri = "postgresql://mlflow:S3cretPW@db.internal:5432/mlflow"
    cmd = composed_command(["recipe=w4a16_rtn", "tracking=mlflow", f"tracking.uri={uri}"])
    assert "S3cretPW" not in cmd
    assert shlex.split(cmd.partition(" && ")[2])[-1] == "tracking.uri=postgresql://mlflow:***@db.internal:5432/mlflow"


def test_a_password_in_a_sweeps_escaped_uri_override_is_not_in_the_command():
    """A sweep's job gets its overrides from Hydra escaped (`postgresql\\://mlflow\\:<password>@...`):
    every manifest and row of a multirun recorded the password."""
    uri = r"postgresql\://mlflow\:S3cretPW@db.internal\:5432/mlflow"
    cmd = composed_command(["recipe=w4a16_rtn", "tracking=mlflow", f"tracking.uri={uri}"])
    assert "S3cretPW" not in cmd
    shown = r"tracking.uri=postgresql\://mlflow\:***@db.internal\:5432/mlflow"
    assert shlex.split(cmd.partition(" && ")[2])[-1] == shown


def test_outside_a_hydra_job_there_is_no_command():
    assert job_command("quantize") is None


@pytest.mark.parametrize("stage, overrides", [("quantize", ["recipe=original"]), ("evaluate", ["recipe=original"]),
                                               ("sensitivity", ["recipe=w4a16_gptq"]), ("propose", ["recipe=w4a16_gptq"]),
                                               ("search", [])])
def test_sweeps_started_in_one_second_get_a_sweep_dir_each(stage, overrides):
    """FailureSummary lists the FAILED.json files of its sweep dir: two sweeps
    started in the same second must not share one, or each reports the
    other's failures."""
    register()
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        dirs = [str(compose(stage, overrides=overrides, return_hydra_config=True).hydra.sweep.dir)
                for _ in range(2)]
    assert dirs[0] != dirs[1] and dirs[0].startswith(f"logs/{stage}-multirun/")


@pytest.fixture
def keep_sigterm():
    """run_job installs its SIGTERM handler (main thread): not for the test process."""
    handler = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, handler)


def test_a_jobs_offline_default_ends_with_it_so_a_later_hub_job_of_the_sweep_is_online(monkeypatch, keep_sigterm):
    """In one process (an in-process sweep, a reused worker), a job that needs
    no hub must not leave HF_HUB_OFFLINE=1 behind, in os.environ or in the hub
    library that read it, for a later job that downloads."""
    from huggingface_hub import constants
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    seen = []
    for needs_hub in (False, True):
        run_job(lambda cfg: seen.append((os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE)), None,
                needs_hub=needs_hub)
    assert seen == [("1", True), (None, False)]
    assert "HF_HUB_OFFLINE" not in os.environ


def test_offline_the_user_chose_stays_for_every_job(monkeypatch, keep_sigterm):
    from huggingface_hub import constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    seen = []
    run_job(lambda cfg: seen.append((os.environ["HF_HUB_OFFLINE"], constants.HF_HUB_OFFLINE)), None)
    assert seen == [("0", False)] and os.environ["HF_HUB_OFFLINE"] == "0"
