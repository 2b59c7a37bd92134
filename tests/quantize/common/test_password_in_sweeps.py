"""A password typed in a sweep's URL override kept out of every line and file
the sweep writes, whatever it holds and however the job folders are named."""
import subprocess
import sys

from tests.conftest import quantize_env
from tests.quantize.common.test_hydra_password import APP
from tests.sweep_app import write_sweep_app


def sweep(tmp_path, *args, subdir="${hydra.job.num}"):
    write_sweep_app(tmp_path, APP, first_line="uri: none\nmore: []\naction: ok", subdir=subdir)
    return subprocess.run([sys.executable, "app.py", "-m", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                          cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=120)


def shown(tmp_path, out, secret: str) -> list[str]:
    """Each file, folder and printed line (but the job's own print) that shows `secret`."""
    found = [str(p) for p in tmp_path.rglob("*") if p.name != "app.py"
             and (secret in p.name or (p.is_file() and secret.encode() in p.read_bytes()))]
    return found + [line for line in (out.stdout + out.stderr).splitlines()
                    if secret in line and not line.startswith("job got")]


def test_a_query_password_with_a_quote_is_in_no_line_and_no_file(tmp_path):
    """?password=S3cr'etPW was hidden up to the quote: `password=***'etPW` in
    Hydra's lines, the log, .hydra/, multirun.yaml and FAILED.json."""
    out = sweep(tmp_path, r"uri='postgresql://h/db?password=S3cr\'etPW'", "action=ok,fail")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "\t#0 : uri='postgresql://h/db?password=***' action=ok" in out.stdout, out.stdout
    assert out.stdout.count("job got postgresql://h/db?password=S3cr'etPW") == 2   # the job has the real one
    assert (tmp_path / "sweep" / "multirun.yaml").is_file() and (tmp_path / "sweep" / "1" / "FAILED.json").is_file()
    assert "connecting to postgresql://h/db?password=***" in (tmp_path / "sweep" / "0" / "app.log").read_text()
    assert not shown(tmp_path, out, "etPW")


ERROR = ("error: hydra.sweep.subdir names each job's folder by ${hydra.job.override_dirname}, which would show the "
         "password in uri: add hydra.job.config.override_dirname.exclude_keys=[uri], or name the folders by "
         "${hydra.job.num}")


def test_job_folders_named_by_the_overrides_with_a_password_are_refused_before_any_is_made(tmp_path):
    """hydra.sweep.subdir=${hydra.job.override_dirname} named each job's folder
    `action=ok,uri=http\\:/u\\:<password>@h1`, printed again by the sweep's summary."""
    out = sweep(tmp_path, "uri=http://u:S3crPW@h1,sqlite:///a.db", "action=ok,fail",
                subdir="'${hydra.job.override_dirname}'")
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip() == ERROR
    assert not (tmp_path / "sweep").exists() and "job got" not in out.stdout
    assert not shown(tmp_path, out, "S3crPW")


def test_job_folders_named_by_the_overrides_without_the_password_key_run(tmp_path):
    out = sweep(tmp_path, "uri=http://u:S3crPW@h1", "action=ok,fail", "hydra.job.config.override_dirname.exclude_keys=[uri]",
                subdir="'${hydra.job.override_dirname}'")
    assert out.returncode == 1, out.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == ["action=fail", "action=ok", "multirun.yaml"]
    assert out.stdout.count("job got http://u:S3crPW@h1") == 2
    assert not shown(tmp_path, out, "S3crPW")


def test_a_run_folder_named_by_the_overrides_with_a_password_is_refused(tmp_path):
    write_sweep_app(tmp_path, APP, first_line="uri: none\nmore: []\naction: ok")
    out = subprocess.run([sys.executable, "app.py", "uri=http://u:S3crPW@h1",
                          f"hydra.run.dir={tmp_path / 'run'}/${{hydra.job.override_dirname}}"],
                         cwd=tmp_path, env=quantize_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().startswith("error: hydra.run.dir names each job's folder by ${hydra.job.override_dirname}")
    assert not (tmp_path / "run").exists() and not shown(tmp_path, out, "S3crPW")
