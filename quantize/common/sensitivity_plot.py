"""The sensitivity heat map: decoder layers across, module groups down, the
colour of a cell its KL (nats per scored token) on a log scale. Drawn by
`python -m quantize.sensitivity` beside its file, and by the report."""
import io
from pathlib import Path

from quantize.common import atomic
from quantize.common.errors import UserError
from quantize.common.sensitivity_file import Sensitivity

FORMATS = (".png", ".svg")
UNITS = "KL (nats/token)"


def draw_heatmap(sensitivity: Sensitivity, path: Path) -> None:
    """Write the heat map to `path` (.png or .svg, from its suffix), atomically."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise UserError(f"cannot draw a heat map to {path.name}: name a {' or '.join(FORMATS)} file")
    import matplotlib
    figure = _figure(sensitivity)
    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG text stays text: searchable, smaller
        figure.savefig(buffer, format=path.suffix[1:], bbox_inches="tight", dpi=120)
    atomic.write_bytes(path, buffer.getvalue())


def _figure(sensitivity: Sensitivity):
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    layers, groups = sensitivity.layers(), sensitivity.groups()
    grid = np.full((len(groups), len(layers)), np.nan)
    for cell in sensitivity.cells:
        grid[groups.index(cell.group), layers.index(cell.layer)] = cell.kl
    positive = grid[grid > 0]
    low = float(positive.min()) if positive.size else 1e-9
    high = max(float(positive.max()) if positive.size else low, low * 10)
    # A KL of 0 (or a rounding error below it) shows as the scale's lowest colour.
    shown = np.where(np.isnan(grid), np.nan, np.clip(grid, low, None))

    figure = Figure(figsize=(max(6.0, 0.32 * len(layers) + 3), max(2.5, 0.42 * len(groups) + 1.4)))
    axes = figure.add_subplot()
    image = axes.imshow(np.ma.masked_invalid(shown), aspect="auto", cmap="viridis",
                        norm=LogNorm(vmin=low, vmax=high), interpolation="nearest")
    axes.set_xticks(range(len(layers)), [str(layer) for layer in layers], fontsize=7)
    axes.set_yticks(range(len(groups)), groups, fontsize=8)
    axes.set_xlabel("decoder layer")
    axes.set_title(f"{sensitivity.model_name}, {sensitivity.scheme_key} (weights only): "
                   f"KL of each module quantized alone", fontsize=9)
    figure.colorbar(image, ax=axes, label=UNITS)
    return figure
