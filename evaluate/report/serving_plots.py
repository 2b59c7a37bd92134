"""The serving plots (evaluate.analysis.load_levels), each returning its
matplotlib figure: TTFT and TPOT percentile against request throughput (one
line per artifact and mode, the SLO bound as a line, the knee ○ and the
highest level under the SLO ★), and goodput against offered load."""
from evaluate.analysis.load_levels import Curve
from evaluate.report.figures import pyplot
from evaluate.report.palette import FLOOR_COLOUR
from evaluate.scenarios import Scenario


def curve_label(c: Curve, names: dict) -> str:
    return names[c.group.identity] + (" (rate)" if c.mode == "rate" else "")


def curve_style(c: Curve, colours: dict[str, str]) -> dict:
    """The recipe's colour, as in every plot; rate curves dashed."""
    return {"color": colours[c.group.recipe], "linestyle": "--" if c.mode == "rate" else "-"}


def latency_figure(curves: list[Curve], names: dict, colours: dict[str, str], sc: Scenario, slo):
    plt = pyplot()
    pct = slo.pct_key if slo else "p90"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, metric, title in zip(axes, ("ttft", "tpot"), ("TTFT", "TPOT")):
        key = f"{pct}_{metric}_ms"
        for c in curves:
            pts = [(lv.get("request_throughput"), lv.get(key), lv) for lv in c.levels
                   if lv.get("request_throughput") is not None and lv.get(key) is not None]
            if pts:
                draw_curve(ax, c, pts, names, colours)
        bound = getattr(slo, f"{metric}_ms", None) if slo else None
        if bound:
            ax.axhline(bound, color=FLOOR_COLOUR, linestyle="--", linewidth=1, label=f"SLO {title} {bound:g} ms")
        ax.set_xlabel("Request throughput (req/s)")
        ax.set_ylabel(f"{title} {pct} (ms)")
        ax.set_title(f"{title} {pct} vs throughput")
        ax.grid(alpha=0.3)
    axes[1].plot([], [], "o", markerfacecolor="none", color="0.3", label="knee (max throughput ÷ latency)")
    axes[1].plot([], [], "*", color="0.3", markersize=10, label="highest level under the SLO")
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(f"Serving under load: {sc.heading()}" + (f"\nSLO {slo.describe()}" if slo else ""), fontsize=10,
                 y=1.04)
    return fig


def draw_curve(ax, c: Curve, pts: list[tuple], names: dict, colours: dict[str, str]) -> None:
    """One curve's points, its knee ringed and its highest level under the SLO starred."""
    line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=curve_label(c, names),
                    **curve_style(c, colours))
    knee, (best, _) = c.knee(), c.capacity()
    for lv, marker, size in ((knee, "o", 11), (best, "*", 15)):
        hit = next((p for p in pts if p[2] is lv), None)
        if hit:
            ax.plot(hit[0], hit[1], marker=marker, markersize=size, color=line.get_color(),
                    markerfacecolor="none" if marker == "o" else line.get_color(), linestyle="none")


def goodput_figure(curves: list[Curve], names: dict, colours: dict[str, str], sc: Scenario):
    plt = pyplot()
    modes = list(dict.fromkeys(c.mode for c in curves))
    fig, axes = plt.subplots(1, len(modes), figsize=(6.5 * len(modes) + 2, 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for c in [c for c in curves if c.mode == mode]:
            xs = [lv.level for lv in c.levels]
            good = [lv.get("request_goodput") for lv in c.levels]
            done = [lv.get("request_throughput") for lv in c.levels]
            color = curve_style(c, colours)["color"]
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
    return fig
