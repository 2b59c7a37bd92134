"""report.md's "Recipe search" and "Layer sensitivity" sections, the answer's
"From the recipe search", search_front.csv and report.html's figures, from a
store whose study.json and sensitivity files are written by their own modules
(evaluate/search/study_file.py, quantize/common/sensitivity_file.py)."""
import csv
import re
import sys

import pytest

from evaluate.report import build_report
from evaluate.report.__main__ import main
from evaluate.report.search_files import HEATMAP_MODULE, heatmap_drawer
from evaluate.search import study_file
from evaluate.search.study_file import Objective, SearchRecord, Trial
from quantize.common import sensitivity_file
from quantize.common.sensitivity_file import Cell, Sensitivity

from .rows import PLOTS, main_rows, store

MODEL = "SmolLM2-135M"
OBJECTIVES = [Objective("recovery_pct", "maximize", "%"),
              Objective("output_throughput", "maximize", "tok/s", scenario="interactive"),
              Objective("size_mb", "minimize", "MB")]
# trial number -> (recovery %, tok/s, MB); None: the trial failed
POINTS = {0: (99.2, 40.0, 270.0),    # front: the most accurate
          1: (96.0, 60.0, 170.0),    # front
          2: (95.5, 60.0, 120.0),    # front: as fast as 1, smaller: the answer at a 95 % floor
          3: (80.0, 90.0, 100.0),    # front: fastest, smallest, below any sensible floor
          4: None,
          5: (95.0, 50.0, 200.0),    # dominated by 2
          6: (79.0, 85.0, 110.0)}    # dominated by 3
FRONT = [0, 1, 2, 3]
GROUPS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
PLANTED = (2, "mlp.down_proj")  # the cell whose KL dominates


def trial(number: int, values) -> Trial:
    if values is None:
        return Trial(number, "FAIL", {"scheme": "w4a16"}, recipe=f"search_s_{number}",
                     error="quantize failed: out of memory while calibrating\nTraceback (most recent call last): ...")
    return Trial(number, "COMPLETE", {"scheme": "w8a8", "dense_groups": number}, list(values),
                 recipe=f"search_s_{number}", artifact_id=f"{number:02d}c0ffee00000000", speed="measured"
                 if number % 2 == 0 else "reused from 00c0ffee00000000",
                 repro=f"python -m quantize recipe=search_s_{number}\npython -m evaluate recipe=search_s_{number}")


def search_record(study="s", objectives=OBJECTIVES, points=POINTS) -> SearchRecord:
    return SearchRecord(study, "sqlite:///results/search/s/study.db", objectives, "vllm", MODEL, "default",
                        len(points) + 2, [trial(n, v) for n, v in points.items()], wall_s=754.3,
                        updated="2026-11-27T00:00:00+00:00")


def sensitivity() -> Sensitivity:
    cells = [Cell(layer, group, [f"model.layers.{layer}.{group}"],
                  kl=0.5 if (layer, group) == PLANTED else 0.001 * (1 + layer + 0.1 * g),
                  params=576 * 576 if "attn" in group else 576 * 1536)
             for layer in range(4) for g, group in enumerate(GROUPS)]
    return Sensitivity(MODEL, "/models/SmolLM2-135M", "ab" * 32, "w4a16_rtn", "w4a16-g64-asym",
                       {"num_bits": 4, "group_size": 64}, {"source": "austen", "books": ["emma"], "num_windows": 8,
                                                           "window_len": 256, "scored_tokens": 2040},
                       cells, baseline_kl=0.21, wall_s=312.5)


@pytest.fixture
def results(tmp_path):
    store(tmp_path / "results", main_rows())
    study_file.write(tmp_path / "results", search_record())
    s = sensitivity()
    sensitivity_file.write(sensitivity_file.folder_for(tmp_path / "results", s.model_name, s.scheme_key,
                                                       s.weights_hash), s)
    return tmp_path / "results"


def report(results, out, *args) -> str:
    assert main([f"results_dir={results}", f"out_dir={out}", *args]) == 0
    return (out / "report.md").read_text()


def section(md: str, title: str) -> str:
    return md.split(f"{title}\n", 1)[1].split("\n## ", 1)[0]


def table(text: str) -> list[dict]:
    lines = [[c.strip() for c in line.strip("| ").split(" | ")] for line in text.splitlines()
             if line.startswith("|") and not line.startswith("|---")]
    return [dict(zip(lines[0], row)) for row in lines[1:]]


def test_search_section_shows_the_front_failed_trials_and_its_figure(results, tmp_path):
    md = report(results, tmp_path / "out", "output=[markdown]")
    sections = re.findall(r"^## (.+)$", md, re.M)
    assert sections[-3:] == ["Recipe search", "Layer sensitivity", "Method and setups"]
    text = section(md, "## Recipe search")
    assert "- Trials: 6 complete, 1 failed, of a target of 9; wall time 754.3 s" in text
    assert "Pareto front: 4 of 6 complete trials." in text
    rows = table(text)
    assert [r["Trial"] for r in rows] == [f"#{n}" for n in FRONT]   # best recovery first
    assert list(rows[0])[3:6] == ["Accuracy recovery (%)", "Output throughput at interactive (tok/s)",
                                  "Model size (MB)"]
    assert rows[2] == {"Trial": "#2", "Recipe": "search_s_2", "Artifact": "`02c0ffee`", "Accuracy recovery (%)": "95.5",
                       "Output throughput at interactive (tok/s)": "60", "Model size (MB)": "120",
                       "Speed": "measured",
                       "Repro": "`python -m quantize recipe=search_s_2 ; python -m evaluate recipe=search_s_2`"}
    assert rows[1]["Speed"] == "reused from 00c0ffee00000000"
    assert "Dominated: #5 search_s_5, #6 search_s_6." in text
    assert "- #4 search_s_4: quantize failed: out of memory while calibrating\n" in text + "\n"
    assert "Traceback" not in text
    if PLOTS:
        assert "](search-s.png)" in text
        png = tmp_path / "out" / "search-s.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("floor,picked", [(95, 2), (99, 0), (50, 3)])
def test_the_answer_is_the_fastest_front_point_keeping_the_floor(results, tmp_path, floor, picked):
    md = report(results, tmp_path / "out", "output=[markdown]", f"accuracy_floor_pct={floor}")
    answer = section(md, "## What to use on this machine")
    line = answer.split("### From the recipe search\n\n", 1)[1].splitlines()[0]
    recovery, speed, size = POINTS[picked]
    assert line == (f"- Study s ({MODEL}, vllm): for recovery ≥ {floor} % on this host, use **search_s_{picked}** "
                    f"(artifact `{picked:02d}c0ffee`, trial #{picked}): {speed:.2f} tok/s at interactive, "
                    f"{size:.1f} MB ({recovery:.1f} % recovery).")
    assert answer.index("| Scenario |") < answer.index("### From the recipe search")   # after the rows' answer


def test_no_point_keeping_the_floor_names_the_most_accurate(results, tmp_path):
    md = report(results, tmp_path / "out", "output=[markdown]", "accuracy_floor_pct=99.5")
    assert ("- Study s (SmolLM2-135M, vllm): no complete trial keeps recovery ≥ 99.5 % (`accuracy_floor_pct=`); "
            "the most accurate is **search_s_0** (artifact `00c0ffee`, trial #0): 40.00 tok/s at interactive, "
            "270.0 MB, 99.2 % recovery.") in md


def test_with_a_kl_objective_the_answer_states_the_kl_and_no_floor(tmp_path):
    store(tmp_path / "results", main_rows())
    kl = [Objective("kl_divergence", "minimize", "nats"), *OBJECTIVES[1:]]
    points = {0: (0.01, 40.0, 270.0), 1: (0.2, 60.0, 170.0), 2: (0.3, 55.0, 170.0)}
    study_file.write(tmp_path / "results", search_record("kl", kl, points))
    md = report(tmp_path / "results", tmp_path / "out", "output=[markdown]")
    assert ("- Study kl (SmolLM2-135M, vllm): use **search_s_1** (artifact `01c0ffee`, trial #1): 60.00 tok/s at "
            "interactive, 170.0 MB; KL divergence 0.2 nats. The search's accuracy objective is not a recovery, so "
            "no floor applies: this is the fastest front point; the most accurate is **search_s_0** (trial #0, "
            "KL divergence 0.01 nats).") in md
    assert [r["Trial"] for r in table(section(md, "## Recipe search"))] == ["#0", "#1"]


def test_sensitivity_section_ranks_the_planted_cell_first(results, tmp_path):
    md = report(results, tmp_path / "out", "output=[markdown]")
    text = section(md, "## Layer sensitivity")
    assert f"### {MODEL} · w4a16-g64-asym" in text
    assert "- Held-out text: 8 windows × 256 tokens of austen (emma), 2040 scored tokens" in text
    assert "- Wall time 312.5 s; baseline KL (every module quantized at once) 0.21 nats/token; 28 cells, " \
           "4 layers × 7 modules" in text
    rows = table(text)
    assert len(rows) == 10 and [r["Rank"] for r in rows] == [str(n) for n in range(1, 11)]
    assert rows[0] == {"Rank": "1", "Layer": "2", "Module": "mlp.down_proj", "KL divergence (nats/token)": "0.5",
                       "Parameters (count)": f"{576 * 1536:,}"}
    kls = [float(r["KL divergence (nats/token)"]) for r in rows]
    assert kls == sorted(kls, reverse=True) and rows[1]["Layer"] == "3"
    figure = tmp_path / "out" / f"sensitivity-{MODEL}-w4a16-g64-asym.png"
    if PLOTS and heatmap_drawer():
        assert f"]({figure.name})" in text and figure.read_bytes()[:4] == b"\x89PNG"
    else:
        assert "No heat map: " in text and not figure.exists()


def test_without_the_heat_map_module_the_section_says_so(results, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, HEATMAP_MODULE, None)   # import now raises ImportError
    md = report(results, tmp_path / "out", "output=[markdown,html]")
    assert f"No heat map: this checkout lacks {HEATMAP_MODULE}." in section(md, "## Layer sensitivity")
    assert not list((tmp_path / "out").glob("sensitivity-*"))
    assert "plot-sensitivity" not in (tmp_path / "out" / "report.html").read_text()


def test_search_front_csv_has_every_complete_trial(results, tmp_path):
    report(results, tmp_path / "out", "output=[markdown,csv]")
    with open(tmp_path / "out" / "search_front.csv") as f:
        records = list(csv.DictReader(f))
    assert [int(r["trial"]) for r in records] == [0, 1, 2, 3, 5, 6]
    assert {int(r["trial"]) for r in records if r["on_front"] == "True"} == set(FRONT)
    assert records[2]["recovery_pct"] == "95.5" and records[2]["size_mb"] == "120.0"
    assert records[2]["output_throughput"] == "60.0" and records[2]["artifact_id"] == "02c0ffee00000000"


def test_html_has_the_sections_and_inlines_the_figures(results, tmp_path):
    build_report(results, tmp_path / "out", "Search", outputs=("html",))
    page = (tmp_path / "out" / "report.html").read_text()
    sections = re.findall(r'<section id="([^"]+)">', page)
    assert {"recipe-search", "layer-sensitivity"} <= set(sections)
    assert 'id="from-the-recipe-search"' in page and 'id="study-s"' in page
    assert "<img" not in page   # the page loads no file
    if PLOTS:
        search = page[page.index('<section id="recipe-search">'):page.index('<section id="layer-sensitivity">')]
        assert '<figure id="plot-search-s">\n<svg' in search
        if heatmap_drawer():
            assert f'<figure id="plot-sensitivity-{MODEL}-w4a16-g64-asym">\n<svg' in page
        ids = re.findall(r'\bid="([^"]+)"', page)
        assert len(ids) == len(set(ids))


def test_a_store_without_them_has_neither_section_nor_csv(tmp_path):
    store(tmp_path / "results", main_rows())
    md = report(tmp_path / "results", tmp_path / "out", "output=[markdown,csv]")
    assert "## Recipe search" not in md and "## Layer sensitivity" not in md and "From the recipe search" not in md
    assert not (tmp_path / "out" / "search_front.csv").exists()


def test_a_damaged_study_file_is_one_line_and_nothing_written(results, tmp_path, capsys):
    study_file.path_for(results, "s").write_text('{"kind": "quantbench.search", "version": 1}')
    assert main([f"results_dir={results}", f"out_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "damaged search record" in err and "python -m evaluate.search" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "out").exists()
