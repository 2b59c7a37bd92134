"""evaluate/report/plots.py: the PNGs, the same figures as inline SVG, and labels that never overlap."""
import re

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed here (a bare CUDA image): the report has no plots")
from matplotlib.text import Text  # noqa: E402

from evaluate.analysis import analyse
from evaluate.report.plots import PngFiles, SvgTexts, draw_all, label_points, pyplot, spread

from .rows import SCENARIOS, main_rows, store

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_pngs_written(report_dir):
    out, _ = report_dir
    names = ["throughput.png", "speed_vs_size.png", "pareto.png"] + [f"throughput_{s}.png" for s in SCENARIOS]
    for name in names:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE, name
    assert not list(out.glob(".*.tmp"))


def test_svg_figures_match_the_pngs(tmp_path):
    """SvgTexts gets the figures PngFiles writes, by the same names, each one
    inline-ready <svg> element whose ids no other figure repeats."""
    rows = store(tmp_path / "results", main_rows())
    analysis = analyse([tmp_path / "results"], rows)
    pngs, svgs = PngFiles(tmp_path), SvgTexts()
    draw_all(analysis, None, pngs)
    draw_all(analysis, None, svgs)
    assert list(svgs.svgs) == [p.stem for p in pngs.paths]
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
