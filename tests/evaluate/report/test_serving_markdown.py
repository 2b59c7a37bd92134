"""The report's serving sections (evaluate/analysis/load_levels.py and
recommendation.py, formatted by evaluate/report/serving_markdown.py), the serving
plots and layout=length_grid, from Row-built stores: level tables (values,
order, missing cells), the capacity/speed/accuracy join, the recommendation
(clear winner, a tie within the measurement's interval -> the smaller model,
none qualifies -> why), and speed tables that ignore serving rows."""
import pytest

from evaluate.analysis.load_levels import curves, groups
from evaluate.report import build_report
from evaluate.report.formatting import MISSING
from evaluate.results import Row
from evaluate.serving.slo import SLO

from .rows import ARTIFACTS, PLOTS, base_row, main_rows, md_tables, speed_run, store

CPU_SLO = SLO(name="interactive_cpu", ttft_ms=2000, tpot_ms=100, percentile=90, min_recovery_pct=95)
LEVELS = (1, 2, 4, 8, 16)
# recipe -> TPOT p90 = a + b·c ms (so TPOT ≤ 100 ms up to c = (100 - a) / b), TTFT p90 = 100·c ms
LAW = {"original": (30.0, 10.0), "w8a8_smooth_ptq": (20.0, 8.0), "w4a16_gptq": (28.0, 9.0)}
RECOVERY = {"original": 100.0, "w8a8_smooth_ptq": 98.9, "w4a16_gptq": 90.2}


def level_metrics(recipe: str, c: float, law=LAW, completed: int = 120, tput_scale: float = 1.0,
                  tpot_mean: float | None = None, tpot_std: float = 1.0, slo: SLO | None = CPU_SLO) -> dict:
    a, b = law[recipe]
    tpot, ttft = a + b * c, 100.0 * c
    e2el = ttft + 63 * tpot
    tput = tput_scale * c * 1000 / e2el
    good = tput if tpot <= 100 else 0.0
    return {"completed": completed, "failed": 0, "duration": completed / tput, "request_throughput": tput,
            "request_goodput": good if slo else None, "output_throughput": 64 * tput,
            "total_token_throughput": 192 * tput, "total_input_tokens": 128 * completed,
            "total_output_tokens": 64 * completed,
            **{f"p{p}_ttft_ms": ttft * f for p, f in ((50, 0.8), (90, 1.0), (99, 1.2))},
            **{f"p{p}_tpot_ms": tpot * f for p, f in ((50, 0.9), (90, 1.0), (99, 1.1))},
            "mean_tpot_ms": tpot * 0.95 if tpot_mean is None else tpot_mean, "std_tpot_ms": tpot_std,
            "mean_e2el_ms": e2el, "median_e2el_ms": e2el,
            "slo_attainment": (0.97 if tpot <= 100 else 0.2) if slo else None,
            "slo_attainment_low": (0.92 if tpot <= 100 else 0.14) if slo else None,
            "slo_attainment_high": (0.99 if tpot <= 100 else 0.28) if slo else None,
            "valid": True, "valid_reason": None}


def serving_row(recipe: str, c: float, mode: str = "concurrency", slo: SLO | None = CPU_SLO, scenario: str = "chat",
                engine: str = "vllm_server", setup: str = "srv-1", input_len: int = 128, output_len: int = 64,
                **kw) -> Row:
    return base_row(recipe, kind="serving", scenario=scenario, input_len=input_len, output_len=output_len,
                    engine=engine, setup_id=setup, run_index=0,
                    load={"profile": "concurrency", "mode": mode, "level": None if mode == "synchronous" else c,
                          "burstiness": None, "max_requests": 120, "max_seconds": 600,
                          "drain_seconds": 30},
                    slo=slo.as_dict() if slo else {"name": "none"}, metrics=level_metrics(recipe, c, slo=slo, **kw))


def accuracy_rows(recipes=RECOVERY) -> list[Row]:
    return [base_row(r, kind="accuracy", scenario="pride_and_prejudice", setup_id="inproc",
                     metrics={"perplexity": 28.13 * 100 / RECOVERY[r], "kl_divergence": 0.01 * (100 - RECOVERY[r]),
                              "recovery_pct": RECOVERY[r]}) for r in recipes]


def serving_store(**kw) -> list[Row]:
    return [serving_row(r, c, **kw) for r in LAW for c in LEVELS]


def report(tmp_path, rows: list[Row], *layouts: str) -> tuple[str, list]:
    store(tmp_path / "results", rows)
    paths = build_report(tmp_path / "results", tmp_path / "out", "T", layouts=layouts or ("summary",))
    md = {p.name: p.read_text() for p in paths if p.suffix == ".md"}
    return md.get("report.md") or next(iter(md.values())), paths


def recommendation(md: str) -> str:
    return md.split("### Under load\n", 1)[1].split("\n## ", 1)[0]


# --- level tables ---------------------------------------------------------------------------------------

def test_a_curve_holds_the_levels_of_its_latest_load_profile_only(tmp_path):
    """Rate levels sent with burstiness 1, then a rerun at 0.25 (its own rows:
    the load is in the key): one curve mixed the two profiles' levels."""
    def rate_row(level, burstiness, minute):
        row = serving_row("original", level, mode="rate")
        return row.but(load=row.load | {"profile": "rate", "burstiness": burstiness},
                       timestamp=f"2026-11-22T11:{minute:02d}:00+00:00")
    rows = [rate_row(1.0, 1.0, 0), rate_row(2.0, 1.0, 1), rate_row(2.0, 0.25, 2), rate_row(4.0, 0.25, 3)]
    curve, = curves(groups(rows), {})
    assert [(lvl.level, lvl.row.load["burstiness"]) for lvl in curve.levels] == [(2.0, 0.25), (4.0, 0.25)]


def test_rate_levels_of_the_earlier_arrival_schedule_leave_the_curve():
    """Rate rows written before arrivals were scaled to n/rate (no `arrivals`
    in their load) offered another load: a rerun's rows replace their curve."""
    from types import SimpleNamespace

    from evaluate.serving.load import Level
    from evaluate.serving.profiles import Rate
    from evaluate.serving.run import serving_row as level_row

    old = serving_row("original", 1.0, mode="rate")
    job = SimpleNamespace(load=Rate(name="rate", rates=[2.0, 4.0], max_requests=120, max_seconds=600,
                                    drain_seconds=30), base=old, slo=CPU_SLO)
    scenario = SimpleNamespace(name="chat", input_len=128, output_len=64)

    def new(level, minute):
        return level_row(job, scenario, Level("rate", level, 1.0)).but(
            status="ok", metrics=old.metrics, timestamp=f"2026-11-22T11:{minute:02d}:00+00:00")
    before = [old.but(load=old.load | {"profile": "rate", "level": lvl, "burstiness": 1.0},
                      timestamp=f"2026-11-22T10:0{i}:00+00:00") for i, lvl in enumerate((1.0, 2.0, 4.0))]
    curve, = curves(groups(before + [new(2.0, 0), new(4.0, 1)]), {})
    assert [(lvl.level, lvl.row.load.get("arrivals")) for lvl in curve.levels] == [
        (2.0, "gamma gaps scaled to n/rate"), (4.0, "gamma gaps scaled to n/rate")]


def test_level_tables_per_artifact_in_level_order(tmp_path):
    rows = [serving_row("original", c) for c in (8, 1, 16, 4, 2)]  # appended out of order
    md, _ = report(tmp_path, rows + accuracy_rows())
    tables = md_tables(md, "Serving under load")
    table = tables["chat (input_len=128, output_len=64) · original"]
    assert [r["Concurrency"].split(" ")[0] for r in table] == ["1", "2", "4", "8", "16"]
    four = table[2]
    m = level_metrics("original", 4)
    assert four["Concurrency"] == "4 (max under SLO)"
    assert four["Achieved (req/s)"] == f"{m['request_throughput']:.3f}"
    assert four["TPOT p90 (ms)"] == "70.0" and four["TTFT p90 (ms)"] == "400.0" and four["TTFT p99 (ms)"] == "480.0"
    assert four["Goodput (req/s)"] == f"{m['request_goodput']:.3f}"
    assert four["SLO attainment (%)"] == "97.0 (92.0–99.0)"
    assert four["Completed / failed"] == "120 / 0" and four["Verdict"] == "pass" and four["Valid"] == "yes"
    assert table[3]["Verdict"] == "fail: p90 TPOT 110.0 ms > 100 ms"
    assert "Achieved / offered" not in four       # closed loop: no offered rate
    assert "SLO for chat: interactive_cpu: p90 TTFT ≤ 2000 ms, TPOT ≤ 100 ms; accuracy ≥ 95 % recovery " \
           "(a level needs ≥ 100 requests sent)" in md


def test_missing_metrics_unresolved_and_client_bound_levels(tmp_path):
    few = serving_row("original", 1, completed=40)
    bound = serving_row("original", 2)
    bound.metrics.update(valid=False, valid_reason="client CPU 97 % of one core ≥ 90 %")
    bare = serving_row("original", 4)
    for k in ("p99_ttft_ms", "slo_attainment", "slo_attainment_low", "slo_attainment_high"):
        del bare.metrics[k]
    md, _ = report(tmp_path, [few, bound, bare])
    table = md_tables(md, "Serving under load")["chat (input_len=128, output_len=64) · original"]
    assert table[0]["Verdict"] == "unresolved: 40 requests sent, p90 needs at least 100"
    assert table[1]["Verdict"].startswith("unresolved: client-bound level")
    assert table[1]["Valid"] == "no: client CPU 97 % of one core ≥ 90 %"
    assert table[2]["TTFT p99 (ms)"] == MISSING and table[2]["SLO attainment (%)"] == MISSING
    assert table[2]["Concurrency"] == "4 (max under SLO)"


def test_rate_levels_show_offered_and_achieved(tmp_path):
    rows = [serving_row("original", r, mode="rate") for r in (0.5, 1.0)]
    for r in rows:
        r.metrics.update(offered_rate=r.load["level"], achieved_rate_ratio=0.93)
    md, _ = report(tmp_path, rows)
    table = md_tables(md, "Serving under load")["chat (input_len=128, output_len=64) · original · rate"]
    assert [r["Request rate (req/s)"] for r in table] == ["0.5", "1 (max under SLO)"]
    assert table[0]["Achieved / offered"] == "0.93"


def test_synchronous_is_concurrency_one_and_the_latest_row_of_a_level_stands(tmp_path):
    old = serving_row("original", 1, mode="synchronous", law={"original": (80.0, 10.0)}).but(
        timestamp="2026-11-22T09:00:00+00:00")
    new = serving_row("original", 1).but(timestamp="2026-11-22T11:00:00+00:00")
    md, _ = report(tmp_path, [new, old])
    table = md_tables(md, "Serving under load")["chat (input_len=128, output_len=64) · original"]
    assert len(table) == 1 and table[0]["TPOT p90 (ms)"] == "40.0"


# --- the join table -------------------------------------------------------------------------------------

def test_capacity_speed_and_accuracy_in_one_table(tmp_path):
    speed = [speed_run(r, "interactive", i) for r in ARTIFACTS for i in range(3)]
    md, _ = report(tmp_path, serving_store() + accuracy_rows() + speed)
    join = {r["Recipe"]: r for r in md_tables(md, "Serving under load")["Capacity, speed and accuracy"]}
    assert list(join) == list(LAW)
    assert join["original"]["chat: max concurrency under SLO"] == "4 (< 8)"
    assert join["w8a8_smooth_ptq"]["chat: max concurrency under SLO"] == "8 (< 16)"
    assert join["w8a8_smooth_ptq"]["Recovery (%)"] == "98.9" and join["w4a16_gptq"]["Recovery (%)"] == "90.2"
    assert join["w8a8_smooth_ptq"]["Perplexity"] == f"{28.13 * 100 / 98.9:.4g}"
    runs = [r.metrics["output_throughput"] for r in speed if r.recipe == "original"]
    assert join["original"]["Offline interactive (tok/s)"] == f"{sum(runs) / 3:.2f}"
    assert join["original"]["Model size (MB)"] == f"{ARTIFACTS['original'][2] / 1e6:.1f}"


def test_join_table_missing_cells(tmp_path):
    md, _ = report(tmp_path, [serving_row("w8a8_smooth_ptq", c) for c in LEVELS])
    row = md_tables(md, "Serving under load")["Capacity, speed and accuracy"][0]
    assert row["Perplexity"] == MISSING and row["Recovery (%)"] == MISSING


# --- the recommendation ---------------------------------------------------------------------------------

def test_clear_winner_and_an_artifact_below_the_accuracy_floor(tmp_path):
    rows = serving_store() + accuracy_rows()
    md, _ = report(tmp_path, rows)
    rec = recommendation(md)
    assert "For the SLO interactive_cpu: p90 TTFT ≤ 2000 ms, TPOT ≤ 100 ms; accuracy ≥ 95 % recovery:" in rec
    most = next(line for line in rec.splitlines() if line.startswith("- **Most load under the SLO**"))
    assert "**w8a8_smooth_ptq** (172.4 MB): concurrency 8" in most and "concurrency 16 did not pass" in most
    assert "not eligible: w4a16_gptq: accuracy recovery 90.2 % < the floor 95 %" in rec
    assert "within the measurement's interval" not in rec
    tpot = next(line for line in rec.splitlines() if line.startswith("- **Lowest TPOT at concurrency 1**"))
    assert "**w8a8_smooth_ptq**" in tpot and "26.6 ms per output token" in tpot     # 0.95 · (20 + 8)


def test_each_store_gets_its_own_recommendation(tmp_path):
    """One pick across stores told store a's readers to use an artifact
    measured on store b's (faster) machine, where a had no answer of its own."""
    fast = {"original": (3.0, 1.0)}   # store b: the original alone, on a machine that passes every level
    store(tmp_path / "a", [serving_row(r, c) for r in ("original", "w8a8_smooth_ptq") for c in LEVELS] + accuracy_rows())
    store(tmp_path / "b", [serving_row("original", c, law=fast) for c in LEVELS] + accuracy_rows())
    build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "T", outputs=("markdown",))
    rec = recommendation((tmp_path / "out" / "report.md").read_text())
    parts = rec.split("**chat (input_len=128, output_len=64)**")[1:]
    assert [part.split("\n", 1)[0] for part in parts] == [" (store a)", " (store b)"]
    most = [next(line for line in part.splitlines() if line.startswith("- **Most load")) for part in parts]
    assert "**w8a8_smooth_ptq**" in most[0] and "concurrency 8" in most[0]
    assert "**original (store b)**" in most[1] and "concurrency 16" in most[1]


def test_a_tie_within_the_interval_prefers_the_smaller_model(tmp_path):
    law = {"original": (20.0, 8.0), "w8a8_smooth_ptq": (20.0, 8.0)}        # both pass 8, fail 16
    rows = ([serving_row("original", c, law=law, tput_scale=1.1, tpot_mean=29.9, tpot_std=4.0) for c in LEVELS]
            + [serving_row("w8a8_smooth_ptq", c, law=law, tpot_mean=30.1, tpot_std=4.0) for c in LEVELS])
    md, _ = report(tmp_path, rows + accuracy_rows(("original", "w8a8_smooth_ptq")))
    lines = recommendation(md).splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("- **Most load under the SLO**"))
    assert "**w8a8_smooth_ptq** (172.4 MB)" in lines[i]      # original leads on throughput, but not beyond the bracket
    assert lines[i + 1] == ("  - within the measurement's interval (the levels measured cannot tell them apart): "
                            "original (concurrency 8 passed, 269.1 MB): the smaller model is preferred")
    j = next(n for n, line in enumerate(lines) if line.startswith("- **Lowest TPOT at concurrency 1**"))
    assert "**w8a8_smooth_ptq**" in lines[j] and "30.1 ms" in lines[j]   # the rule finds no difference
    assert lines[j + 1].startswith("  - no significant difference in mean TPOT (the rule in *Method and setups*): "
                                   "original 29.9 ms")


def test_none_qualifies_says_why(tmp_path):
    tight = SLO(name="tight", ttft_ms=50, tpot_ms=100, percentile=90, min_recovery_pct=95)
    rows = [serving_row(r, c, slo=tight) for r in LAW for c in (1, 2)] + accuracy_rows(("original", "w4a16_gptq"))
    md, _ = report(tmp_path, rows)
    rec = recommendation(md)
    assert "- **Most load under the SLO**: no artifact qualifies:" in rec
    assert "  - original: no level meets the SLO (at concurrency 1: p90 TTFT 100.0 ms > 50 ms)" in rec
    assert "  - w8a8_smooth_ptq: no accuracy row (run python -m evaluate with accuracy=austen)" in rec
    assert "  - w4a16_gptq: accuracy recovery 90.2 % < the floor 95 %" in rec


def test_no_slo_stated(tmp_path):
    md, _ = report(tmp_path, serving_store(slo=None))
    rec = recommendation(md)
    assert "No SLO stated for these levels (slo=none)" in rec
    assert "- **Lowest TPOT at concurrency 1**: **w8a8_smooth_ptq**" in rec      # no floor without an SLO
    table = md_tables(md, "Serving under load")["chat (input_len=128, output_len=64) · original"]
    assert table[0]["Verdict"] == MISSING and table[0]["Goodput (req/s)"] == MISSING


# --- speed tables, plots, length_grid -------------------------------------------------------------------

def test_speed_sections_ignore_serving_rows(tmp_path):
    plain, _ = report(tmp_path / "a", main_rows())
    mixed, paths = report(tmp_path / "b", main_rows() + serving_store())
    for section in ("Summary", "Detailed runs", "Accuracy"):
        assert md_tables(mixed, section) == md_tables(plain, section)
    assert mixed.split("## Ranking", 1)[1].split("## Detailed", 1)[0] == \
        plain.split("## Ranking", 1)[1].split("## Detailed", 1)[0]
    assert "## Serving under load" not in plain and "### Under load" not in plain
    if PLOTS:
        assert {p.name for p in paths} >= {"serving_latency_chat.png", "serving_goodput_chat.png", "throughput.png"}
    else:
        assert not [p for p in paths if p.suffix == ".png"]


def test_serving_csv_has_one_line_per_level(tmp_path):
    import csv
    _, paths = report(tmp_path, serving_store() + main_rows())
    lines = list(csv.DictReader((tmp_path / "out" / "serving.csv").open()))
    assert len(lines) == len(LAW) * len(LEVELS)
    first = lines[0]
    assert (first["recipe"], first["mode"], first["level"], first["slo"]) == ("original", "concurrency", "1",
                                                                              "interactive_cpu")
    assert float(first["p90_tpot_ms"]) == pytest.approx(40.0) and first["valid"] == "True"
    assert (first["max_seconds"], first["drain_seconds"]) == ("600", "30")  # the drain decides which requests count
    assert first["arrivals"] == ""   # a rate level's schedule (load.arrivals); a concurrency level has none
    _, paths = report(tmp_path / "plain", main_rows())
    assert "serving.csv" not in {p.name for p in paths}


@pytest.mark.skipif(not PLOTS, reason="matplotlib is not installed here (a bare CUDA image): the report has no plots")
def test_serving_plots_are_pngs(tmp_path):
    _, paths = report(tmp_path, serving_store() + [serving_row("original", r, mode="rate") for r in (0.5, 1.0)])
    pngs = {p.name: p for p in paths if p.suffix == ".png"}
    assert set(pngs) == {"serving_latency_chat.png", "serving_goodput_chat.png"}   # no speed rows: no others
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs.values())


def grid_rows() -> list[Row]:
    rows = []
    for engine, setup, factor in (("vllm_server", "srv-1", 1.0), ("openai", "tgi-1", 0.8)):
        for inp, out in ((128, 64), (128, 256), (512, 64)):
            if engine == "openai" and inp == 512:
                continue                                   # a missing cell
            for c in (1, 4):
                r = serving_row("original", c, engine=engine, setup=setup, scenario=f"grid_{inp}_{out}",
                                input_len=inp, output_len=out, tput_scale=factor)
                r.metrics.update(total_input_tokens=inp * 120, total_output_tokens=out * 120)
                rows.append(r)
    return rows


def test_length_grid_puts_engines_side_by_side(tmp_path):
    md, _ = report(tmp_path, grid_rows(), "length_grid")
    lines = [line for line in md.splitlines() if line.startswith("|")]
    heads = [c.strip() for c in lines[0].strip("|").split("|")]
    assert heads[:4] == ["Input length", "Output length", "req/s · original · vllm_server", "req/s · original · openai"]
    assert heads[4:6] == ["output tok/s · original · vllm_server", "output tok/s · original · openai"]
    body = [dict(zip(heads, [c.strip() for c in line.strip("|").split("|")])) for line in lines[2:]]
    assert [(r["Input length"], r["Output length"]) for r in body] == [("128", "64"), ("128", "256"), ("512", "64")]
    peak = level_metrics("original", 4)                    # concurrency 4 has the higher throughput
    first = body[0]
    assert first["req/s · original · vllm_server"] == f"{peak['request_throughput']:.3f}"
    assert first["req/s · original · openai"] == f"{0.8 * peak['request_throughput']:.3f}"
    assert first["ms per token · original · vllm_server"] == f"{peak['mean_e2el_ms'] / 192:.2f}"
    assert first["ms per output token · original · vllm_server"] == f"{peak['mean_e2el_ms'] / 64:.2f}"
    assert body[2]["req/s · original · openai"] == MISSING
    assert "- 128 → 64, original · openai: concurrency 4" in md


def test_length_grid_without_serving_rows(tmp_path):
    md, _ = report(tmp_path, main_rows(), "length_grid")
    assert "No serving results" in md


@pytest.mark.parametrize("recipe", ["original"])
def test_report_command_accepts_layout_length_grid(tmp_path, recipe):
    from evaluate.report.__main__ import main
    store(tmp_path / "r", grid_rows())
    assert main([f"results_dir={tmp_path / 'r'}", f"out_dir={tmp_path / 'o'}", "layout=length_grid"]) == 0
    assert (tmp_path / "o" / "length_grid.md").exists()
