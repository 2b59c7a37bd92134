"""The report's plots, planned once: each `Plot` has its file name, its
one-sentence caption, the table it illustrates (`place`) and how to draw it.
report.md shows each below its table with the caption under it (when
`output=png` writes the PNGs), report.html the same figure inline as SVG with
the caption as its figcaption, and `output=png` writes them all. Colours are
the recipes' (palette), the letters and picks those of evaluate.analysis.

Places: (SUMMARY, scenario) below that scenario's Summary table, (SUMMARY,
None) at the end of the Summary, (RANKING, scenario) below that scenario's
Ranking, (SERVING, scenario) below that scenario's load-level tables."""
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from evaluate.analysis import Analysis
from evaluate.analysis.choice import choose
from evaluate.analysis.groups import SPEED, Group, pareto_scenario, scenarios
from evaluate.analysis.load_levels import ServingAnalysis
from evaluate.report.config import OutputFormat, ReportConfig
from evaluate.report.figures import Figures, PngFiles, have_matplotlib, matplotlib_installed, slug
from evaluate.report.labels import labels
from evaluate.report.palette import recipe_colours
from evaluate.report.serving_plots import goodput_figure, latency_figure
from evaluate.report.speed_plots import overview_figure, pareto_figure, throughput_figure
from evaluate.report.stores_markdown import machine_labels, machine_text
from evaluate.results import machine_of

SUMMARY, RANKING, SERVING = "summary", "ranking", "serving"


@dataclass(frozen=True)
class Plot:
    name: str                       # <name>.png; report.html's <figure id="plot-<name>">
    title: str                      # the image's alt text
    caption: str                    # one sentence: what it shows and how to read it
    place: tuple                    # the table it illustrates (see the module's docstring)
    draw: Callable[[], object]      # its matplotlib figure; matplotlib is imported only then
    footer: str = ""                # what its numbers were measured with (measured_by), under a PNG


@dataclass
class Png(OutputFormat):
    """The PNG plots; none, with one warning, where matplotlib is not installed."""

    def draw(self, analysis: Analysis, report: ReportConfig) -> list[Path]:
        if not have_matplotlib("the report"):
            return []
        files = PngFiles(report.out_dir)
        draw_all(report_plots(analysis, report), files)
        return files.paths


def measured_by(groups: list[Group]) -> str:
    """What a plot of these groups shows was measured with: models, engines and their versions, machines."""
    rows = [r for g in groups for r in g.runs]

    def listed(values) -> str:
        return ", ".join(dict.fromkeys(v for v in values if v)) or "?"
    engines = listed(" ".join(filter(None, (r.engine, r.engine_version))) for r in rows)
    machines = listed(machine_text(machine_of(r.hardware)) for r in rows if r.hardware)
    return f"Measured: {listed(r.model_name for r in rows)}; engine {engines}; on {machines}"


def draw_all(plots: list["Plot"], figures: Figures) -> None:
    for p in plots:
        figures.save(p.draw(), p.name, p.footer)


def report_plots(analysis: Analysis, report: ReportConfig) -> list[Plot]:
    """Every plot the analysis allows, for the report's floor and pareto_scenario."""
    colours = recipe_colours(g.recipe for g in analysis.speed + analysis.accuracy + serving_groups(analysis.serving))
    return (speed_plots(analysis, report.accuracy_floor_pct, report.pareto_scenario, colours)
            + serving_plots(analysis.serving, colours))


def png_plots(analysis: Analysis, report: ReportConfig) -> list[Plot]:
    """The plots report.md shows: those `output=png` writes beside it (none without matplotlib)."""
    writes_pngs = any(isinstance(o, Png) for o in report.outputs) and matplotlib_installed()
    return report_plots(analysis, report) if writes_pngs else []


def figure_markdown(plots: list[Plot], place: tuple) -> list[str]:
    """report.md's lines for the plots of one place: each image, its caption in italics under it."""
    out = []
    for p in plots:
        if p.place == place:
            out += ["", f"![{p.title}]({p.name}.png)", "", f"*{p.caption}*"]
    return out


def serving_groups(serving: ServingAnalysis | None) -> list:
    return serving.groups if serving else []


def speed_plots(analysis: Analysis, floor_pct: float, wanted: str | None, colours: dict[str, str]) -> list[Plot]:
    """Per scenario its Ranking's bars and its Pareto plot (only `wanted`'s where one is
    named), then every scenario's bars side by side."""
    speed = [g for g in analysis.speed if g.mean(SPEED)]
    if not speed:
        return []
    names, scs = labels(analysis.speed), scenarios(speed)
    pareto_scs = [pareto_scenario(speed, wanted)] if wanted else scs
    choices = choose(analysis.speed, analysis.accuracy, floor_pct)
    machines = machine_labels(speed)
    plots = []
    for sc in scs:
        mine = [r for r in analysis.rankings if r.scenario == sc]
        footer = measured_by([g for g in speed if g.scenario == sc])
        plots.append(Plot(
            f"throughput_{slug(sc, scs)}", f"Output throughput, {sc.name}",
            f"Mean output throughput (tok/s) of each artifact in {sc.name}, fastest on top, on a linear axis from 0 "
            "with its 95 % interval as whiskers; bars that share a letter do not differ by the rule in Method and "
            "setups (grey: a single run, not ranked).",
            (RANKING, sc), lambda mine=mine, sc=sc: throughput_figure(mine, names, colours, sc, machines), footer))
        measured = [c for c in choices if c.scenario == sc and c.measured]
        if sc in pareto_scs and measured:
            plots.append(Plot(
                f"pareto_{slug(sc, scs)}", f"Speed against accuracy, {sc.name}",
                f"Output throughput (tok/s) against accuracy recovery (%) in {sc.name}: marker area is model size, "
                "the solid line the Pareto front (no artifact is both faster and more accurate than a point on it), "
                f"the dashed line the {floor_pct:g} % floor and the ring the answer's pick; whiskers are 95 % "
                "intervals.",
                (SUMMARY, sc), lambda measured=measured, sc=sc: pareto_figure(measured, names, colours, sc, machines),
                footer))
    plots.append(Plot(
        "throughput", "Output throughput per scenario",
        "Mean output throughput (tok/s) per scenario, one panel each on its own linear axis from 0, whiskers the "
        "95 % interval of the mean and letters as in the Ranking; a recipe has the same colour in every plot.",
        (SUMMARY, None), lambda: overview_figure(analysis.rankings, names, colours, machines), measured_by(speed)))
    return plots


def serving_plots(serving: ServingAnalysis | None, colours: dict[str, str]) -> list[Plot]:
    """Per serving scenario with measured levels: latency and goodput against load."""
    if serving is None:
        return []
    names, scs, plots = labels(serving.groups), serving.scenarios, []
    for sc in scs:
        mine = [c for c in serving.curves if c.scenario == sc and any(lv.get("request_throughput") for lv in c.levels)]
        if not mine:
            continue
        slo = serving.slos[sc]
        pct = slo.pct_key if slo else "p90"
        footer = measured_by([c.group for c in mine])
        plots += [
            Plot(f"serving_latency_{slug(sc, scs)}", f"Latency under load, {sc.name}",
                 f"TTFT and TPOT {pct} (ms) against achieved request throughput (req/s) in {sc.name}, a line per "
                 "artifact (dashed: rate mode), the SLO bound dashed red, ○ the knee and ★ the highest level under "
                 "the SLO.",
                 (SERVING, sc), lambda mine=mine, sc=sc, slo=slo: latency_figure(mine, names, colours, sc, slo),
                 footer),
            Plot(f"serving_goodput_{slug(sc, scs)}", f"Goodput under load, {sc.name}",
                 f"Goodput (requests meeting the SLO per second, solid) and achieved throughput (dotted) against "
                 f"the offered load in {sc.name}: where goodput falls below throughput, requests miss the SLO.",
                 (SERVING, sc), lambda mine=mine, sc=sc: goodput_figure(mine, names, colours, sc), footer)]
    return plots
