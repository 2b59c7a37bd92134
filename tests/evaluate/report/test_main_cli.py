"""`python -m evaluate.report` as a Hydra command: overrides over
conf/report.yaml, --help listing the groups, layouts and output formats
added from outside conf/, nothing written but the report, and the old
spelling working with one deprecation line."""
import os
import subprocess
import sys
from pathlib import Path

from evaluate.report import MANIFEST
from evaluate.report.__main__ import main

from .rows import main_rows, store

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
LAYOUTS = ("batch_table", "context_table", "length_grid", "oneline", "summary")


def report_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "evaluate.report", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_layout_and_an_output_format_from_outside_conf(tmp_path):
    store(tmp_path / "results", main_rows())
    out = tmp_path / "out"
    proc = report_cli(tmp_path, "results_dir=results", f"out_dir={out}", "layout=[summary,greeting]",
                      "output=[markdown,row_count]", f"hydra.searchpath=[file://{HERE / 'searchpath'}]")
    assert proc.returncode == 0, proc.stderr
    rows = len(main_rows())
    assert (out / "greeting.md").read_text() == f"hi from outside conf: {rows} rows\n"
    assert (out / "rows.count").read_text() == f"{rows}\n"
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "greeting.md", "report.md", "rows.count"]
    assert proc.stdout.splitlines() == [str(out / n) for n in ("report.md", "rows.count", "greeting.md")]
    # no .hydra/, outputs/ or log file beside the results
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "results"]


def test_help_lists_the_layouts_and_output_formats():
    """Those of conf/report/ and of a folder on the search path; the keys the command takes, no others."""
    proc = report_cli(ROOT, "--help", f"hydra.searchpath=[file://{HERE / 'searchpath'}]")
    assert proc.returncode == 0, proc.stderr
    words = " ".join(proc.stdout.split())   # options wrap over lines
    assert "layout=[summary] the reports to write" in words and "output=[markdown,csv,png,html]" in words
    assert f"one of: {', '.join(sorted([*LAYOUTS, 'greeting']))}" in words
    assert "one of: csv, html, markdown, png, row_count" in words
    assert "\n  pareto_scenario=null " in proc.stdout and "\n  accuracy_floor_pct=95 " in proc.stdout
    assert "recipe" not in proc.stdout


def test_the_old_spelling_works_with_one_deprecation_line(tmp_path, capsys):
    store(tmp_path / "results", main_rows())
    old = main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'old'}", "layout=batch_table,oneline",
                "title=", "pareto_scenario="])
    err = capsys.readouterr().err.splitlines()
    assert old == 0
    assert err == [
        "warning: 'layout=batch_table,oneline' is the old spelling and stops working in the next release; "
        "write layout=[batch_table,oneline]",
        "warning: 'title=' is the old spelling and stops working in the next release; leave title= out for its "
        "default",
        "warning: 'pareto_scenario=' is the old spelling and stops working in the next release; leave "
        "pareto_scenario= out for its default"]
    new = main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'new'}", "layout=[batch_table,oneline]"])
    assert new == 0 and capsys.readouterr().err == ""
    for name in ("batch_table.md", "oneline.md"):
        assert (tmp_path / "old" / name).read_text() == (tmp_path / "new" / name).read_text()
        assert (tmp_path / "new" / name).read_text().startswith("# quantbench: quantized LLM benchmark report")


def test_a_title_with_a_comma_or_brackets_is_the_text_typed(tmp_path):
    store(tmp_path / "results", main_rows())
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}", "title=CPU, 2 cores [avx2]",
                 "layout=[oneline]"]) == 0
    assert (tmp_path / "out" / "oneline.md").read_text().startswith("# CPU, 2 cores [avx2] — ")


def test_an_override_hydra_cannot_read_is_one_line(tmp_path, capsys):
    assert main([f"out_dir={tmp_path / 'out'}", "layout=[summary"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: cannot read 'layout=[summary': no viable alternative at input '[summary' (Hydra's override grammar: "
        "quote a value with special characters, e.g. title='a [b]')"]


def test_an_unknown_output_format_is_one_line_naming_the_choices(tmp_path, capsys):
    store(tmp_path / "results", main_rows())
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}", "output=[markdown,pdf]"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: unknown output 'pdf'; output= takes one or several of csv, html, markdown, png (conf/report/output/), "
        "e.g. output=[csv,html]"]
    assert not (tmp_path / "out").exists()
