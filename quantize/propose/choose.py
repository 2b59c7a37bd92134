"""Choosing k, the number of most sensitive module groups kept dense.

KL is taken as additive over groups: each group quantized alone adds its own
KL, so keeping it dense removes that share. The total is the recipe applied
everywhere (the sensitivity file's baseline_kl, else the sum of the groups'
own KL); where both are known and differ (the groups interact), each group's
share is scaled by baseline_kl / sum, so that keeping every group dense
estimates 0. The evaluate stage measures the truth.

A group kept dense takes the other shards of its fused matrix along (q/k/v,
gate/up: vLLM loads each fused matrix with one scheme), so k counts groups in
sensitivity order and the recipe keeps those and their fused siblings."""
from dataclasses import dataclass

from quantize.common.errors import UserError
from quantize.common.sensitivity_file import Cell, Sensitivity

MB = 1e6
# A target typed in decimals meets a sum of floats: equal within this counts as within.
ROUNDING = 1e-9


@dataclass(frozen=True)
class Estimate:
    k: int                # groups kept dense, the most sensitive first
    kl_nats: float        # estimated KL per token against the original
    size_bytes: float     # estimated artifact size on disk


def estimates(sensitivity: Sensitivity, uniform_bytes: float, dense_cost: dict[tuple[int, str], float]) -> list[Estimate]:
    """The estimate for every k from 0 (the base recipe) to all groups.
    `dense_cost`: bytes a cell (layer, group) adds when kept dense."""
    scale, total = interaction_scale(sensitivity), sum(c.kl for c in sensitivity.cells)
    out = [Estimate(0, base_kl(sensitivity), uniform_bytes)]
    for k, kept in enumerate(kept_sets(sensitivity)[1:], 1):
        still_quantized = 0.0 if len(kept) == len(sensitivity.cells) else total - sum(c.kl for c in kept)
        out.append(Estimate(k, scale * max(0.0, still_quantized),
                            uniform_bytes + sum(dense_cost[(c.layer, c.group)] for c in kept)))
    return out


def kept_sets(sensitivity: Sensitivity) -> list[list[Cell]]:
    """For each k, the cells kept dense (Sensitivity.kept_dense: with their fused siblings)."""
    return [sensitivity.kept_dense(k) for k in range(len(sensitivity.cells) + 1)]


def base_kl(sensitivity: Sensitivity) -> float:
    """KL of the recipe applied to every group (nats per token)."""
    if sensitivity.baseline_kl is not None:
        return float(sensitivity.baseline_kl)
    return sum(c.kl for c in sensitivity.cells)


def interaction_scale(sensitivity: Sensitivity) -> float:
    """baseline_kl / the sum of the groups' own KL: 1 where KL adds up exactly."""
    total = sum(c.kl for c in sensitivity.cells)
    return base_kl(sensitivity) / total if total > 0 else 1.0


def for_max_kl(options: list[Estimate], max_kl: float) -> Estimate:
    """The smallest k whose estimated KL is within max_kl (k = all estimates 0, so one always is)."""
    return min((e for e in options if e.kl_nats <= max_kl * (1 + ROUNDING)), key=lambda e: e.k)


def for_max_size(options: list[Estimate], max_size_mb: float) -> Estimate:
    """The largest k whose estimated size is within max_size_mb."""
    fit = [e for e in options if e.size_bytes <= max_size_mb * MB * (1 + ROUNDING)]
    if not fit:
        smallest = min(options, key=lambda e: e.size_bytes)
        raise UserError(f"max_size_mb={max_size_mb:g} MB is out of reach: the base recipe alone takes "
                        f"{smallest.size_bytes / MB:.2f} MB (k=0); use max_size_mb={_up(smallest.size_bytes / MB)} or more")
    return max(fit, key=lambda e: e.k)


def for_kept_dense(options: list[Estimate], k: int) -> Estimate:
    if not 0 <= k < len(options):
        raise UserError(f"kept_dense={k} is out of range: the sensitivity file has {len(options) - 1} groups; "
                        f"choose kept_dense=0..{len(options) - 1}")
    return options[k]


def _up(value: float) -> str:
    """A value just above `value`, in 4 significant digits, so that it is reachable."""
    text = f"{value:.4g}"
    return text if float(text) >= value else f"{value * 1.0001:.4g}"


def kept_modules(sensitivity: Sensitivity, k: int) -> list[str]:
    """The module names the recipe keeps dense for k."""
    return [m for cell in kept_sets(sensitivity)[k] for m in cell.modules]
