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
