"""report.md's sections "Recipe search" (per study: what it searched, the
Pareto front of its complete trials, its failed trials) and "Layer
sensitivity" (per sensitivity file: what was measured, the heat map, the
most sensitive cells), and the lines the answer section takes from the
searches. A store without study.json or sensitivity files gets none of them."""
from collections import Counter

from evaluate.analysis.pareto import SearchAnswer, SearchFront, answer, is_recovery, most_accurate
from evaluate.report.formatting import MISSING, fmt_fixed, fmt_number, label, md_table, short
from evaluate.report.search_files import HEATMAP_MODULE, SensitivityEntry, StudyEntry, can_draw, heatmap_drawer
from evaluate.search.study_file import Objective, Trial

SEARCH_TITLE = "## Recipe search"
SENSITIVITY_TITLE = "## Layer sensitivity"
ANSWER_TITLE = "### From the recipe search"
TOP_CELLS = 10
KL_HEADER = "KL divergence (nats/token)"


def objective_header(o: Objective) -> str:
    """The objective in words, its scenario and unit: `Output throughput at interactive (tok/s)`."""
    where = f" at {o.scenario}" if o.scenario else ""
    return f"{label(o.name)}{where}" + (f" ({o.unit})" if o.unit else "")


# --- Recipe search ---------------------------------------------------------------------------------------

def _section(title: str, intro: str, entries: list, lines) -> str:
    """A section: its title and intro, then each entry's lines; nothing without entries."""
    if not entries:
        return ""
    out = [title, "", intro]
    for entry in entries:
        out += ["", *lines(entry)]
    return "\n".join(out)


def render_search(studies: list[StudyEntry]) -> str:
    return _section(SEARCH_TITLE,
           "Each study of `python -m evaluate.search`: its trials are quantize → evaluate jobs. The Pareto front "
           "holds the complete trials no other complete trial matches or beats in every objective while beating "
           "it in one; best first by the objectives in order. Speed is measured once per format and kernel path "
           "on this host and engine, and reused (named) by trials that share it.", studies, study_lines)


def study_lines(entry: StudyEntry) -> list[str]:
    search, record = entry.search, entry.search.record
    objectives = ", ".join(f"{o.direction} {objective_header(o)}" for o in record.objectives)
    out = [f"### Study {record.study}", "",
           f"- Storage: `{record.storage}`; record `{entry.path}`" + (f", updated {record.updated}"
                                                                    if record.updated else ""),
           f"- Model {record.model or MISSING}, engine {record.engine or MISSING}, search space "
           f"`conf/search/{record.space}`",
           f"- Trials: {trial_counts(record.trials)}, of a target of {record.n_trials}; wall time "
           f"{fmt_fixed(record.wall_s, 1)} s",
           f"- Objectives: {objectives}"]
    if not search.complete:
        out += ["", "No complete trial yet: no front."]
    else:
        out += ["", f"Pareto front: {len(search.front)} of {len(search.complete)} complete trials.", "",
                front_table(search)]
        dominated = [t for t in search.complete if not search.on_front(t)]
        if dominated:
            out += ["", "Dominated: " + ", ".join(f"#{t.number} {t.recipe or MISSING}" for t in dominated) + "."]
        if can_draw():
            out += ["", f"![Recipe search {record.study}: the front in colour, dominated trials grey]"
                        f"({entry.figure}.png)"]
    if search.failed:
        out += ["", "Failed trials:", ""] + [f"- #{t.number} {t.recipe or MISSING}: {error_line(t)}"
                                             for t in search.failed]
    return out


def trial_counts(trials: list[Trial]) -> str:
    """`5 complete, 1 failed`, then any other state (running, waiting, pruned) by its name."""
    counts = Counter(t.state for t in trials)
    words = {"COMPLETE": "complete", "FAIL": "failed"}
    parts = [f"{counts.pop(state, 0)} {word}" for state, word in words.items()]
    return ", ".join(parts + [f"{n} {state.lower()}" for state, n in sorted(counts.items())])


def error_line(t: Trial) -> str:
    """The trial's error, its first line only (the rest is in the trial's job log)."""
    lines = (t.error or "").strip().splitlines()
    return lines[0] if lines else "(no error recorded)"


def front_table(search: SearchFront) -> str:
    objectives = search.record.objectives
    heads = ["Trial", "Recipe", "Artifact"] + [objective_header(o) for o in objectives] + ["Speed", "Repro"]
    rows = [[f"#{t.number}", t.recipe or MISSING, f"`{short(t.artifact_id)}`" if t.artifact_id else MISSING]
            + [fmt_number(v) for v in t.values] + [t.speed or MISSING, code(t.repro)]
            for t in search.front]
    return md_table(heads, rows)


def code(text: str | None) -> str:
    """A command as one line of code; the commands of a repro joined by `;`."""
    if not text:
        return MISSING
    return "`" + " ; ".join(line.strip() for line in text.strip().splitlines() if line.strip()).replace("`", "'") + "`"


# --- the answer ------------------------------------------------------------------------------------------

def search_answer(studies: list[StudyEntry], floor_pct: float) -> list[str]:
    """The answer section's subsection: per study, the point to use."""
    if not studies:
        return []
    return [ANSWER_TITLE, ""] + [answer_line(e.search, answer(e.search, floor_pct)) for e in studies]


def answer_line(search: SearchFront, result: SearchAnswer) -> str:
    record = search.record
    where = f"Study {record.study} ({record.model}, {record.engine})"
    t = result.pick
    if t is None:
        return f"- {where}: no complete trial yet, so no answer."
    if result.floor_pct is None:
        most = most_accurate_text(search)
        return (f"- {where}: use {point_text(search, t)}; {accuracy_text(search, t)}. The search's accuracy "
                f"objective is not a recovery, so no floor applies: this is the fastest front point"
                + (f"; the most accurate is {most}" if most else "") + ".")
    floor = f"recovery ≥ {result.floor_pct:g} %"
    if not result.meets_floor:
        return (f"- {where}: no complete trial keeps {floor} (`accuracy_floor_pct=`); the most accurate is "
                f"{point_text(search, t)}, {accuracy_text(search, t)}.")
    return f"- {where}: for {floor} on this host, use {point_text(search, t)} ({accuracy_text(search, t)})."


def point_text(search: SearchFront, t: Trial) -> str:
    """`**recipe** (artifact `id`, trial #n): 60.00 tok/s at interactive, 120.0 MB`."""
    parts = []
    speed, size = search.value(t, "speed"), search.value(t, "size")
    objectives = search.record.objectives
    if speed is not None:
        o = objectives[search.roles.speed]
        parts.append(f"{fmt_fixed(speed, 2)} {o.unit}" + (f" at {o.scenario}" if o.scenario else ""))
    if size is not None:
        parts.append(f"{fmt_fixed(size, 1)} {objectives[search.roles.size].unit}")
    artifact = f"artifact `{short(t.artifact_id)}`, " if t.artifact_id else ""
    return f"**{t.recipe or MISSING}** ({artifact}trial #{t.number})" + (": " + ", ".join(parts) if parts else "")


def accuracy_text(search: SearchFront, t: Trial) -> str:
    """`97.5 % recovery` or `KL divergence 0.0123 nats`."""
    index = search.roles.accuracy
    if index is None:
        return "accuracy not among the objectives"
    o = search.record.objectives[index]
    if is_recovery(o):
        return f"{fmt_fixed(t.values[index], 1)} % recovery"
    return f"{label(o.name)} {fmt_number(t.values[index])} {o.unit}".rstrip()


def most_accurate_text(search: SearchFront) -> str:
    if search.roles.accuracy is None:
        return ""
    t = most_accurate(search)
    return f"**{t.recipe or MISSING}** (trial #{t.number}, {accuracy_text(search, t)})"


# --- Layer sensitivity -----------------------------------------------------------------------------------

def render_sensitivity(entries: list[SensitivityEntry]) -> str:
    return _section(SENSITIVITY_TITLE,
           "Per sensitivity file (`python -m quantize.sensitivity`): each decoder layer's Linear modules "
           "quantized alone with the recipe's scheme, and the KL divergence of the model's next-token "
           "distribution from the original's on held-out text. The higher, the more that module is worth "
           "keeping dense (`python -m quantize.propose`).", entries, sensitivity_lines)


def sensitivity_lines(entry: SensitivityEntry) -> list[str]:
    s = entry.sensitivity
    out = [f"### {s.model_name} · {s.scheme_key}", "",
           f"- Recipe `{s.recipe}`, scheme `{s.scheme_key}`; weights `{s.weights_hash[:12]}`; file `{entry.path}`",
           f"- Held-out text: {text_description(s.text)}",
           f"- Wall time {fmt_fixed(s.wall_s, 1)} s; baseline KL (every module quantized at once) "
           f"{fmt_number(s.baseline_kl)} nats/token; {len(s.cells)} cells, {len(s.layers())} layers × "
           f"{len(s.groups())} modules", ""]
    out.append(heatmap_line(entry))
    top = s.ranked()[:TOP_CELLS]
    out += ["", f"The {len(top)} most sensitive cells (the KL with only that module quantized):", "",
            md_table(["Rank", "Layer", "Module", KL_HEADER, "Parameters (count)"],
                     [[str(rank), str(c.layer), c.group, fmt_number(c.kl), f"{c.params:,}"]
                      for rank, c in enumerate(top, 1)])]
    return out


def heatmap_line(entry: SensitivityEntry) -> str:
    if not can_draw():
        return "No heat map: matplotlib is not installed (bash scripts/setup.sh installs it)."
    if heatmap_drawer() is None:
        return f"No heat map: this checkout lacks {HEATMAP_MODULE}."
    s = entry.sensitivity
    return f"![KL per layer and module, {s.model_name} {s.scheme_key}]({entry.figure}.png)"


def text_description(text: dict) -> str:
    """`8 windows × 512 tokens of <source> (<books>), 4088 scored tokens`; other keys as `key value`."""
    text = dict(text or {})
    head = []
    if "num_windows" in text and "window_len" in text:
        head.append(f"{text.pop('num_windows')} windows × {text.pop('window_len')} tokens")
    if "source" in text:
        head.append(f"of {text.pop('source')}")
    if "books" in text:
        books = text.pop("books")
        head.append(f"({', '.join(map(str, books)) if isinstance(books, (list, tuple)) else books})")
    parts = [" ".join(head)] if head else []
    if "scored_tokens" in text:
        parts.append(f"{text.pop('scored_tokens')} scored tokens")
    parts += [f"{key.replace('_', ' ')} {short_hash(key, value)}" for key, value in text.items()]
    return ", ".join(parts) or MISSING


def short_hash(key: str, value) -> str:
    """A digest (`sha256`, `*_hash`) as its first 12 characters, as the weights' hash is shown."""
    return str(value)[:12] if ("sha" in key or "hash" in key) and isinstance(value, str) else str(value)
