"""The plots: throughput per scenario (grouped and one per scenario), speed
vs size and speed vs accuracy, serving under load. Each figure goes to a
`Figures`: PNG files in the report folder (`output=png`), or SVG text kept for
report.html (`output=html`). matplotlib is imported only when plotting."""
import importlib.util
import io
import logging
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from evaluate.analysis import Analysis
from evaluate.analysis.groups import Group, accuracy_of, headline_accuracy_keys, pareto_scenario, scenarios
from evaluate.analysis.load_levels import ServingAnalysis
from evaluate.analysis.ranking import ScenarioRanking
from evaluate.report.config import OutputFormat, ReportConfig
from evaluate.report.formatting import header, mb, speedup_text
from evaluate.report.labels import labels
from evaluate.scenarios import Scenario
from quantize.common import atomic

LABEL_FONT = 8  # points
THROUGHPUT_AXIS = "Output throughput (tok/s), mean"

log = logging.getLogger("quantbench.report")


class Figures:
    """Where each finished figure goes, by its name (`throughput`, `pareto`, ...)."""

    def save(self, fig, name: str) -> None:
        raise NotImplementedError

    def save_drawn(self, draw: Callable[[Path], None], name: str) -> None:
        """A figure that `draw` writes to a file itself (its format by the path's suffix)."""
        raise NotImplementedError


@dataclass
class PngFiles(Figures):
    """<out_dir>/<name>.png, each written whole (see save_png)."""
    out_dir: Path
    paths: list[Path] = field(default_factory=list)

    def save(self, fig, name: str) -> None:
        self.paths.append(self.out_dir / f"{name}.png")
        save_png(fig, self.paths[-1])

    def save_drawn(self, draw: Callable[[Path], None], name: str) -> None:
        path = self.out_dir / f"{name}.png"
        with atomic.replacing(path, suffix=".png") as tmp:  # `draw` takes the format from the suffix
            draw(tmp)
        self.paths.append(path)


@dataclass
class SvgTexts(Figures):
    """Each figure as an <svg> element to put inline in an HTML page (name -> text)."""
    svgs: dict[str, str] = field(default_factory=dict)

    def save(self, fig, name: str) -> None:
        self.svgs[name] = svg_text(fig, name)

    def save_drawn(self, draw: Callable[[Path], None], name: str) -> None:
        with tempfile.TemporaryDirectory() as folder, \
                pyplot().rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
            path = Path(folder) / f"{name}.svg"
            draw(path)
            self.svgs[name] = inline_svg(path.read_text(), name)


def have_matplotlib(what: str) -> bool:
    """Whether plots can be drawn; where not, one warning saying what goes without them."""
    if importlib.util.find_spec("matplotlib") is None:
        # the tables are the report; a machine without matplotlib (a bare CUDA image) still gets them
        log.warning(f"matplotlib is not installed: {what} has no plots (bash scripts/setup.sh installs it)")
        return False
    return True


def draw_all(analysis: Analysis, wanted: str | None, figures: Figures) -> None:
    """Every plot the analysis allows, into `figures`."""
    render_plots(analysis.speed, analysis.accuracy, figures, wanted, analysis.rankings)
    render_serving_plots(analysis.serving, figures)


@dataclass
class Png(OutputFormat):
    """The PNG plots; none, with one warning, where matplotlib is not installed."""

    def draw(self, analysis: Analysis, report: ReportConfig) -> list[Path]:
        if not have_matplotlib("the report"):
            return []
        files = PngFiles(report.out_dir)
        draw_all(analysis, report.pareto_scenario, files)
        return files.paths


def render_plots(speed: list[Group], accuracy: list[Group], figures: Figures, wanted: str | None,
                 rankings: list[ScenarioRanking]) -> None:
    """Every speed and accuracy plot the groups allow; each scenario's bars
    in the order, and with the letters, of its Ranking."""
    speed = [g for g in speed if g.mean("output_throughput")]
    if not speed:
        return
    names = labels(speed)
    plot_grouped(speed, names, figures, "throughput")
    for sc in scenarios(speed):
        plot_scenario([r for r in rankings if r.scenario == sc], names, sc, figures,
                      f"throughput_{slug(sc, scenarios(speed))}")
    sc = pareto_scenario(speed, wanted)
    chosen = [g for g in speed if g.scenario == sc]
    plot_size(chosen, names, sc, figures)
    plot_accuracy(chosen, accuracy, names, sc, figures)


def plot_size(chosen: list[Group], names: dict, sc: Scenario, figures: Figures) -> None:
    sized = [(names[g.identity], mb(g.model_bytes), g.mean("output_throughput"), 60) for g in chosen if g.model_bytes]
    if sized:
        annotated_scatter(sized, "Model size (MB)", THROUGHPUT_AXIS, f"Speed vs size\n{sc.heading()}", figures,
                          "speed_vs_size")


def plot_accuracy(chosen: list[Group], accuracy: list[Group], names: dict, sc: Scenario, figures: Figures) -> None:
    """Speed vs the first headline accuracy metric, bubble area by model size."""
    keys = headline_accuracy_keys(accuracy)
    if not keys:
        return
    biggest = max((mb(g.model_bytes) or 0 for g in chosen), default=0) or 1
    scored = [(g, accuracy_of(accuracy, g)) for g in chosen]
    points = [(names[g.identity], a.mean(keys[0]), g.mean("output_throughput"),
               40 + 1200 * (mb(g.model_bytes) or 0) / biggest)
              for g, a in scored if a and a.mean(keys[0]) is not None]
    if points:
        annotated_scatter(points, header(keys[0]), THROUGHPUT_AXIS,
                          f"Speed vs accuracy (bubble area ∝ model size)\n{sc.heading()}", figures, "pareto")


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, path: Path) -> None:
    """Save beside `path` under a temp name, then rename: readers never see half a PNG."""
    try:
        with atomic.replacing(path) as tmp:
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    finally:
        pyplot().close(fig)


def svg_text(fig, name: str) -> str:
    """The figure as one inline <svg> element: text kept as text (small, and
    drawn in the page's sans-serif font), no XML prolog or metadata, and every
    id prefixed with `name` so that several figures share one page without clashes."""
    plt = pyplot()
    out = io.StringIO()
    try:
        with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
            fig.savefig(out, format="svg", bbox_inches="tight",
                        metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    finally:
        plt.close(fig)
    return inline_svg(out.getvalue(), name)


def inline_svg(svg: str, name: str) -> str:
    """An SVG file's text as one inline <svg> element: no XML prolog, and every
    id prefixed with `name`."""
    svg = svg[svg.index("<svg"):]
    return re.sub(r'(\bid="|href="#|url\(#)', lambda m: f"{m.group(1)}{name}-", svg)


def slug(sc: Scenario, all_scenarios: list[Scenario]) -> str:
    """File-name part for a scenario: its name, plus its shape if the name repeats."""
    name = sc.name
    if sum(s.name == sc.name for s in all_scenarios) > 1:
        name += f"_bs{sc.batch_size}_in{sc.input_len}_out{sc.output_len}"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def plot_scenario(rankings: list[ScenarioRanking], names: dict, sc: Scenario, figures: Figures, name: str) -> None:
    """The scenario's Ranking as bars, top down: each entry with its letters,
    then (grey) those a single run leaves unranked."""
    plt = pyplot()
    marks = {id(r.group): r.letters for ranking in rankings for r in ranking.ranked}
    gs = [g for ranking in rankings for g in [r.group for r in ranking.ranked] + ranking.untested][::-1]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(gs)))
    means = [g.mean("output_throughput") for g in gs]
    stds = [g.std("output_throughput") or 0 for g in gs]
    ax.barh([names[g.identity] for g in gs], means, xerr=stds, capsize=3,
            color=["tab:blue" if id(g) in marks else "0.7" for g in gs])
    for y, (g, v, e) in enumerate(zip(gs, means, stds)):
        mark = f"  [{marks[id(g)]}]" if id(g) in marks else ", not ranked: a single run"
        note = f", ⚠ {g.flag}" if g.flag and id(g) in marks else ""
        ax.text(v + e, y, f"  {v:.1f} ({speedup_text(g.speedup)}){mark}{note}", va="center", fontsize=8)
    ax.set_xlim(0, max(m + e for m, e in zip(means, stds)) * 1.45)
    ax.set_xlabel("Output throughput (tok/s), mean ± std\n"
                  "[letters]: within a model, bars that share a letter do not differ (see the report's Method)")
    ax.set_title(sc.heading())
    figures.save(fig, name)


def plot_grouped(groups: list[Group], names: dict, figures: Figures, name: str) -> None:
    plt = pyplot()
    scs = scenarios(groups)
    idents = list(dict.fromkeys(g.identity for g in groups))
    width = 0.8 / len(idents)
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(scs) + 0.15 * len(scs) * len(idents)), 4.5))
    for i, ident in enumerate(idents):
        xs, ys, es = [], [], []
        for x, sc in enumerate(scs):
            g = next((g for g in groups if g.identity == ident and g.scenario == sc), None)
            if g and g.mean("output_throughput"):
                xs.append(x - 0.4 + width * (i + 0.5))
                ys.append(g.mean("output_throughput"))
                es.append(g.std("output_throughput") or 0)
        ax.bar(xs, ys, width, yerr=es, capsize=2, label=names[ident])
    ax.set_xticks(range(len(scs)), [sc.tick() for sc in scs], fontsize=8)
    means = [g.mean("output_throughput") for g in groups]
    log = max(means) / min(means) > 10  # bs=1 bars would vanish next to bs=64 ones
    if log:
        ax.set_yscale("log")
    ax.set_ylabel("Output throughput (tok/s), mean ± std" + (", log scale" if log else ""))
    ax.set_title("Output throughput per scenario")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    figures.save(fig, name)


def annotated_scatter(points: list[tuple[str, float, float, float]], xlabel: str, ylabel: str, title: str,
                      figures: Figures, name: str) -> None:
    """points: (label, x, y, bubble area)."""
    plt = pyplot()
    # Tall enough for one label line per point in the label column.
    fig, ax = plt.subplots(figsize=(7.5, max(5.0, 1.5 + len(points) * LABEL_FONT * 1.6 / 72)))
    ax.scatter([p[1] for p in points], [p[2] for p in points], s=[p[3] for p in points], alpha=0.6)
    ax.margins(0.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    label_points(ax, [(label, x, y) for label, x, y, _ in points])
    figures.save(fig, name)


def label_points(ax, points: list[tuple[str, float, float]]) -> list:
    """Labels in a column right of the axes, each at its point's height where
    there is room and pushed apart where not, with a leader line to its point:
    labels never overlap, however close the points are. Returns the texts."""
    fig = ax.figure
    fig.canvas.draw()  # fixes the data limits, so data -> axes coordinates hold
    to_axes = ax.transData + ax.transAxes.inverted()
    heights = [to_axes.transform((x, y))[1] for _, x, y in points]
    gap = LABEL_FONT * 1.6 / 72 / (ax.get_position().height * fig.get_figheight())  # one line, in axes units
    slots = spread(heights, gap)
    return [ax.annotate(label, (x, y), xytext=(1.04, slot), textcoords="axes fraction", va="center",
                        fontsize=LABEL_FONT, annotation_clip=False,
                        arrowprops={"arrowstyle": "-", "color": "0.55", "lw": 0.6, "shrinkA": 2, "shrinkB": 4})
            for (label, x, y), slot in zip(points, slots)]


def spread(heights: list[float], gap: float) -> list[float]:
    """Positions as close to `heights` as possible, at least `gap` apart, in
    the same order, kept within [0, 1] when they fit."""
    order = sorted(range(len(heights)), key=lambda i: heights[i])
    pos = [min(max(heights[i], 0.0), 1.0) for i in order]
    for k in range(1, len(pos)):  # push up
        pos[k] = max(pos[k], pos[k - 1] + gap)
    if pos and pos[-1] > 1.0:  # then down from the top, when that overflowed
        pos[-1] = 1.0
        for k in range(len(pos) - 2, -1, -1):
            pos[k] = min(pos[k], pos[k + 1] - gap)
    out = [0.0] * len(heights)
    for i, p in zip(order, pos):
        out[i] = p
    return out


# --- serving under load ---------------------------------------------------------------------------------

def render_serving_plots(serving: ServingAnalysis | None, figures: Figures) -> None:
    """Per serving scenario: TTFT and TPOT percentile vs request throughput
    (one line per artifact and mode, the SLO bound as a line, the knee ○ and
    the highest level under the SLO ★), and goodput vs offered load."""
    if serving is None:
        return
    scs, slos, curves = serving.scenarios, serving.slos, serving.curves
    names = labels(serving.groups)
    for sc in scs:
        mine = [c for c in curves if c.scenario == sc and any(lv.get("request_throughput") for lv in c.levels)]
        if mine:
            plot_latency_curves(mine, names, sc, slos[sc], figures, f"serving_latency_{slug(sc, scs)}")
            plot_goodput(mine, names, sc, figures, f"serving_goodput_{slug(sc, scs)}")


def curve_label(c, names: dict) -> str:
    return names[c.group.identity] + (" (rate)" if c.mode == "rate" else "")


def curve_style(c, names: dict) -> dict:
    """One colour per artifact in every serving plot; rate curves dashed."""
    return {"color": f"C{list(names).index(c.group.identity) % 10}",
            "linestyle": "--" if c.mode == "rate" else "-"}


def plot_latency_curves(curves, names: dict, sc: Scenario, slo, figures: Figures, name: str) -> None:
    plt = pyplot()
    pct = slo.pct_key if slo else "p90"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, metric, title in zip(axes, ("ttft", "tpot"), ("TTFT", "TPOT")):
        key = f"{pct}_{metric}_ms"
        for c in curves:
            pts = [(lv.get("request_throughput"), lv.get(key), lv) for lv in c.levels
                   if lv.get("request_throughput") is not None and lv.get(key) is not None]
            if not pts:
                continue
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=curve_label(c, names),
                            **curve_style(c, names))
            knee, (best, _) = c.knee(), c.capacity()
            for lv, marker, size in ((knee, "o", 11), (best, "*", 15)):
                hit = next((p for p in pts if p[2] is lv), None)
                if hit:
                    ax.plot(hit[0], hit[1], marker=marker, markersize=size, color=line.get_color(),
                            markerfacecolor="none" if marker == "o" else line.get_color(), linestyle="none")
        bound = getattr(slo, f"{metric}_ms", None) if slo else None
        if bound:
            ax.axhline(bound, color="tab:red", linestyle="--", linewidth=1, label=f"SLO {title} {bound:g} ms")
        ax.set_xlabel("Request throughput (req/s)")
        ax.set_ylabel(f"{title} {pct} (ms)")
        ax.set_title(f"{title} {pct} vs throughput")
        ax.grid(alpha=0.3)
    axes[1].plot([], [], "o", markerfacecolor="none", color="0.3", label="knee (max throughput ÷ latency)")
    axes[1].plot([], [], "*", color="0.3", markersize=10, label="highest level under the SLO")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(f"Serving under load: {sc.heading()}" + (f"\nSLO {slo.describe()}" if slo else ""), fontsize=10,
                 y=1.04)
    figures.save(fig, name)


def plot_goodput(curves, names: dict, sc: Scenario, figures: Figures, name: str) -> None:
    plt = pyplot()
    modes = list(dict.fromkeys(c.mode for c in curves))
    fig, axes = plt.subplots(1, len(modes), figsize=(6.5 * len(modes) + 2, 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for c in [c for c in curves if c.mode == mode]:
            xs = [lv.level for lv in c.levels]
            good = [lv.get("request_goodput") for lv in c.levels]
            done = [lv.get("request_throughput") for lv in c.levels]
            color = curve_style(c, names)["color"]
            ax.plot(xs, [g if g is not None else float("nan") for g in good], marker="o", color=color,
                    label=f"{curve_label(c, names)}: goodput")
            ax.plot(xs, [d if d is not None else float("nan") for d in done], linestyle=":", color=color,
                    label=f"{curve_label(c, names)}: throughput")
        ax.set_xlabel("Offered request rate (req/s)" if mode == "rate" else "Concurrency (in-flight requests)")
        ax.set_ylabel("Requests per second")
        ax.set_title("Goodput (requests meeting the SLO) vs offered load")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(sc.heading(), fontsize=10, y=1.02)
    figures.save(fig, name)
