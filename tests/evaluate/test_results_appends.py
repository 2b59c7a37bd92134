"""Appends that cannot glue rows: a results.jsonl whose last line lacks its
newline (a writer killed mid-write, a hand edit) gets the next row on a line
of its own; a torn last line is moved aside with one WARNING, and the report
names what it left out by file and line."""
import json
import subprocess
import sys

from evaluate import results
from tests.conftest import quantize_env, run_cli
from tests.evaluate.pipeline_fixtures import scen  # noqa: F401  (fixture)
from tests.evaluate.report.test_main_cli import report_cli
from tests.evaluate.test_results import full_row

TORN = '{"kind": "speed", "status": "ok", "metr'


def test_a_torn_tail_is_moved_aside_and_the_report_names_the_lines_left_out(tiny_model, tmp_path, scen):
    res = tmp_path / "res"
    res.mkdir()
    store = res / results.RESULTS_FILE
    store.write_text(json.dumps(full_row().to_dict()) + "\nnot json at all\n" + TORN)
    proc = run_cli("evaluate", f"model={tiny_model}", "engine=hf", scen["test_tiny_a"], "runs=1",
                   "accuracy=none", f"results_dir={res}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (aside,) = res.glob("results.jsonl.torn-*")
    assert aside.read_text() == TORN
    warned = [line for line in (proc.stdout + proc.stderr).splitlines() if "was torn" in line]
    assert len(warned) == 1 and "WARNING" in warned[0] and "line 3" in warned[0] and str(aside) in warned[0]
    lines = store.read_text().splitlines()
    assert store.read_text().endswith("\n") and len(lines) == 3 and json.loads(lines[2])["status"] == "ok"
    assert [r.status for r in results.read(res)] == ["ok", "ok"]

    report = report_cli(tmp_path, f"results_dir={res}", f"out_dir={tmp_path / 'out'}", "output=[markdown]")
    assert report.returncode == 0, report.stderr
    section = (tmp_path / "out" / "report.md").read_text().split("## Rejected rows\n", 1)[1].split("\n## ")[0]
    assert "1 line(s) that are not rows" in section
    assert f"| `{store}` | 2 | — | not JSON" in section
    assert f"moved aside before an append: `{aside}`" in section


def test_a_whole_row_without_its_newline_keeps_both_rows(tmp_path):
    store = tmp_path / results.RESULTS_FILE
    store.write_text(json.dumps(full_row().to_dict()))  # no "\n"
    results.append(store, full_row(run_index=1))
    assert [r.run_index for r in results.read(tmp_path)] == [0, 1]
    assert not list(tmp_path.glob("*.torn-*"))


APPENDER = """
import sys
from pathlib import Path
from evaluate import results
from tests.evaluate.test_results import full_row
for i in range(int(sys.argv[3])):
    results.append(Path(sys.argv[1]), full_row(run_index=int(sys.argv[2]) * 1000 + i))
"""


def test_concurrent_appends_after_a_torn_tail_lose_no_row(tmp_path):
    """Four processes append at once onto a torn tail: it is moved aside once,
    and every row they wrote reads back."""
    store = tmp_path / results.RESULTS_FILE
    store.write_text(json.dumps(full_row().to_dict()) + "\n" + TORN)
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(store), str(w), "40"], env=quantize_env(),
                                stderr=subprocess.PIPE, text=True) for w in range(4)]
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert [w.returncode for w in writers] == [0] * 4, errors
    assert sum(e.count("was torn") for e in errors) == 1
    read = results.read_store(tmp_path)
    assert not read.refused and len(read.set_aside) == 1
    assert sorted(r.run_index for r in read.rows) == [0] + [w * 1000 + i for w in range(4) for i in range(40)]


SHORT_WRITE = """
import errno, resource, signal, sys
from pathlib import Path
from evaluate import results
from tests.evaluate.test_results import full_row
store = Path(sys.argv[1])
results.append(store, full_row(run_index=0))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # past the limit: a short write, as a disk that fills gives
resource.setrlimit(resource.RLIMIT_FSIZE, (store.stat().st_size + 60, resource.RLIM_INFINITY))
try:
    results.append(store, full_row(run_index=1))
except OSError as e:
    print("refused", e.errno == errno.ENOSPC, e)
"""


def test_a_line_the_disk_takes_only_part_of_is_refused_and_cut_away(tmp_path):
    """os.write returned fewer bytes without an error: the append 'succeeded',
    the tracker got the row and the store a torn line."""
    store = tmp_path / results.RESULTS_FILE
    proc = subprocess.run([sys.executable, "-c", SHORT_WRITE, str(store)], capture_output=True, text=True,
                          env=quantize_env(), timeout=120)
    assert proc.stdout.startswith("refused True") and "of the line's" in proc.stdout, proc.stdout + proc.stderr
    assert [r.run_index for r in results.read(tmp_path)] == [0]
    results.append(store, full_row(run_index=2))
    assert [r.run_index for r in results.read(tmp_path)] == [0, 2] and not list(tmp_path.glob("*.torn-*"))
