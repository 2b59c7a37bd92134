"""A password typed on the command line of a run or a sweep: in none of
Hydra's lines (the jobs it lists, a job's error), the job's log, the
.hydra/ files, multirun.yaml or FAILED.json; the job still gets it."""
import subprocess
import sys

import pytest

from tests.conftest import quantize_env
from tests.sweep_app import write_sweep_app

APP = '''
import logging

import hydra

from quantize.common.jobs import run_command, run_job

log = logging.getLogger("quantbench")


def work(cfg):
    log.info("connecting to %s and %s", cfg.uri, list(cfg.more))
    print("job got", cfg.uri)
    if cfg.action == "fail":
        raise RuntimeError(f"cannot reach {cfg.uri}")


@hydra.main(version_base=None, config_path=".", config_name="app")
def main(cfg):
    if cfg.action == "raise":   # a failure before run_job: Hydra prints the job's overrides
        raise RuntimeError("the entry failed")
    return run_job(work, cfg)


if __name__ == "__main__":
    run_command(main, "app", "app")
'''
PASSWORD = "S3cr,et PW"   # Hydra escapes the `,` and the space in a sweep's jobs' overrides
OTHER = "Other-PW-2"


def run(tmp_path, *args):
    write_sweep_app(tmp_path, APP, first_line="uri: none\nmore: []\naction: ok", subdir="${hydra.job.num}")
    return subprocess.run([sys.executable, "app.py", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=quantize_env(),
                          capture_output=True, text=True, timeout=120)


def leaks(tmp_path, out) -> list[str]:
    found = [str(p) for p in tmp_path.rglob("*") if p.is_file() and p.name != "app.py"
             and any(word.encode() in p.read_bytes() for word in ("S3cr", OTHER))]
    printed = [line for line in (out.stdout + out.stderr).splitlines()
               if ("S3cr" in line or OTHER in line) and not line.startswith("job got")]
    return found + printed


@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=local_parallel"]])
def test_a_password_in_a_sweeps_overrides_is_in_no_line_and_no_file(tmp_path, launcher):
    """Hydra listed each job as `#0 : uri=http\\://u\\:<password>@h1`, and wrote the
    password into each job's .hydra/ files and the sweep's multirun.yaml. A job
    run in another process (local_parallel) knows it from its own overrides."""
    out = run(tmp_path, "-m", *launcher, f"uri='http://u:{PASSWORD}@h1:5000',sqlite:///a.db", "action=ok,fail",
              f"more=[http://u:{OTHER}@h2]")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "[HYDRA] \t#3 : uri=sqlite\\:///a.db action=fail" in out.stdout, out.stdout
    assert "\t#0 : uri='http://u:***@h1:5000' action=ok more=[http\\://u\\:***@h2]" in out.stdout, out.stdout
    assert out.stdout.count(f"job got http://u:{PASSWORD}@h1:5000") == 2   # the job has the real one
    assert list(tmp_path.glob("sweep/*/.hydra/overrides.yaml")) and (tmp_path / "sweep" / "multirun.yaml").is_file()
    assert (tmp_path / "sweep" / "1" / "FAILED.json").is_file()
    assert "connecting to http://u:***@h1:5000" in (tmp_path / "sweep" / "0" / "app.log").read_text()
    assert not leaks(tmp_path, out)


def test_a_password_in_a_single_runs_overrides_is_in_no_file(tmp_path):
    out = run(tmp_path, f"uri=http://u:{OTHER}@h1:5000")
    assert out.returncode == 0, out.stderr[-3000:]
    saved = (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    assert saved == "uri: http://u:***@h1:5000\nmore: []\naction: ok\n"
    assert not leaks(tmp_path, out)


def test_a_password_in_the_overrides_of_a_job_that_raised_past_run_job_is_not_printed(tmp_path):
    """Hydra printed `Error executing job with overrides: ['uri=http\\\\://u\\\\:<password>@h1']`."""
    out = run(tmp_path, "-m", f"uri=http://u:{OTHER}@h1", "action=raise")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Error executing job with overrides: ['uri=http\\\\://u\\\\:***@h1', 'action=raise']" in out.stderr
    assert not leaks(tmp_path, out)


def test_a_password_with_an_escaped_quote_is_in_no_line_and_no_file(tmp_path):
    """Typed as Hydra's grammar asks (`'...S3cr\\'et...'`), the password Hydra reads
    (S3cr'et) is not the text typed: it stayed in Hydra's lines, .hydra/ and multirun.yaml."""
    out = run(tmp_path, "-m", r"uri='http://u:S3cr\'et@h1'", "action=ok,fail")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "\t#0 : uri='http://u:***@h1' action=ok" in out.stdout, out.stdout
    assert out.stdout.count("job got http://u:S3cr'et@h1") == 2   # the job has the real one
    assert (tmp_path / "sweep" / "multirun.yaml").is_file() and (tmp_path / "sweep" / "1" / "FAILED.json").is_file()
    assert not leaks(tmp_path, out)
