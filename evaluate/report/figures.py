"""Where the report's figures go and what every plot shares: a finished
figure goes to a `Figures`, PNG files in the report folder (`output=png`) or
SVG text kept for report.html (`output=html`); labels beside the axes that
never overlap; file names of scenarios. matplotlib is imported only when
plotting."""
import importlib.util
import io
import logging
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from evaluate.scenarios import Scenario
from quantize.common import atomic

LABEL_FONT = 8  # points

log = logging.getLogger("quantbench.report")


class Figures:
    """Where each finished figure goes, by its name (`throughput`, `pareto_interactive`, ...)."""

    def save(self, fig, name: str, footer: str = "") -> None:
        """`footer`: what the figure's numbers were measured with, for a file shared on its own."""
        raise NotImplementedError

    def save_drawn(self, draw: Callable[[Path], None], name: str) -> None:
        """A figure that `draw` writes to a file itself (its format by the path's suffix)."""
        raise NotImplementedError


@dataclass
class PngFiles(Figures):
    """<out_dir>/<name>.png, each written whole (see save_png), its footer
    under it: a PNG is shared alone, without the report that says what it measured."""
    out_dir: Path
    paths: list[Path] = field(default_factory=list)

    def save(self, fig, name: str, footer: str = "") -> None:
        self.paths.append(self.out_dir / f"{name}.png")
        if footer:
            add_footer(fig, footer)
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

    def save(self, fig, name: str, footer: str = "") -> None:   # the page's header says what was measured
        self.svgs[name] = svg_text(fig, name)

    def save_drawn(self, draw: Callable[[Path], None], name: str) -> None:
        with tempfile.TemporaryDirectory() as folder, \
                pyplot().rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
            path = Path(folder) / f"{name}.svg"
            draw(path)
            self.svgs[name] = inline_svg(path.read_text(), name)


def matplotlib_installed() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def have_matplotlib(what: str) -> bool:
    """Whether plots can be drawn; where not, one warning saying what goes without them."""
    if not matplotlib_installed():
        # the tables are the report; a machine without matplotlib (a bare CUDA image) still gets them
        log.warning(f"matplotlib is not installed: {what} has no plots (bash scripts/setup.sh installs it)")
        return False
    return True


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def add_footer(fig, text: str) -> None:
    """`text` in small grey under everything the figure draws (axis labels and
    notes included), left-aligned with it."""
    box = fig.get_tightbbox(fig.canvas.get_renderer())   # inches
    width, height = fig.get_size_inches()
    fig.text(box.x0 / width, (box.y0 - 0.08) / height, text, fontsize=LABEL_FONT - 1, color="#555555",
             ha="left", va="top")


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
    """File-name part for a scenario: its name, plus its shape if the name
    repeats as a file name ("chat.v2" and "chat_v2" are both chat_v2)."""
    name = _file_name(sc.name)
    if sum(_file_name(s.name) == name for s in all_scenarios) > 1:
        name += f"_bs{sc.batch_size}_in{sc.input_len}_out{sc.output_len}"
    return name


def _file_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


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
