"""report.md's first section, "What to use on this machine"
(evaluate/analysis/choice.py, evaluate/report/answer_markdown.py)."""
from evaluate.analysis.choice import choose
from evaluate.analysis.groups import add_speedups, aggregate
from evaluate.report.__main__ import main

from .rows import base_row, heading, main_rows, speed_run, store

ANSWER = "What to use on this machine"


def answer_table(md: str) -> dict[str, dict]:
    body = md.split(f"## {ANSWER}\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("| ").split(" | ")] for line in body.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    return {r[0]: dict(zip(rows[0], r)) for r in rows[1:]}


def choices(rows, floor=95.0):
    speed = aggregate(rows)
    add_speedups(speed)
    return {c.scenario.name: c for c in choose(speed, aggregate(rows, "accuracy"), floor)}


def test_the_report_opens_with_the_answer(tmp_path):
    store(tmp_path / "results", main_rows())
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}", "output=[markdown]"]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == f"## {ANSWER}" and sections[-1] == "## Method and setups"
    row = answer_table(md)[heading("interactive")]
    assert row["Use"] == "**w8a8_smooth_ptq**" and row["Accuracy recovery (%, 95% CI)"] == "97.0"
    assert row["Speed-up vs original (x, 95% CI)"].startswith("1.27x (") and row["Model size (MB)"] == "172.4"
    assert row["Runner-up"].startswith("original: ")
    # w4a16_gptq is slower here, so it is not named as left out
    assert "w4a16_gptq is faster" not in md


def test_a_faster_artifact_without_accuracy_or_below_the_floor_is_named_not_chosen():
    fast = [speed_run("w4a16_gptq", "interactive", i).but(metrics={"output_throughput": 50.0 + i}) for i in range(3)]
    rows = [r for r in main_rows() if r.recipe != "w4a16_gptq"] + fast
    c = choices(rows)["interactive"]
    assert c.pick.group.recipe == "w8a8_smooth_ptq" and [g.recipe for g in c.unmeasured] == ["w4a16_gptq"]
    measured = rows + [base_row("w4a16_gptq", kind="accuracy", scenario="pride_and_prejudice",
                                metrics={"recovery_pct": 91.0})]
    c = choices(measured)["interactive"]
    assert c.pick.group.recipe == "w8a8_smooth_ptq" and c.below_floor[0].recovery_pct == 91.0
    assert choices(measured, floor=90.0)["interactive"].pick.group.recipe == "w4a16_gptq"


def test_no_pick_for_want_of_the_original_and_of_accuracy_says_so(tmp_path):
    """The original's runs all failed and no accuracy was measured: the answer
    said "none meets 95 %", as if something measured had fallen short."""
    rows = [r for r in main_rows() if r.kind != "accuracy" and r.recipe != "original"]
    store(tmp_path / "results", rows)
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}", "output=[markdown]"]) == 0
    use = answer_table((tmp_path / "out" / "report.md").read_text())[heading("interactive")]["Use"]
    assert use == ("none known: the original has no ok run here and no accuracy was measured (measure the "
                   "original, or python -m evaluate accuracy=austen)")
    store(tmp_path / "measured", [r for r in main_rows() if r.recipe != "original"])  # accuracy known: a real miss
    assert main([f"results_dir={tmp_path / 'measured'}", f"out_dir={tmp_path / 'out2'}", "output=[markdown]",
                 "accuracy_floor_pct=99"]) == 0
    assert answer_table((tmp_path / "out2" / "report.md").read_text())[heading("interactive")]["Use"] == \
        "none meets 99 %"


def test_a_runner_up_within_the_interval_is_said_to_be_tied():
    close = [speed_run("original", "interactive", i).but(metrics={"output_throughput": v})
             for i, v in enumerate((30.0, 31.0, 29.0))]
    w8 = [speed_run("w8a8_smooth_ptq", "interactive", i).but(metrics={"output_throughput": v})
          for i, v in enumerate((30.5, 32.0, 29.5))]
    accuracy = [r for r in main_rows() if r.kind == "accuracy"]
    c = choices(close + w8 + accuracy)["interactive"]
    assert c.pick.group.recipe == "w8a8_smooth_ptq" and c.runner_up.group.recipe == "original" and c.tied


def test_the_floor_is_a_setting_and_a_bad_one_is_one_line(tmp_path, capsys):
    store(tmp_path / "results", main_rows())
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}", "output=[markdown]",
                 "accuracy_floor_pct=99"]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert answer_table(md)[heading("interactive")]["Use"] == "**original**"
    assert "w8a8_smooth_ptq is faster" in md and "97.0 % of the accuracy, below the floor" in md
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'bad'}",
                 "accuracy_floor_pct=high"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "accuracy_floor_pct=99" in err[0] and not (tmp_path / "bad").exists()
