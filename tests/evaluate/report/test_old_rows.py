"""A store written before rows were typed (`"schema": 1`, no `dataset` key,
null where a dict now defaults to {}, keys left out) reports exactly as the
same rows written today."""
import csv
import json

import pytest

from evaluate import results
from evaluate.report import build_report
from evaluate.results import Row

from .rows import HARDWARE, md_tables, speed_run, store


def old_rows() -> list[dict]:
    speed = {"schema": 1, "kind": "speed", "status": "ok", "artifact_id": "aaaa1111bbbb2222", "model_name": "tiny",
             "recipe": "original", "quant_format": "dense", "model_bytes": 1_000_000, "engine": "vllm",
             "engine_args": None, "engine_env": None, "versions": None, "hardware": None, "scenario": "interactive",
             "batch_size": 1, "input_len": 16, "output_len": 8}
    rows = [speed | {"run_index": i, "timestamp": f"2026-01-0{i + 1}T00:00:00+00:00",
                     "metrics": {"output_throughput": v, "ttft_ms_mean": 50.0}} for i, v in enumerate((9.8, 10.2))]
    rows += [speed | {"recipe": "w8a8", "artifact_id": "cccc3333dddd4444", "run_index": i,
                      "metrics": {"output_throughput": v}} for i, v in enumerate((12.5, 13.5))]
    rows.append(speed | {"status": "failed", "reason": None, "recipe": None, "artifact_id": None, "metrics": None,
                         "run_index": None})
    rows.append({"schema": 1, "kind": "accuracy", "status": "ok", "artifact_id": "cccc3333dddd4444",
                 "model_name": "tiny", "recipe": "w8a8", "engine": "vllm", "engine_args": None, "scenario": None,
                 "batch_size": None, "metrics": {"perplexity": 12.5, "flag": True, "bad": float("nan")}})
    rows.append({"kind": "speed", "status": "unsupported", "reason": "no kernel", "recipe": "w4a16"})
    return rows


def report(tmp_path, name: str, write) -> dict[str, str]:
    """Every text file of the report of a store `write` fills, with the
    one line that differs between any two runs (the generation time) dropped."""
    write(tmp_path / name / "results.jsonl")
    out = tmp_path / f"{name}-report"
    build_report(tmp_path / name, out, "t")
    md = (out / "report.md").read_text().replace(str(tmp_path / name), "<store>")
    return {"report.md": "\n".join(line for line in md.splitlines() if not line.startswith("- Generated: ")),
            **{p.name: p.read_text() for p in out.glob("*.csv")}}


def test_an_old_store_reports_as_the_same_rows_written_today(tmp_path):
    def write_old(path):
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in old_rows()))

    def write_today(path):
        for r in old_rows():
            results.append(path, Row.from_dict(r))
    old, today = report(tmp_path, "old", write_old), report(tmp_path, "today", write_today)
    assert old == today
    md = old["report.md"]
    assert "  - `—` vllm: args `{}`, env `{}` (recipes: original, w8a8)\n" in md  # null args print as {}
    assert "(recipes: w4a16)" not in md  # a row that measured nothing does not describe a setup that did
    assert md_tables(md, "Summary")["interactive (batch_size=1, input_len=16, output_len=8)"][0]["Recipe"] == "w8a8"
    assert md_tables(md, "Accuracy")["accuracy"][0]["Perplexity (ppl, 95% CI)"] == "12.5"  # no scenario, no dataset
    problems = md.split("## Skipped, unsupported and failed\n", 1)[1]
    assert "| failed | speed | interactive (batch_size=1, input_len=16, output_len=8) | tiny | ? |" in problems
    assert "| unsupported | speed | — | ? | w4a16 |" in problems


def two_machines(other: dict, factor: float) -> list[Row]:
    """Speed rows written before setup ids: original and w8a8 on HARDWARE, then
    on `other`, `factor` times as fast (latencies divided by it)."""
    rows = []
    for hardware, f in ((HARDWARE, 1.0), (other, factor)):
        for recipe in ("original", "w8a8_smooth_ptq"):
            for i in range(3):
                row = speed_run(recipe, "interactive", i, hardware=hardware)
                assert row.setup_id is None and row.comparison_id is None
                m = row.metrics
                rows.append(row.but(metrics={**m, "output_throughput": m["output_throughput"] * f,
                                             "latency_s": m["latency_s"] / f, "ttft_ms_mean": m["ttft_ms_mean"] / f,
                                             "total_token_throughput": m["total_token_throughput"] * f}))
    return rows


def test_old_rows_of_two_machines_are_never_averaged_or_compared_across_them(tmp_path):
    """Rows written before setup ids, from a 2-CPU EPYC and an 8-CPU Xeon
    three times as fast: each machine's recipe is its own group of its own
    runs, and each speed-up is against the original of its own machine."""
    xeon = {**HARDWARE, "hostname": "bench-2", "cpu": "Intel Xeon 8480", "cpu_count": 8, "cpu_affinity": 8}
    store(tmp_path / "old", two_machines(xeon, 3.0))
    build_report(tmp_path / "old", tmp_path / "out", "t", outputs=("markdown", "csv"))
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Rejected rows" not in md   # every row read
    (table,) = md_tables(md, "Summary").values()
    assert len(table) == 4 and len({r["Recipe"] for r in table}) == 4   # each named apart
    speedups = sorted(r["Speed-up vs original (x, 95% CI)"].split(" ")[0] for r in table)
    assert speedups == ["1.00x", "1.00x", "1.27x", "1.27x"]
    assert all("CV" not in r["Speed-up vs original (x, 95% CI)"] for r in table)
    with open(tmp_path / "out" / "summary.csv", newline="") as f:
        assert [r["runs"] for r in csv.DictReader(f)] == ["3"] * 4


BIGGER = {**HARDWARE, "hostname": "bench-3", "memory_gib": 31.3}  # HARDWARE with more RAM, nothing else


def test_batch_table_gives_each_machine_of_old_rows_its_own_table(tmp_path):
    """Without setup ids, two machines' runs of one artifact and shape get a
    table each, its heading naming the machine, not one table whose rows look
    like two scenarios."""
    store(tmp_path / "old", two_machines(BIGGER, 2.0))
    build_report(tmp_path / "old", tmp_path / "out", "t", layouts=("batch_table",))
    md = (tmp_path / "out" / "batch_table.md").read_text()
    headings = [line for line in md.splitlines() if line.startswith("### ") and "original" in line]
    assert len(headings) == 2
    assert ["15.3 GiB RAM" in h for h in headings] == [True, False]
    assert ["31.3 GiB RAM" in h for h in headings] == [False, True]
    assert "(interactive)" not in md   # one batch size per table: no scenario name needed
    first, second = (md.split(h, 1)[1].split("| Prefill | 1 | ", 1)[1].split(" |")[0] for h in headings)
    assert float(first) == pytest.approx(2 * float(second), abs=0.02)   # each machine's own mean TTFT


def test_old_rows_of_machines_apart_only_in_ram_are_named_by_it(tmp_path):
    """Two machines alike but for their RAM, rows without setup ids: every
    label names each one's RAM, none says only that the setup was not recorded."""
    store(tmp_path / "old", two_machines(BIGGER, 2.0))
    build_report(tmp_path / "old", tmp_path / "out", "t", layouts=("summary", "oneline"))
    md, oneline = ((tmp_path / "out" / n).read_text() for n in ("report.md", "oneline.md"))
    (table,) = md_tables(md, "Summary").values()
    assert sorted(r["Recipe"] for r in table) == [
        f"{recipe} (memory_gib={gib})" for recipe in ("original", "w8a8_smooth_ptq") for gib in (15.3, 31.3)]
    assert "not recorded" not in md and "not recorded" not in oneline
    assert oneline.count("**original · vllm (memory_gib=31.3)**") == 1
