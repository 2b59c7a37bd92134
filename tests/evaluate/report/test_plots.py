"""evaluate/report/plots.py and the figures it plans: the PNGs, the same
figures as inline SVG, throughput on a linear axis with the tables' 95 %
intervals, a Pareto plot per scenario with its front, floor and pick, one
colour per recipe everywhere, a caption under every image, and labels that
never overlap."""
import re

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed here (a bare CUDA image): the report has no plots")
from matplotlib.text import Text  # noqa: E402

from evaluate.analysis import analyse
from evaluate.analysis.choice import choose
from evaluate.report.config import ReportConfig
from evaluate.report.figures import PngFiles, SvgTexts, label_points, pyplot, spread
from evaluate.report.palette import BASELINE_COLOUR, recipe_colours
from evaluate.report.plots import RANKING, SUMMARY, draw_all, report_plots

from .rows import ARTIFACTS, SCENARIOS, main_rows, many_model_rows, store
from .test_serving_markdown import serving_row

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def plan(tmp_path, rows=None, floor=95.0, pareto=None):
    store(tmp_path / "results", rows or main_rows())
    analysis = analyse([tmp_path / "results"], rows or main_rows())
    report = ReportConfig([tmp_path / "results"], tmp_path / "out", "t", pareto, [], [], accuracy_floor_pct=floor)
    return analysis, report_plots(analysis, report)


def test_each_png_says_what_it_measured_with(tmp_path, monkeypatch):
    """A PNG is shared on its own: its title named the scenario only, never
    the model, engine (and version) or machine its numbers came from."""
    from evaluate.report import figures
    from evaluate.report.__main__ import main
    texts, save_png = {}, figures.save_png

    def keep_texts(fig, path):
        texts[path.name] = [t.get_text() for t in fig.texts]
        save_png(fig, path)

    monkeypatch.setattr(figures, "save_png", keep_texts)
    # a failed start of another engine and model (no version: it never started) is in no figure
    failed = main_rows()[0].but(model_name="Llama-3.1-8B", engine="hf", status="failed", metrics={})
    served = [serving_row(recipe, c) for recipe in ("original", "w8a8_smooth_ptq") for c in (1, 2, 4)]
    store(tmp_path / "results", [r.but(engine_version="0.32.0") for r in main_rows() + served] + [failed])
    assert main([f"results_dir={tmp_path / 'results'}", f"out_dir={tmp_path / 'out'}", "output=[png]"]) == 0
    footer = "Measured: SmolLM2-135M-Instruct; engine {}; on AMD EPYC 9R14, no accelerator"
    serving = {"serving_latency_chat.png", "serving_goodput_chat.png"}
    assert serving < set(texts) and "pareto_interactive.png" in texts and "throughput.png" in texts
    assert {name: t[-1] for name, t in texts.items()} == {
        name: footer.format("vllm_server 0.32.0" if name in serving else "vllm 0.32.0") for name in texts}


def test_pngs_written(report_dir):
    out, _ = report_dir
    names = ["throughput.png"] + [f"{kind}_{s}.png" for s in SCENARIOS for kind in ("throughput", "pareto")]
    for name in names:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE, name
    assert not list(out.glob(".*.tmp"))


def test_each_image_in_report_md_has_its_caption_under_it(report_dir):
    out, _ = report_dir
    md = (out / "report.md").read_text()
    images = re.findall(r"^!\[[^\]]+\]\(([^)]+\.png)\)\n\n\*([^*\n]+)\*$", md, re.M)
    assert sorted(name for name, _ in images) == sorted(p.name for p in out.glob("*.png"))
    for name, caption in images:
        assert caption.endswith(".") and caption.count(". ") == 0, (name, caption)   # one sentence
        assert "(tok/s)" in caption or "(ms)" in caption or "per second" in caption, caption  # units


def test_plots_sit_below_the_table_they_illustrate(tmp_path):
    _, plots = plan(tmp_path)
    places = {p.name: p.place for p in plots}
    for sc in SCENARIOS:
        assert places[f"throughput_{sc}"][0] == RANKING and places[f"throughput_{sc}"][1].name == sc
        assert places[f"pareto_{sc}"][0] == SUMMARY and places[f"pareto_{sc}"][1].name == sc
    assert places["throughput"] == (SUMMARY, None)


def test_svg_figures_match_the_pngs(tmp_path):
    """SvgTexts gets the figures PngFiles writes, by the same names, each one
    inline-ready <svg> element whose ids no other figure repeats."""
    _, plots = plan(tmp_path)
    pngs, svgs = PngFiles(tmp_path), SvgTexts()
    draw_all(plots, pngs)
    draw_all(plots, svgs)
    assert list(svgs.svgs) == [p.stem for p in pngs.paths] == [p.name for p in plots]
    ids = []
    for name, svg in svgs.svgs.items():
        assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>"), name
        assert "<?xml" not in svg and "DOCTYPE" not in svg and "<metadata" not in svg
        assert "<text" in svg  # text kept as text, not glyph paths
        mine = re.findall(r'\bid="([^"]+)"', svg)
        assert mine and all(i.startswith(f"{name}-") for i in mine), name
        assert set(re.findall(r'href="#([^"]+)"', svg)) <= set(mine), name  # every reference resolves in its figure
        ids += mine
    assert len(ids) == len(set(ids))


def test_one_colour_per_recipe_in_every_plot_png_and_svg(tmp_path):
    colours = recipe_colours(ARTIFACTS)
    assert colours["original"] == BASELINE_COLOUR and len(set(colours.values())) == len(ARTIFACTS)
    _, plots = plan(tmp_path)
    svgs = SvgTexts()
    draw_all(plots, svgs)
    measured = {"original", "w8a8_smooth_ptq"}   # w4a16_gptq has no accuracy run: no point in a Pareto plot
    for name, svg in svgs.svgs.items():
        drawn = {c.lower() for c in re.findall(r"#[0-9a-fA-F]{6}", svg)}
        shown = measured if name.startswith("pareto") else set(colours)
        assert {colours[r].lower() for r in shown} <= drawn, name
    pngs = PngFiles(tmp_path)
    draw_all([p for p in plots if p.name == "throughput_interactive"], pngs)
    pixels = (pyplot().imread(pngs.paths[0])[..., :3] * 255).round()
    for colour in colours.values():
        rgb = [int(colour[k:k + 2], 16) for k in (1, 3, 5)]
        assert ((abs(pixels - rgb) <= 1).all(axis=-1)).any(), colour


def test_throughput_bars_are_linear_from_zero_with_the_tables_intervals(tmp_path):
    analysis, plots = plan(tmp_path)
    fig = next(p for p in plots if p.name == "throughput_medium_batch").draw()
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    whiskers, bars = ax.containers[0].lines[2][0].get_segments(), ax.containers[1]
    names = [t.get_text() for t in ax.get_yticklabels()]
    for name, bar, segment in zip(names, bars.patches, whiskers):
        g = next(g for g in analysis.speed if g.recipe == name and g.scenario.name == "medium_batch")
        assert bar.get_width() == pytest.approx(g.mean("output_throughput"))
        assert (segment[0][0], segment[1][0]) == pytest.approx(g.interval("output_throughput"))  # not ± std
    pyplot().close(fig)


def test_bars_of_each_model_get_a_panel_of_their_own(tmp_path):
    """Letters are given per model and store: in one panel, bars of three models
    all read [a] though the rule tells them apart, and 120 tok/s sat below 41.9."""
    analysis, plots = plan(tmp_path, rows=many_model_rows())
    for name in ("throughput_interactive", "throughput"):
        fig = next(p for p in plots if p.name == name).draw()
        shown = [ax for ax in fig.axes if ax.get_visible()]
        blocks = {(r.model_name, r.store) for r in analysis.rankings}
        scenarios = {r.scenario for r in analysis.rankings}
        assert len(shown) == len(blocks) * (len(scenarios) if name == "throughput" else 1)
        for ax in shown:
            bars = [b.get_width() for b in ax.containers[1].patches]   # drawn bottom up
            assert bars == sorted(bars), ax.get_title()   # fastest on top within a panel
            models = {r.model_name for r in analysis.rankings if r.model_name in ax.get_title()}
            assert len(models) == 1, ax.get_title()
        pyplot().close(fig)


def test_a_pareto_plot_per_scenario_with_its_front_floor_and_pick(tmp_path):
    analysis, plots = plan(tmp_path, floor=96.0)
    for sc in SCENARIOS:
        choice = next(c for c in choose(analysis.speed, analysis.accuracy, 96.0) if c.scenario.name == sc)
        assert choice.pick.group.recipe == "w8a8_smooth_ptq"
        assert [p.group.recipe for p in choice.front] == ["original", "w8a8_smooth_ptq"]  # each better in one
        fig = next(p for p in plots if p.name == f"pareto_{sc}").draw()
        ax = fig.axes[0]
        lines = {tuple(line.get_xdata()): line for line in ax.get_lines()}
        assert (96.0, 96.0) in lines                                          # the floor
        assert (97.0, 100.0) in lines                                         # the front's staircase
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "the answer: w8a8_smooth_ptq" in legend and "accuracy floor 96 %" in legend
        assert "model size 172.4 MB" in legend and "model size 269.1 MB" in legend
        assert "not drawn, no accuracy run: w4a16_gptq" in legend
        pyplot().close(fig)


def test_a_pareto_panels_legend_clears_its_axis_label_and_the_next_panel(tmp_path):
    """A panel per model: each legend lies below its panel's axis label and above the
    next panel's title, however many panels the figure has."""
    _, plots = plan(tmp_path, rows=many_model_rows())
    fig = next(p for p in plots if p.name == "pareto_interactive").draw()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_legend()]
    assert len(axes) == 3
    for ax, below in zip(axes, axes[1:] + [None]):
        legend = ax.get_legend().get_window_extent(renderer)
        assert legend.y1 < ax.xaxis.label.get_window_extent(renderer).y0
        assert legend.y1 < min(t.get_window_extent(renderer).y0 for t in ax.get_xticklabels() if t.get_text())
        if below is not None:
            assert legend.y0 > below.title.get_window_extent(renderer).y1
    pyplot().close(fig)


def test_pareto_scenario_keeps_one_pareto_plot(tmp_path):
    _, plots = plan(tmp_path, pareto="medium_batch")
    assert [p.name for p in plots if p.name.startswith("pareto")] == ["pareto_medium_batch"]


def test_plot_labels_never_overlap():
    """Twelve labels for points almost on top of each other: every label box
    is clear of every other, and each has a leader line to its point."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    points = [(f"model-{i % 3}/recipe_number_{i}", 1.0 + 0.001 * i, 20.0 + 0.01 * (i % 4)) for i in range(12)]
    ax.scatter([p[1] for p in points], [p[2] for p in points])
    texts = label_points(ax, points)
    fig.canvas.draw()
    boxes = [Text.get_window_extent(t) for t in texts]  # the text alone, without its leader line
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)
    assert all(t.arrow_patch is not None for t in texts)
    plt.close(fig)


def test_spread_keeps_order_and_gap():
    heights = [0.5, 0.5, 0.49, 0.98, 0.99]
    pos = spread(heights, 0.05)
    ys = [pos[i] for i in sorted(range(5), key=lambda i: heights[i])]
    assert all(b - a >= 0.05 - 1e-9 for a, b in zip(ys, ys[1:]))
    assert max(ys) <= 1.0 and pos[2] == 0.49


def test_two_scenarios_whose_names_clean_to_one_file_name_get_a_file_each():
    # "chat.v2" and "chat_v2" both became throughput_chat_v2.png: one plot overwrote the other
    from evaluate.report.figures import slug
    from evaluate.scenarios import Scenario
    a, b = Scenario("chat.v2", 1, 128, 64), Scenario("chat_v2", 8, 128, 64)
    assert slug(a, [a, b]) != slug(b, [a, b])
    assert slug(a, [a]) == "chat_v2"
