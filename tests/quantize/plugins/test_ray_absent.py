"""A machine without Ray or hydra-ray-launcher (tests/hosts/no_ray_host):
every command starts without Hydra's plugin warning, and choosing a Ray
preset is refused in one line naming the install step, before any job."""
import subprocess
import sys

import pytest

from tests.conftest import quantize_env
from tests.quantize.plugins.test_local_launcher import write_app


def run_app(folder, *args):
    return subprocess.run([sys.executable, "app.py", *args], cwd=folder, env=quantize_env(host="no_ray_host"),
                          capture_output=True, text=True, timeout=120)


def test_a_command_says_nothing_of_the_missing_ray_launcher(tmp_path):
    """Hydra imports every plugin module on every command: ray_jobs imported
    hydra-ray-launcher at its top and each command printed a 4-line warning."""
    write_app(tmp_path)
    out = run_app(tmp_path, "action=a", "hydra.run.dir=run")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Error importing" not in out.stderr and "ray_launcher" not in out.stderr, out.stderr[-3000:]
    assert (tmp_path / "run" / "done.txt").read_text() == "a"


@pytest.mark.parametrize("preset", ["ray_local", "ray_gpu"])
def test_a_ray_preset_without_ray_is_refused_in_one_line(preset, tmp_path):
    write_app(tmp_path)
    out = run_app(tmp_path, "-m", "action=a,b", f"hydra/launcher={preset}", f"hydra.sweep.dir={tmp_path}/sweep")
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines() == [
        f"error: hydra/launcher={preset} needs ray and hydra-ray-launcher, not installed here; "
        "`bash scripts/setup.sh` installs them (by hand: the ray[default] pin of requirements/common.txt, then "
        "hydra-ray-launcher from requirements/no-deps.txt with pip install --no-deps), or use "
        "hydra/launcher=local_submitit"], out.stderr[-3000:]
    assert not (tmp_path / "sweep").exists()
