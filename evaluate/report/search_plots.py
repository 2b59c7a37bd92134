"""The figures of the recipe search and layer sensitivity sections: each
study's trials (accuracy vs speed, marker area by size, the Pareto front in
colour and labelled, dominated trials grey, the answer ringed, the floor dashed) and each sensitivity file's heat
map (quantize.common.sensitivity_plot draws it). report.md shows them as
PNGs beside it; report.html inlines them as SVG in their sections."""
from pathlib import Path

from evaluate.analysis.pareto import SearchFront, answer
from evaluate.report.figures import Figures, PngFiles, SvgTexts, label_points, pyplot
from evaluate.report.palette import FLOOR_COLOUR, PICK_COLOUR
from evaluate.report.search_files import SensitivityEntry, StudyEntry, can_draw, heatmap_drawer
from evaluate.report.search_markdown import objective_header

MARKER_AREA = (40, 600)   # points^2: the smallest trial, and what the largest adds


def draw_search_figures(studies: list[StudyEntry], sensitivities: list[SensitivityEntry], floor_pct: float,
                        figures: Figures) -> None:
    """Every figure the two sections show, into `figures`."""
    if not can_draw():
        return
    for entry in studies:
        if entry.search.complete:
            plot_study(entry.search, floor_pct, figures, entry.figure)
    draw = heatmap_drawer()
    if draw is None:
        return
    for entry in sensitivities:
        figures.save_drawn(lambda path, s=entry.sensitivity: draw(s, path), entry.figure)


def png_files(studies, sensitivities, floor_pct: float, out_dir: Path) -> list[Path]:
    files = PngFiles(out_dir)
    draw_search_figures(studies, sensitivities, floor_pct, files)
    return files.paths


def svg_texts(studies, sensitivities, floor_pct: float) -> dict[str, str]:
    figures = SvgTexts()
    draw_search_figures(studies, sensitivities, floor_pct, figures)
    return figures.svgs


def plot_axes(search: SearchFront) -> tuple[int | None, int]:
    """The objective indices on x and y: accuracy and speed where the study has them,
    else its first two objectives (x None: one objective, plotted against the trial number)."""
    n = len(search.record.objectives)
    y = search.roles.speed if search.roles.speed is not None else min(1, n - 1)
    x = search.roles.accuracy if search.roles.accuracy is not None else next((i for i in range(n) if i != y), None)
    return x, y


def plot_study(search: SearchFront, floor_pct: float, figures: Figures, name: str) -> None:
    """The trials on the accuracy and speed axes; the answer ringed and, for a
    recovery objective, the floor as a dashed line."""
    plt = pyplot()
    objectives = search.record.objectives
    x, y = plot_axes(search)
    size = search.roles.size if search.roles.size not in (x, y) else None
    biggest = 1.0 if size is None else max(abs(t.values[size]) for t in search.complete) or 1.0

    def xy(t):
        return (t.number if x is None else t.values[x]), t.values[y]

    def area(t):
        return MARKER_AREA[0] + (0 if size is None else MARKER_AREA[1] * abs(t.values[size]) / biggest)

    fig, ax = plt.subplots(figsize=(7.5, max(5.0, 1.5 + len(search.front) * 8 * 1.6 / 72)))
    dominated = [t for t in search.complete if not search.on_front(t)]
    ax.scatter([xy(t)[0] for t in dominated], [xy(t)[1] for t in dominated], s=[area(t) for t in dominated],
               color="0.7", alpha=0.7, label="dominated")
    ax.scatter([xy(t)[0] for t in search.front], [xy(t)[1] for t in search.front], s=[area(t) for t in search.front],
               color="tab:blue", alpha=0.8, edgecolors="black", linewidths=0.6, label="Pareto front")
    pick = answer(search, floor_pct)
    if pick.pick is not None:
        ax.scatter(*xy(pick.pick), s=area(pick.pick) * 2.2, facecolors="none", edgecolors=PICK_COLOUR,
                   linewidths=1.5,
                   label="the answer" if pick.meets_floor else "most accurate (none keeps the floor)")
    if pick.floor_pct is not None and x == search.roles.accuracy:
        ax.axvline(pick.floor_pct, color=FLOOR_COLOUR, linestyle="--", linewidth=1,
                   label=f"accuracy floor {pick.floor_pct:g} %")
    ax.margins(0.2)
    ax.set_xlabel("Trial" if x is None else objective_header(objectives[x]))
    ax.set_ylabel(objective_header(objectives[y]))
    sized = "" if size is None else f" (marker area ∝ {objective_header(objectives[size])})"
    ax.set_title(f"Recipe search {search.record.study}: {len(search.front)} of {len(search.complete)} "
                 f"complete trials on the front{sized}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best", markerscale=0.6)
    label_points(ax, [(f"#{t.number} {t.recipe or ''}".strip(), *xy(t)) for t in search.front])
    figures.save(fig, name)
