"""quantize/common/jobs.py: the command that reruns a job."""
import os
import shlex

import pytest

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from quantize.common.config import register
from quantize.common.jobs import job_command
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
