"""PNG plots: throughput per scenario (grouped and one per scenario), speed
vs size and speed vs accuracy. matplotlib is imported only when plotting."""
import os
import tempfile
from pathlib import Path

from evaluate.report.aggregate import (
    Group, accuracy_of, by_throughput, headline_accuracy_keys, labels, pareto_scenario, scenarios)
from evaluate.report.formatting import header, mb, speedup_text
from evaluate.scenarios import Scenario

LABEL_FONT = 8  # points
THROUGHPUT_AXIS = "Output throughput (tok/s), mean"


def render_plots(speed: list[Group], accuracy: list[Group], out_dir: Path, wanted: str | None) -> list[Path]:
    """Write every plot the groups allow; return their paths."""
    speed = [g for g in speed if g.mean("output_throughput")]
    if not speed:
        return []
    names = labels(speed)
    paths = [out_dir / "throughput.png"]
    plot_grouped(speed, names, paths[0])
    for sc in scenarios(speed):
        paths.append(out_dir / f"throughput_{slug(sc, scenarios(speed))}.png")
        plot_scenario([g for g in speed if g.scenario == sc], names, sc, paths[-1])
    sc = pareto_scenario(speed, wanted)
    chosen = [g for g in speed if g.scenario == sc]
    return paths + plot_size(chosen, names, sc, out_dir) + plot_accuracy(chosen, accuracy, names, sc, out_dir)


def plot_size(chosen: list[Group], names: dict, sc: Scenario, out_dir: Path) -> list[Path]:
    sized = [(names[g.identity], mb(g.model_bytes), g.mean("output_throughput"), 60) for g in chosen if g.model_bytes]
    if not sized:
        return []
    path = out_dir / "speed_vs_size.png"
    annotated_scatter(sized, "Model size (MB)", THROUGHPUT_AXIS, f"Speed vs size\n{sc.heading()}", path)
    return [path]


def plot_accuracy(chosen: list[Group], accuracy: list[Group], names: dict, sc: Scenario,
                  out_dir: Path) -> list[Path]:
    """Speed vs the first headline accuracy metric, bubble area by model size."""
    keys = headline_accuracy_keys(accuracy)
    if not keys:
        return []
    biggest = max((mb(g.model_bytes) or 0 for g in chosen), default=0) or 1
    scored = [(g, accuracy_of(accuracy, g)) for g in chosen]
    points = [(names[g.identity], a.mean(keys[0]), g.mean("output_throughput"),
               40 + 1200 * (mb(g.model_bytes) or 0) / biggest)
              for g, a in scored if a and a.mean(keys[0]) is not None]
    if not points:
        return []
    path = out_dir / "pareto.png"
    annotated_scatter(points, header(keys[0]), THROUGHPUT_AXIS,
                      f"Speed vs accuracy (bubble area ∝ model size)\n{sc.heading()}", path)
    return [path]


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, path: Path) -> None:
    """Save beside `path` under a temp name, then rename: readers never see half a PNG."""
    plt = pyplot()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


def slug(sc: Scenario, all_scenarios: list[Scenario]) -> str:
    """File-name part for a scenario: its name, plus its shape if the name repeats."""
    name = sc.name
    if sum(s.name == sc.name for s in all_scenarios) > 1:
        name += f"_bs{sc.batch_size}_in{sc.input_len}_out{sc.output_len}"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def plot_scenario(groups: list[Group], names: dict, sc: Scenario, path: Path) -> None:
    plt = pyplot()
    gs = [g for g in by_throughput(groups) if g.mean("output_throughput")][::-1]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(gs)))
    means = [g.mean("output_throughput") for g in gs]
    stds = [g.std("output_throughput") or 0 for g in gs]
    # Flagged speed-ups (see aggregate.add_speedups) in grey, with the reason.
    ax.barh([names[g.identity] for g in gs], means, xerr=stds, capsize=3,
            color=["0.7" if g.flag else "tab:blue" for g in gs])
    for y, (g, v, e) in enumerate(zip(gs, means, stds)):
        note = f", not ranked: {g.flag}" if g.flag else ""
        ax.text(v + e, y, f"  {v:.1f} ({speedup_text(g.speedup)}{note})", va="center", fontsize=8)
    ax.set_xlim(0, max(m + e for m, e in zip(means, stds)) * 1.35)
    ax.set_xlabel("Output throughput (tok/s), mean ± std")
    ax.set_title(sc.heading())
    save_png(fig, path)


def plot_grouped(groups: list[Group], names: dict, path: Path) -> None:
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
    save_png(fig, path)


def annotated_scatter(points: list[tuple[str, float, float, float]], xlabel: str, ylabel: str, title: str,
                      path: Path) -> None:
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
    save_png(fig, path)


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
