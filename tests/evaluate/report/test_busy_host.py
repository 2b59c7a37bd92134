"""Runs measured on a busy host are marked in *Detailed runs* and counted
beside the answer, at the one threshold conf/report.yaml's busy_host_pct
sets; beside the answer too, which of its groups met runs=auto's target,
and the engine's note on how it served a format its speed rests on."""
from evaluate.report import build_report
from evaluate.report.__main__ import main
from evaluate.report.markdown import OTHER_CPU_HEADER

from .rows import heading, main_rows, md_tables, store

BUSY = {"load_avg_1m_start": 3.1, "load_avg_1m_end": 3.4, "other_cpu_s": 3.0, "wall_s": 5.0, "cores": 2}   # 30 %
QUIET = {"load_avg_1m_start": 0.4, "load_avg_1m_end": 0.5, "other_cpu_s": 0.2, "wall_s": 5.0, "cores": 2}  # 2 %


def loaded_rows() -> list:
    """The report fixture's rows with host load: two of w8a8_smooth_ptq's three
    interactive runs busy, every other run quiet."""
    def load(r):
        busy = r.recipe == "w8a8_smooth_ptq" and r.scenario == "interactive" and r.run_index in (0, 1)
        return r.but(host_load=BUSY if busy else QUIET) if r.kind == "speed" and r.ok else r
    return [load(r) for r in main_rows()]


def report_md(tmp_path, rows, *overrides: str) -> str:
    store(tmp_path / "res", rows)
    assert main([f"results_dir={tmp_path / 'res'}", f"out_dir={tmp_path / 'out'}", "output=[markdown]",
                 *overrides]) == 0
    return (tmp_path / "out" / "report.md").read_text()


def answer(md: str) -> str:
    return md.split("## What to use on this machine\n", 1)[1].split("\n## ", 1)[0]


def test_busy_runs_are_marked_in_the_runs_and_counted_beside_the_answer(tmp_path):
    md = report_md(tmp_path, loaded_rows())
    runs = md_tables(md, "Detailed runs")[heading("interactive")]
    cells = {(r["Recipe"], r["Run"]): r[OTHER_CPU_HEADER] for r in runs}
    assert sorted(cells.values()).count("30.0 ⚠ busy host") == 2 and "2.0" in cells.values()
    said = answer(md)
    assert ("- interactive, SmolLM2-135M-Instruct: ⚠ busy host: 2 of 3 runs of w8a8_smooth_ptq ran while other "
            "processes took more than 10 % of the host's CPU time") in said
    assert "- medium_batch, SmolLM2-135M-Instruct: ⚠" not in said  # every run there was quiet
    assert "more than 10 % of the host's CPU time while it ran (`busy_host_pct=`" in md  # Method states the rule


def test_the_threshold_is_the_one_setting_busy_host_pct(tmp_path):
    md = report_md(tmp_path, loaded_rows(), "busy_host_pct=50")
    runs = md_tables(md, "Detailed runs")[heading("interactive")]
    assert {r[OTHER_CPU_HEADER] for r in runs} == {"30.0", "2.0"}
    assert "⚠ busy host" not in answer(md)
    assert "more than 50 % of the host's CPU time" in md


def test_a_threshold_that_is_not_a_share_is_one_line(tmp_path, capsys):
    store(tmp_path / "res", loaded_rows())
    assert main([f"results_dir={tmp_path / 'res'}", f"out_dir={tmp_path / 'out'}", "busy_host_pct=200"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: busy_host_pct=200 is not a share of the host's CPU time in %; pass a number from 0 to 100, "
        "e.g. busy_host_pct=10"]
    assert not (tmp_path / "out").exists()


def auto(runs: int, stopped: str | None, ci: float) -> dict:
    return {"rule": "auto", "runs": runs, "min_runs": 3, "max_runs": 3, "target_ci_pct": 5.0,
            "achieved_ci_pct": ci, "stopped": stopped}


def test_the_answer_says_which_of_its_groups_met_the_runs_auto_target(tmp_path):
    def decided(r):
        if r.kind != "speed" or not r.ok or r.scenario != "interactive":
            return r
        last = r.run_index == 2
        if r.recipe == "original":
            return r.but(precision=auto(r.run_index + 1, "max_runs reached" if last else None, 6.4))
        return r.but(precision=auto(r.run_index + 1, "target met" if last else None, 2.5))
    store(tmp_path / "res", [decided(r) for r in main_rows()])
    build_report(tmp_path / "res", tmp_path / "out", "t", outputs=("markdown",))
    said = answer((tmp_path / "out" / "report.md").read_text())
    assert ("- interactive, SmolLM2-135M-Instruct: runs=auto's target (95% interval within ±5.0 % of the mean) met "
            "by w8a8_smooth_ptq; not met by original (±6.4 % at the cap, 3 runs)") in said
    assert "- medium_batch, SmolLM2-135M-Instruct: runs=auto" not in said  # fixed run counts there: no target to meet


def test_a_store_without_host_load_or_run_decisions_reads_as_before(tmp_path):
    store(tmp_path / "res", main_rows())
    build_report(tmp_path / "res", tmp_path / "out", "t", outputs=("markdown",))
    md = (tmp_path / "out" / "report.md").read_text()
    assert OTHER_CPU_HEADER not in md and "What these speeds rest on" not in md


HF_NOTE = "weights decompressed to dense: its speed and memory are the dense model's, not the format's kernels'"


def test_the_answer_says_which_of_its_entries_an_engine_served_with_a_note(tmp_path):
    """hf's speed of a quantized checkpoint is the dense model's: an answer
    resting on such rows says so, naming the entries; the original (no note)
    and the scenarios where no entry had one say nothing."""
    def noted(r):
        served = r.recipe != "original" and r.scenario == "interactive"
        return r.but(serving_note=HF_NOTE) if served else r
    md = report_md(tmp_path, [noted(r) for r in main_rows()])
    said = answer(md)
    lines = [line for line in said.splitlines() if "with a note" in line]
    assert len(lines) == 1 and lines[0].startswith("- interactive, SmolLM2-135M-Instruct: ")
    engine = main_rows()[0].engine
    served = lines[0].split(": ", 1)[1].split(f" served by {engine} with a note: ")
    assert served[1] == HF_NOTE and "original" not in served[0].split(", ") and served[0]


def test_a_row_keeps_its_serving_note_through_the_store(tmp_path):
    from evaluate import results
    row = main_rows()[0].but(serving_note=HF_NOTE)
    results.append(results.shard_path(tmp_path), row)
    assert [r.serving_note for r in results.read(tmp_path)] == [HF_NOTE]
    assert "serving_note" not in main_rows()[0].to_dict()   # no note: not written
