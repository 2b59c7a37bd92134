"""report.md's accuracy parts: what each accuracy figure is (metric,
reference, windows and tokens or items), the Accuracy section with each
figure's 95 % interval over the windows or items (accuracy_bounds), and the
recovery cell the Summary and the answer share."""
import json

from evaluate.analysis.accuracy_bounds import RESAMPLES, STATISTICS, Recovery
from evaluate.analysis.groups import BASELINE, Group, accuracy_keys, scenarios
from evaluate.analysis.significance import on_its_side
from evaluate.report.formatting import MISSING, fmt_number, header, label, mb, md_table, fmt_fixed, short, unit
from evaluate.report.labels import in_table, labels

RECOVERY_HEADER = f"{label('recovery_pct')} (%, 95% CI)"


def recovery_cell(found: Recovery | None, floor_pct: float | None = None) -> str:
    """`97.0 (96.1–97.8)`: the recovery and its interval over the windows;
    the original without a row of its own is 100 by definition. Beside a
    verdict on `floor_pct`, each figure stays on its side of the floor."""
    if found is None:
        return MISSING
    text = pct_text(found.pct, floor_pct) + (f" ({recovery_interval_text(found.interval, floor_pct)})"
                                             if found.interval else "")
    return text if found.measured else f"{text} (by definition)"


def recovery_interval_text(interval: tuple[float, float], floor_pct: float | None = None) -> str:
    """A recovery's 95 % interval, each bound on its side of `floor_pct` where one is given."""
    return f"{pct_text(interval[0], floor_pct)}–{pct_text(interval[1], floor_pct)}"


def pct_text(x: float, floor_pct: float | None) -> str:
    return f"{x:.1f}" if floor_pct is None else on_its_side(x, floor_pct, 1)


def figure_cell(g: Group, metric: str) -> str:
    """An accuracy figure: the mean with its interval over the windows or
    items where the rows kept them, else mean ± std over the rows."""
    mean, std, interval = g.mean(metric), g.std(metric), g.sample_intervals.get(metric)
    if mean is None:
        return MISSING
    if interval:
        return f"{fmt_number(mean)} ({fmt_number(interval[0])}–{fmt_number(interval[1])})"
    return fmt_number(mean) if std is None else f"{fmt_number(mean)} ± {fmt_number(std)}"


def figure_header(metric: str) -> str:
    """A header; a figure the bootstrap bounds says so."""
    if metric not in STATISTICS:
        return header(metric)
    u = unit(metric)
    return f"{label(metric)} ({u + ', ' if u else ''}95% CI)"


def by_recipe(groups: list[Group]) -> list[Group]:
    """Per model, the baseline first, then recipes by name."""
    return sorted(groups, key=lambda g: (g.model_name, g.recipe != BASELINE, g.recipe))


def render_accuracy(accuracy: list[Group]) -> str:
    """Per eval set: what its figures are, then a table of them."""
    out = ["## Accuracy"]
    keys = accuracy_keys(accuracy)
    names = labels(accuracy)
    heads = ["Model", "Recipe", "Artifact", "Engine", "Model size (MB)", "Rows (n)"] + [figure_header(k) for k in keys]
    for sc in scenarios(accuracy):
        here = by_recipe([g for g in accuracy if g.scenario == sc])
        rows = [[g.model_name, in_table(names, g), f"`{short(g.artifact_id)}`", g.engine,
                 fmt_fixed(mb(g.model_bytes), 1), str(len(g.runs))] + [figure_cell(g, k) for k in keys]
                for g in here]
        out += ["", f"### {sc.heading()}", ""] + definition_lines(here) + ["", md_table(heads, rows)]
    return "\n".join(out)


def definition_lines(groups: list[Group]) -> list[str]:
    """What the eval set's figures are, from what its rows recorded (each
    distinct accuracy config and reference setup once)."""
    rows = [r for g in groups for r in g.runs]
    first = next((r.metrics for r in rows if "scored_tokens" in r.metrics), rows[0].metrics if rows else {})
    measured = {k for g in groups for k in g.stats}
    lines = []
    if measured & {"perplexity", "kl_divergence", "top1_agreement", "recovery_pct"}:
        lines += [f"- Perplexity, KL divergence and top-1 agreement: {windows_text(c, m)}, from the engine's "
                  f"prompt logprobs{topk_text(m)}, against the reference: {reference_text(c, m)}."
                  for c, m in reference_setups(rows) or [({}, first)]]
        lines.append("- Accuracy recovery (%) = the reference's perplexity ÷ the artifact's × 100. The original's "
                     "own row measures the engine against the reference (its own weights), so it shows the "
                     "engine's numerics rather than 100.")
    if measured & {"lastword_accuracy", "lastword_recovery_pct"}:
        tasks = {items_text(c, m): None for c, m in reference_setups(rows)} or {items_text({}, first): None}
        lines.append(f"- Last-word accuracy: {'; or '.join(tasks)}; right when greedy decoding gives every "
                     "token of the paragraph's last word. Last-word recovery (%) = the artifact's ÷ the "
                     f"reference's × 100{per_item(groups)}.")
    return lines + [f"- 95% CI: percentile bootstrap ({RESAMPLES} resamples) over the windows, or the items for the "
                    "last word, artifact and reference resampled together; a few windows give a rough interval."
                    + without_samples(groups)]


def windows_text(config: dict, metrics: dict) -> str:
    n, length = config.get("num_windows"), config.get("window_len")
    text = config.get("text")
    books = f" ({', '.join(config['books'])})" if text == "austen" and config.get("books") else ""
    where = f" of the held-out text `{text}`{books}" if text else " of held-out text"
    size = f"{n} windows × {length} tokens" if n and length else (
        f"{int(metrics['windows'])} windows" if isinstance(metrics.get("windows"), (int, float)) else "windows")
    scored = metrics.get("scored_tokens")
    return size + where + (f", {int(scored):,} scored tokens" if isinstance(scored, (int, float)) else "")


def topk_text(metrics: dict) -> str:
    k = metrics.get("top_k")
    return f" (top-{int(k)}; KL exact on the partition {{each returned token, the rest}}: a lower bound)" if k else ""


def reference_setups(rows) -> list[tuple[dict, dict]]:
    """(accuracy config, one of its rows' metrics) per config and reference
    dtype and device the rows recorded: one config run on a GPU host and on a
    CPU one meets the base model in other dtypes, which moves the figures."""
    setups = {}
    for r in sorted(rows, key=lambda r: "scored_tokens" not in r.metrics):   # rows with every metric first
        if r.accuracy_config:
            key = [r.accuracy_config, r.metrics.get("reference_dtype"), reference_device(r.accuracy_config, r.metrics)]
            setups.setdefault(json.dumps(key, sort_keys=True), (r.accuracy_config, r.metrics))
    return list(setups.values())


def reference_device(config: dict, metrics: dict) -> str | None:
    """Where the reference ran; rows before it was recorded: their config's
    device, unless `auto` (the GPU where there was one)."""
    device = metrics.get("reference_device") or config.get("reference_device")
    return device if isinstance(device, str) and device != "auto" else None


def reference_text(config: dict, metrics: dict) -> str:
    who = f"`{config['reference']}`" if config.get("reference") else "the artifact's unquantized base model"
    dtype, device = metrics.get("reference_dtype"), reference_device(config, metrics)
    how = [x for x in (dtype if isinstance(dtype, str) else None, device and f"on {device}") if x]
    return f"{who} in transformers" + (f" ({', '.join(how)})" if how else "")


def items_text(config: dict, metrics: dict) -> str:
    """One accuracy config's last-word task (each config its own: a report
    of two sizes named the first's for both)."""
    items = metrics.get("lastword_items")
    lw = config.get("lastword") or {}
    n = int(items) if isinstance(items, (int, float)) else lw.get("num_items")
    shape = (f" of ≥ {lw['min_words']} words, the last {lw['context_tokens']} tokens as context"
             if lw.get("min_words") and lw.get("context_tokens") else "")
    return f"{n} held-out paragraphs{shape}" if n else "held-out paragraphs (their count was not recorded)"


def per_item(groups: list[Group]) -> str:
    """How much one item moves last-word recovery: 100 / the reference's hits, per base model."""
    hits: dict[str, tuple[int, int]] = {}
    for g in groups:
        acc, items = g.mean("reference_lastword_accuracy"), g.mean("lastword_items")
        if acc and items:
            hits.setdefault(g.model_name, (round(acc * items), round(items)))
    parts = [f"{'' if len(hits) == 1 else model + ': '}the reference gets {n} of {items} right, so one item moves "
             f"it by {100 / n:.1f} points" for model, (n, items) in hits.items() if n]
    return ": " + "; ".join(parts) if parts else ""


def without_samples(groups: list[Group]) -> str:
    """Which groups have no interval: their rows predate the per-window values."""
    old = [g for g in groups if not g.sample_intervals]
    if not old:
        return ""
    return (f" Rows written before the per-window values were recorded have none ({len(old)} of {len(groups)} "
            "here): measure them again for an interval.")
