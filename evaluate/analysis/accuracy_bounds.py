"""95 % intervals of the accuracy figures, from the per-window and per-item
values accuracy rows keep (Row.accuracy_samples, evaluate.accuracy.Scores):
a percentile bootstrap that resamples the windows (perplexity, its
recovery, KL divergence, top-1 agreement) or the last-word items (last-word
accuracy and recovery), the artifact's and the reference's values together,
as both scored the same windows and items. The tokens of one window are not
independent, the windows are: so windows, not tokens, are resampled. Rows
written before these values were recorded have no interval. `recovery` is
a speed group's recovery as the answer and the serving recommendation
apply the accuracy floor to it."""
from dataclasses import dataclass
from typing import Callable

import numpy as np

from evaluate.analysis.groups import BASELINE, Group

RESAMPLES = 2000
SEED = 0   # fixed: the same store gives the same report


@dataclass(frozen=True)
class Statistic:
    """An accuracy metric as a function of the resampled sums of its unit's columns."""
    unit: str                                  # "window" or "item": what is resampled
    of: Callable[[dict[str, np.ndarray]], np.ndarray]


def _ratio_pct(top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(bottom > 0, 100 * top / np.where(bottom > 0, bottom, 1), np.nan)


STATISTICS = {
    "recovery_pct": Statistic("window", lambda s: 100 * np.exp((s["window_reference_nll"] - s["window_nll"])
                                                               / s["window_tokens"])),
    "perplexity": Statistic("window", lambda s: np.exp(s["window_nll"] / s["window_tokens"])),
    "kl_divergence": Statistic("window", lambda s: s["window_kl"] / s["window_tokens"]),
    "top1_agreement": Statistic("window", lambda s: s["window_top1"] / s["window_tokens"]),
    "lastword_accuracy": Statistic("item", lambda s: s["item_hits"] / s["items"]),
    "lastword_recovery_pct": Statistic("item", lambda s: _ratio_pct(s["item_hits"], s["item_reference_hits"])),
}
COLUMNS = {"window": ("window_nll", "window_reference_nll", "window_kl", "window_top1", "window_tokens"),
           "item": ("item_hits", "item_reference_hits")}


def add_bounds(accuracy: list[Group]) -> None:
    """Each accuracy group's sample_intervals, where its rows kept their per-window values."""
    for g in accuracy:
        samples = samples_of(g)
        g.sample_intervals = bounds(samples) if samples else {}


def samples_of(g: Group) -> dict[str, np.ndarray] | None:
    """The group's per-window and per-item columns: one row's, or the mean of
    several rows' where each scored the same windows and items (a repeated
    measurement, not more windows); None where a row lacks them."""
    kept = [r.accuracy_samples for r in g.runs]
    if not kept or not all(kept):
        return None
    columns = [c for unit in COLUMNS.values() for c in unit]
    if any(c not in k for k in kept for c in columns) or len({tuple(len(k[c]) for c in columns) for k in kept}) > 1:
        return None
    return {c: np.mean([np.asarray(k[c], dtype=float) for k in kept], axis=0) for c in columns}


def bounds(samples: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """metric -> its 95 % percentile-bootstrap interval."""
    rng = np.random.default_rng(SEED)
    sums = {unit: resampled_sums(samples, columns, rng) for unit, columns in COLUMNS.items()}
    out = {}
    for metric, stat in STATISTICS.items():
        if sums[stat.unit] is None:
            continue
        values = stat.of(sums[stat.unit])
        values = values[np.isfinite(values)]
        if len(values) >= RESAMPLES // 2:   # else the statistic is mostly undefined (no reference hit drawn)
            low, high = np.percentile(values, [2.5, 97.5])
            out[metric] = (float(low), float(high))
    return out


def resampled_sums(samples: dict[str, np.ndarray], columns: tuple[str, ...],
                   rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    """Each column's sum over RESAMPLES draws (with replacement) of its units; None with fewer than two units."""
    n = len(samples[columns[0]])
    if n < 2:
        return None
    draws = rng.integers(0, n, size=(RESAMPLES, n))
    return {c: samples[c][draws].sum(axis=1) for c in columns} | {"items": np.full(RESAMPLES, float(n))}



@dataclass(frozen=True)
class Recovery:
    """An artifact's accuracy recovery (%) beside its speed."""
    pct: float
    interval: tuple[float, float] | None    # 95 %, over the windows; None for rows without them
    measured: bool                          # False: the original without an accuracy row of its own


def recovery(accuracy: Group | None, g: Group) -> Recovery | None:
    """g's recovery from its accuracy group: measured where there is one (the
    original's own row measures the engine against the reference, its own
    weights: e.g. 99.9 %), else 100 % for the original by definition, else None."""
    if accuracy and accuracy.mean("recovery_pct") is not None:
        return Recovery(accuracy.mean("recovery_pct"), accuracy.sample_intervals.get("recovery_pct"), True)
    return Recovery(100.0, None, False) if g.recipe == BASELINE else None
