"""evaluate/report/layouts/: batch_table, context_table and oneline rendered
from Row-built stores (values, order, missing cells, TP split, engines side by
side), and `layout=` on the command line."""
import pytest

from evaluate.report import MANIFEST, build_report
from evaluate.report.__main__ import main
from evaluate.report.formatting import MISSING
from evaluate.results import Row

from .rows import ENGINE_ARGS, base_row, main_rows, store

TTFT = (100.0, 110.0, 120.0)   # per-run mean TTFT (ms) at batch 1, runs 0..2
TPOT = (20.0, 21.0, 25.0)      # per-run mean TPOT (ms) at batch 1


def ladder_row(recipe: str, bs: int, inp: int, run: int, engine: str = "vllm", tp: int = 1, out: int = 16,
               **changes) -> Row:
    """A batch/context ladder row: latencies scale with the batch size, throughput is 30 tok/s x bs."""
    t, d = TTFT[run] * bs, TPOT[run] * bs
    metrics = {"ttft_ms_mean": t, "ttft_ms_p50": t - 1, "ttft_ms_p90": t + 1, "ttft_ms_p99": t + 2,
               "tpot_ms_mean": d, "tpot_ms_p50": d - 1, "tpot_ms_p90": d + 1,  # no tpot p99: a missing cell
               "output_throughput": 30.0 * bs + run, "peak_memory_bytes": (2_000_000_000 if engine == "vllm"
                                                                           else 1_000_000_000) + inp * 1_000_000,
               "weight_bandwidth_gb_s": 1.25}
    args = {**ENGINE_ARGS, "tensor_parallel_size": tp} if engine == "vllm" else {"dtype": "float32", "device": "cpu"}
    return base_row(recipe, scenario=f"b{bs}_i{inp}", batch_size=bs, input_len=inp, output_len=out, run_index=run,
                    engine=engine, engine_args=args, setup_id=f"{engine}-tp{tp}", metrics=metrics).but(**changes)


def report(tmp_path, rows: list[Row], *layouts: str) -> dict[str, str]:
    store(tmp_path / "results", rows)
    paths = build_report(tmp_path / "results", tmp_path / "out", "T", layouts=layouts)
    return {p.name: p.read_text() for p in paths if p.suffix == ".md"}


def tables(markdown: str) -> list[tuple[str, list[dict]]]:
    """(the last heading before it, rows as dicts) for every table, in order."""
    found, heading, current = [], None, None
    for line in markdown.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("# ")
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("| ").split(" | ")]
            if current is None:
                current = (heading, cells, [])
                found.append(current)
            else:
                current[2].append(dict(zip(current[1], cells)))
        elif not line.startswith("|"):
            current = None
    return [(h, rows) for h, _, rows in found]


# --- batch_table -------------------------------------------------------------------------------------------

def batch_rows() -> list[Row]:
    """original at TP 1 and 2, batch sizes appended out of order."""
    return [ladder_row("original", bs, 128, run, tp=tp) for tp in (2, 1) for bs in (4, 1, 2) for run in range(3)]


def test_batch_table_values_and_batch_order(tmp_path):
    md = report(tmp_path, batch_rows(), "batch_table")["batch_table.md"]
    heading, rows = tables(md)[0]  # TP 1's section comes first
    assert "original" in heading and "vllm · setup vllm-tp1" in heading and "prompt 128 tokens, 16 generated" in heading
    assert [(r["Step"], r["Batch size"]) for r in rows] == [
        ("Prefill", "1"), ("Prefill", "2"), ("Prefill", "4"),
        ("Decode (token)", "1"), ("Decode (token)", "2"), ("Decode (token)", "4")]
    assert rows[1] == {"Step": "Prefill", "Batch size": "2", "Avg (ms)": "220.00", "Min (ms)": "200.00",
                       "Max (ms)": "240.00", "p50 (ms)": "219.00", "p90 (ms)": "221.00", "p99 (ms)": "222.00"}
    decode_bs1 = rows[3]
    assert (decode_bs1["Avg (ms)"], decode_bs1["Min (ms)"], decode_bs1["Max (ms)"]) == ("22.00", "20.00", "25.00")
    assert decode_bs1["p99 (ms)"] == MISSING
    assert "over the timed runs" in md


def test_batch_table_one_section_per_tp_size(tmp_path):
    md = report(tmp_path, batch_rows(), "batch_table")["batch_table.md"]
    assert md.index("## Tensor parallel size 1") < md.index("## Tensor parallel size 2")
    (h1, tp1), (h2, tp2) = tables(md)
    assert "setup vllm-tp1" in h1 and "setup vllm-tp2" in h2
    assert len(tp1) == len(tp2) == 6


def test_batch_table_without_tp_arg_is_tp_1_and_shapes_get_their_own_table(tmp_path):
    rows = [ladder_row("original", 1, 128, 0, engine_args={"dtype": "bfloat16"}),
            ladder_row("original", 1, 512, 0, engine_args={"dtype": "bfloat16"})]
    md = report(tmp_path, rows, "batch_table")["batch_table.md"]
    assert "## Tensor parallel size 1" in md and "size 2" not in md
    assert [h.rsplit("· ", 1)[1] for h, _ in tables(md)] == ["prompt 128 tokens, 16 generated",
                                                             "prompt 512 tokens, 16 generated"]


def test_batch_table_names_the_scenarios_of_one_shape(tmp_path):
    """The batch ladder's bs1 and the context ladder's ctx128 have one shape: two lines, each named."""
    rows = [ladder_row("original", 1, 128, 0, scenario=name) for name in ("ctx128", "bs1")]
    rows.append(ladder_row("original", 2, 128, 0, scenario="bs2"))
    md = report(tmp_path, rows, "batch_table")["batch_table.md"]
    ((_, table),) = tables(md)
    assert [(r["Step"], r["Batch size"]) for r in table][:3] == [("Prefill", "1 (bs1)"), ("Prefill", "1 (ctx128)"),
                                                                ("Prefill", "2")]


# --- context_table -----------------------------------------------------------------------------------------

def context_rows() -> list[Row]:
    """Two recipes x two engines, interleaved; w8a8 on hf lacks 2048; 4096 was skipped; a batch-8 row."""
    rows = [ladder_row(recipe, 1, inp, 0, engine=engine)
            for engine in ("vllm", "hf") for recipe in ("original", "w8a8_smooth_ptq") for inp in (512, 128, 2048)
            if (recipe, engine, inp) != ("w8a8_smooth_ptq", "hf", 2048)]
    skipped = ladder_row("original", 1, 4096, 0, status="skipped", run_index=None, metrics={},
                         reason="needs 4112 tokens but max_model_len is 2064")
    return rows + [skipped, ladder_row("original", 8, 128, 0)]


def test_context_table_lengths_down_engines_side_by_side(tmp_path):
    md = report(tmp_path, context_rows(), "context_table")["context_table.md"]
    ((heading, rows),) = tables(md)
    assert heading == "16 generated tokens"
    assert list(rows[0]) == ["Input length", "original · vllm", "original · hf", "w8a8_smooth_ptq · vllm",
                             "w8a8_smooth_ptq · hf"]
    assert [r["Input length"] for r in rows] == ["128", "512", "2048", "4096"]
    assert rows[0]["original · vllm"] == "30.00 tok/s · 2.13 GB"
    assert rows[1]["original · hf"] == "30.00 tok/s · 1.51 GB"
    assert rows[2]["w8a8_smooth_ptq · hf"] == MISSING
    assert set(rows[3].values()) == {"4096", MISSING}
    assert "- input 4096, original · vllm: skipped (needs 4112 tokens but max_model_len is 2064)" in md


def test_context_table_notes_vllm_preallocates_its_kv_cache(tmp_path):
    md = report(tmp_path, context_rows(), "context_table")["context_table.md"]
    assert "vLLM pre-allocates its KV cache" in md and "(here 4 GiB)" in md


def test_context_table_splits_memory_into_weights_and_kv_where_the_engine_reported_it(tmp_path):
    reported = {"weights_bytes": 270_000_000, "kv_cache_bytes": 2 * 2 ** 30}
    rows = [ladder_row("original", 1, 128, 0, engine_memory=reported), ladder_row("original", 1, 128, 0, engine="hf"),
            ladder_row("w8a8_smooth_ptq", 1, 128, 0, engine_memory={"kv_cache_bytes": 2 ** 30})]
    md = report(tmp_path, rows, "context_table")["context_table.md"]
    ((_, (row,)),) = tables(md)
    assert row["original · vllm"] == "30.00 tok/s · 2.13 GB (weights 0.27 · KV 2.15)"
    assert row["original · hf"] == "30.00 tok/s · 1.13 GB"
    assert row["w8a8_smooth_ptq · vllm"] == "30.00 tok/s · 2.13 GB (KV 1.07)"
    assert "(here 1 GiB, 2 GiB)" in md  # the reported KV sizes, not the configured VLLM_CPU_KVCACHE_SPACE


@pytest.mark.parametrize("order", [("bs1", "ctx128"), ("ctx128", "bs1")])
def test_context_table_names_the_scenarios_of_one_shape(tmp_path, order):
    """The batch ladder's bs1 and the context ladder's ctx128 are both batch 1, 128 in,
    16 out: one line each, named, whichever was written first."""
    runs = {"bs1": 0, "ctx128": 2}   # 30 and 32 tok/s
    rows = [ladder_row("original", 1, 128, runs[name], scenario=name) for name in order]
    rows.append(ladder_row("original", 1, 512, 0, scenario="ctx512"))
    md = report(tmp_path, rows, "context_table")["context_table.md"]
    ((_, table),) = tables(md)
    assert [(r["Input length"], r["original · vllm"].split(" · ")[0]) for r in table] == [
        ("128 (bs1)", "30.00 tok/s"), ("128 (ctx128)", "32.00 tok/s"), ("512", "30.00 tok/s")]


def test_context_table_without_batch_1(tmp_path):
    md = report(tmp_path, [ladder_row("original", 8, 128, 0)], "context_table")["context_table.md"]
    assert "No batch-1 speed results" in md and "|" not in md


# --- length_grid ------------------------------------------------------------------------------------------

def stamped(rows: list[Row], day: int) -> list[Row]:
    return [r.but(timestamp=f"2026-11-{day}T10:0{i}:00+00:00") for i, r in enumerate(rows)]


def test_length_grid_shows_the_levels_serving_under_load_shows(tmp_path):
    """A faster older curve replaced by a rerun with another request budget, and a
    level measured twice: the grid takes the latest profile's latest rows, as
    "Serving under load" does, not the highest of every row ever written."""
    from .test_serving_markdown import LEVELS, level_metrics, serving_row
    old = stamped([serving_row("original", c, tput_scale=1.5) for c in LEVELS], 20)
    new = stamped([serving_row("original", c) for c in LEVELS], 22)
    new = [r.but(load={**r.load, "max_requests": 200}) for r in new]
    rows = old + new + stamped([serving_row("original", 2, engine="openai", setup="tgi-1", tput_scale=s)
                               for s in (3.0, 1.0)], 23)   # concurrency 2 twice: the second stands
    md = report(tmp_path, rows, "length_grid")["length_grid.md"]
    ((_, (row,)),) = tables(md)
    assert row["req/s · original · vllm_server"] == f"{level_metrics('original', 16)['request_throughput']:.3f}"
    assert row["req/s · original · openai"] == f"{level_metrics('original', 2)['request_throughput']:.3f}"
    assert "- 128 → 64, original · vllm_server: concurrency 16" in md


# --- oneline -----------------------------------------------------------------------------------------------

REPRO = "python -m evaluate recipe=original scenario=bs1 engine.args.kv_cache_dtype=fp8"


def test_oneline_fields_and_repro(tmp_path):
    vllm = [ladder_row("original", 1, 128, run, engine_args={**ENGINE_ARGS, "kv_cache_dtype": "fp8",
                                                              "enforce_eager": True},
                       extra={"repro": REPRO}) for run in range(2)]
    md = report(tmp_path, vllm + [ladder_row("original", 1, 128, 0, engine="hf")], "oneline")["oneline.md"]
    lines = md.split("## b1_i128 (batch_size=1, input_len=128, output_len=16)\n\n", 1)[1].splitlines()
    assert lines[0] == ("- **original · vllm**: tok/s: 30.50, mem/s: 1.25 GB/s, peak_host_mem: 2.13 GB, "
                        "model_size: 0.27 GB, quant: original (dense), kv_quant: fp8, compile: False, "
                        "dtype: bfloat16, device: cpu (avx2)")
    assert lines[1] == f"  repro: `{REPRO}`"
    assert lines[2].startswith("- **original · hf**: tok/s: 30.00,")
    assert "kv_quant: none, compile: False, dtype: float32, device: cpu (avx2)" in lines[2]
    assert len(lines) == 3  # no repro recorded for hf: no repro line


def test_oneline_device_and_missing_values(tmp_path):
    gpu = ladder_row("original", 1, 128, 0, machine={"arch": "x86_64", "isa": ["avx2"], "cuda": [[8, 0]]},
                     metrics={"output_throughput": 90.0})
    md = report(tmp_path, [gpu], "oneline")["oneline.md"]
    assert (f"tok/s: 90.00, mem/s: {MISSING} GB/s, peak_host_mem: {MISSING} GB" in md
            and "kv_quant: none, compile: True" in md and "device: cuda" in md)


# --- layout= -----------------------------------------------------------------------------------------------

def test_layouts_write_only_their_files(tmp_path, capsys):
    store(tmp_path / "results", main_rows())
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}",
                 "layout=batch_table,oneline"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MANIFEST, "batch_table.md", "oneline.md"]
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "out" / n) for n in ("batch_table.md", "oneline.md")]


def test_summary_is_todays_report(tmp_path):
    def report_md(out, *layouts):
        build_report(tmp_path / "results", tmp_path / out, "T", **({"layouts": layouts} if layouts else {}))
        text = (tmp_path / out / "report.md").read_text()
        return [line for line in text.splitlines() if not line.startswith("- Generated:")]
    store(tmp_path / "results", main_rows())
    assert report_md("default") == report_md("both", "summary", "context_table")
    assert (tmp_path / "both" / "context_table.md").is_file() and (tmp_path / "both" / "summary.csv").is_file()
    assert not (tmp_path / "default" / "context_table.md").exists()


@pytest.mark.parametrize("value", ["bogus", "[summary,bogus]", "summary,bogus"])
def test_an_unknown_layout_is_one_line_naming_the_choices(tmp_path, capsys, value):
    store(tmp_path / "results", main_rows())
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}", f"layout={value}"]) == 2
    err = capsys.readouterr().err.splitlines()
    old_spelling = value == "summary,bogus"  # it works, with a deprecation line first
    assert len(err) == 1 + old_spelling and err[0].startswith("warning: ") == old_spelling
    assert err[-1:] == [
        "error: unknown layout 'bogus'; layout= takes one or several of batch_table, context_table, length_grid, "
        "oneline, summary (conf/report/layout/), e.g. layout=[batch_table,context_table]"]
    assert not (tmp_path / "out").exists()


def test_a_store_without_speed_rows(tmp_path):
    accuracy = [r for r in main_rows() if r.kind == "accuracy"]
    md = report(tmp_path, accuracy, "batch_table")["batch_table.md"]
    assert "No speed results in this store" in md
