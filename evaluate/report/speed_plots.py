"""The speed plots, each returning its matplotlib figure: throughput per
scenario as bars on a linear axis from 0 with 95 % interval whiskers and the
Ranking's letters (one scenario, or every scenario in panels), and speed
against accuracy recovery per scenario with its Pareto front, the accuracy
floor and the answer's pick. What they show comes from evaluate.analysis
(rankings, choices): no plot decides anything itself."""
import math

from evaluate.analysis.choice import Choice
from evaluate.analysis.groups import SPEED, Group
from evaluate.analysis.ranking import ScenarioRanking
from evaluate.report.figures import LABEL_FONT, label_points, pyplot
from evaluate.report.formatting import mb, speedup_text
from evaluate.report.palette import FLOOR_COLOUR, FRONT_COLOUR, PICK_COLOUR, UNTESTED_COLOUR
from evaluate.scenarios import Scenario

THROUGHPUT_AXIS = "Output throughput (tok/s)"
MARKER_AREA = (40, 600)   # points^2: a model of size 0, and what the largest model adds
PANEL_COLUMNS = 3         # the overview's panels per row
BAR_ROOM = 1.5            # x axis up to this x the longest whisker: room for the text beside the bars
# A Pareto panel, in inches: its axes at least this tall, the room above them
# for the title, the gap below them for the tick labels and the axis label, and
# the room below that for the legend (three rows, the largest size marker).
PARETO_AXES_IN, PARETO_TITLE_IN, PARETO_XLABEL_IN, PARETO_LEGEND_IN = 3.6, 0.5, 0.55, 1.15


def ranked_entries(rankings: list[ScenarioRanking]) -> list[tuple[Group, str | None]]:
    """(group, letters) top down as the Ranking lists them; letters None for a single run."""
    return [(r.group, r.letters) for ranking in rankings for r in ranking.ranked] + [
        (g, None) for ranking in rankings for g in ranking.untested]


def whisker(g: Group) -> tuple[float, float]:
    """How far the 95 % interval of the mean reaches below and above it; (0, 0) for a single run."""
    mean, ci = g.mean(SPEED), g.interval(SPEED)
    return (mean - ci[0], ci[1] - mean) if ci else (0.0, 0.0)


def entry_text(g: Group, letters: str | None, detail: bool) -> str:
    """What a bar says beside it: the mean, with detail the speed-up and a flag, and its letters."""
    text = f"{g.mean(SPEED):.1f}"
    if detail:
        text += f" ({speedup_text(g.speedup)})"
    if letters is None:
        return text + ", not ranked: a single run"
    return text + f" [{letters}]" + (f", ⚠ {g.flag}" if detail and g.flag else "")


def throughput_bars(ax, rankings: list[ScenarioRanking], names: dict, colours: dict[str, str], detail: bool) -> None:
    """One scenario's entries as horizontal bars, fastest on top, each in its recipe's colour
    (grey: a single run) with its 95 % interval as a whisker."""
    entries = ranked_entries(rankings)[::-1]
    means = [g.mean(SPEED) for g, _ in entries]
    below, above = zip(*(whisker(g) for g, _ in entries))
    ax.barh([names[g.identity] for g, _ in entries], means, xerr=[below, above], capsize=3,
            color=[colours[g.recipe] if m is not None else UNTESTED_COLOUR for g, m in entries],
            error_kw={"elinewidth": 1, "ecolor": "black"})
    for y, ((g, marks), mean, reach) in enumerate(zip(entries, means, above)):
        ax.annotate(entry_text(g, marks, detail), (mean + reach, y), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=LABEL_FONT)  # an offset, not leading spaces: SVG collapses those
    ax.set_xlim(0, max(m + a for m, a in zip(means, above)) * BAR_ROOM)
    ax.tick_params(axis="y", labelsize=LABEL_FONT)
    ax.grid(axis="x", alpha=0.3)


def block_title(model_name: str, store, several: bool, machine: str | None = None) -> str:
    """A panel's model, store and machine (its name in stores_markdown.machine_labels, where a
    store holds several), where a figure holds several panels (each lettered on its own)."""
    where = (f", store {store.name}" if store else "") + (f", machine {machine}" if machine else "")
    return f"\n{model_name}" + where if several else ""


def throughput_figure(rankings: list[ScenarioRanking], names: dict, colours: dict[str, str], sc: Scenario,
                      machines: dict[str, str]):
    """One scenario's Ranking as bars with letters, a panel per model, store and machine:
    letters are given within one, so bars of two panels never share a scale of them."""
    plt = pyplot()
    several = len(rankings) > 1
    heights = [1.2 * several + 0.45 * len(ranked_entries([r])) for r in rankings]
    fig, axes = plt.subplots(len(rankings), 1, squeeze=False, figsize=(8, 1.2 + sum(heights)),
                             gridspec_kw={"height_ratios": heights} if several else None)
    for ax, ranking in zip(axes[:, 0], rankings):
        throughput_bars(ax, [ranking], names, colours, detail=True)
        ax.set_title(sc.heading() + block_title(ranking.model_name, ranking.store, several,
                                                machines.get(ranking.machine)), fontsize=10)
    axes[-1, 0].set_xlabel(f"{THROUGHPUT_AXIS}: mean, whiskers its 95 % interval\n"
                           "[letters]: bars that share a letter do not differ (the rule in Method and setups)")
    if several:
        fig.tight_layout()
    return fig


def overview_figure(rankings: list[ScenarioRanking], names: dict, colours: dict[str, str],
                    machines: dict[str, str]):
    """Every scenario's bars, a panel each (and per model, store and machine) on its own linear axis."""
    plt = pyplot()
    several = len({(r.model_name, r.store, r.machine) for r in rankings}) > 1
    columns = min(PANEL_COLUMNS, len(rankings))
    rows = math.ceil(len(rankings) / columns)
    tallest = max(len(ranked_entries([r])) for r in rankings)
    fig, axes = plt.subplots(rows, columns, squeeze=False, figsize=(4.6 * columns, (1.0 + 0.32 * tallest) * rows))
    for ax, ranking in zip(axes.flat, rankings):
        throughput_bars(ax, [ranking], names, colours, detail=False)
        ax.set_title(ranking.scenario.tick().replace("\n", ": ")
                     + block_title(ranking.model_name, ranking.store, several, machines.get(ranking.machine)),
                     fontsize=9)
        ax.set_xlabel(f"{THROUGHPUT_AXIS}, 95 % interval", fontsize=LABEL_FONT)
    for ax in list(axes.flat)[len(rankings):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def marker_area(model_bytes: int | None, biggest_mb: float) -> float:
    return MARKER_AREA[0] + MARKER_AREA[1] * (mb(model_bytes) or 0) / biggest_mb


def pareto_figure(choices: list[Choice], names: dict, colours: dict[str, str], sc: Scenario,
                  machines: dict[str, str]):
    """Speed against accuracy recovery, a panel per model, store and machine (`choices` of one scenario
    with a recovery measured)."""
    plt = pyplot()
    biggest = max((mb(p.group.model_bytes) or 0 for c in choices for p in c.measured), default=0) or 1.0
    tallest = max(len(c.measured) for c in choices)
    axes_in = max(PARETO_AXES_IN, tallest * LABEL_FONT * 1.6 / 72 + 0.6)   # room for every point's label
    around_in = PARETO_TITLE_IN + PARETO_XLABEL_IN + PARETO_LEGEND_IN
    height = len(choices) * (axes_in + around_in)
    fig, axes = plt.subplots(len(choices), 1, squeeze=False, figsize=(7.5, height))
    # in inches, not fractions of the figure: the legend below a panel clears its axis label and the next
    # panel's title however many panels there are (and before label_points reads the axes' size)
    fig.subplots_adjust(top=1 - PARETO_TITLE_IN / height, bottom=(around_in - PARETO_TITLE_IN) / height,
                        hspace=around_in / axes_in)
    several = len(choices) > 1
    for ax, c in zip(axes[:, 0], choices):
        pareto_panel(ax, c, names, colours, biggest, legend_at=-PARETO_XLABEL_IN / axes_in)
        ax.set_title(sc.heading() + block_title(c.model_name, c.store, several, machines.get(c.machine)),
                     fontsize=10)
    return fig


def pareto_panel(ax, c: Choice, names: dict, colours: dict[str, str], biggest_mb: float,
                 legend_at: float = -0.14) -> None:
    """The measured artifacts as points (area: model size; whiskers: 95 % intervals), the
    front as a staircase, the floor as a dashed line, the pick ringed, each point labelled;
    the legend's top `legend_at` (axes fraction) below the axes."""
    for p in c.measured:
        g = p.group
        x, y = p.recovery_pct, g.mean(SPEED)
        xerr = [[x - p.recovery.interval[0]], [p.recovery.interval[1] - x]] if p.recovery.interval else None
        ax.errorbar(x, y, xerr=xerr, yerr=[[v] for v in whisker(g)], fmt="none", ecolor=colours[g.recipe],
                    elinewidth=0.9, alpha=0.8, zorder=2)
        ax.scatter(x, y, s=marker_area(g.model_bytes, biggest_mb), color=colours[g.recipe], alpha=0.85,
                   edgecolors="white", linewidths=0.6, zorder=3)
    front = sorted(c.front, key=lambda p: p.recovery_pct)
    ax.step([p.recovery_pct for p in front], [p.group.mean(SPEED) for p in front], where="pre",
            color=FRONT_COLOUR, linewidth=1, zorder=1)
    ax.axvline(c.floor_pct, color=FLOOR_COLOUR, linestyle="--", linewidth=1)
    if c.pick:
        g = c.pick.group
        ax.scatter(c.pick.recovery_pct, g.mean(SPEED), s=marker_area(g.model_bytes, biggest_mb) * 2.4,
                   facecolors="none", edgecolors=PICK_COLOUR, linewidths=1.5, zorder=4)
    ax.margins(0.15)
    left, right = ax.get_xlim()
    ax.set_xlim(min(left, c.floor_pct - 0.5), max(right, c.floor_pct + 0.5))
    ax.set_xlabel("Accuracy recovery (%): mean, whiskers its 95 % interval")
    ax.set_ylabel(f"{THROUGHPUT_AXIS}, 95 % interval")
    ax.grid(alpha=0.3)
    ax.legend(handles=pareto_legend(c, names, biggest_mb), fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, legend_at), ncol=2, frameon=False, labelspacing=1.6, columnspacing=2.5)
    label_points(ax, [(names[p.group.identity], p.recovery_pct, p.group.mean(SPEED)) for p in c.measured])


def pareto_legend(c: Choice, names: dict, biggest_mb: float) -> list:
    """What the marks mean, the smallest and the largest model's marker, and what is not drawn."""
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=FRONT_COLOUR, linewidth=1, label="Pareto front"),
               Line2D([], [], color=FLOOR_COLOUR, linestyle="--", linewidth=1,
                      label=f"accuracy floor {c.floor_pct:g} %")]
    if c.pick:
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=12, markerfacecolor="none",
                              markeredgecolor=PICK_COLOUR, markeredgewidth=1.5,
                              label=f"the answer: {names[c.pick.group.identity]}"))
    known = sorted({round(mb(p.group.model_bytes), 1) for p in c.measured if p.group.model_bytes})
    for size in dict.fromkeys(known[:1] + known[-1:]):
        handles.append(Line2D([], [], linestyle="none", marker="o", color="0.6", alpha=0.6,
                              markersize=math.sqrt(marker_area(size * 1e6, biggest_mb)),  # diameter: √area
                              label=f"model size {size:g} MB"))
    if c.no_accuracy:
        handles.append(Line2D([], [], linestyle="none", label="not drawn, no accuracy run: "
                              + ", ".join(names[g.identity] for g in c.no_accuracy)))
    return handles
