"""What the answer's speeds rest on, said beside it: runs measured on a busy
host (evaluate.analysis.busy_host), whether `runs=auto` met its target
interval (Row.precision), and the engine's caveat on how it served a format
(Row.serving_note: hf's speed of a quantized checkpoint is the dense
model's). One line per scenario and thing to say."""
from evaluate.analysis.busy_host import BusyHost
from evaluate.analysis.choice import Choice
from evaluate.analysis.groups import Group
from evaluate.report.formatting import MISSING, fmt_fixed

BUSY_MARK = "⚠ busy host"


def condition_lines(choices: list[Choice], names: dict, busy: BusyHost) -> list[str]:
    """Per answer, its busy-host warning and its run-count target, where either applies."""
    out = []
    for c in choices:
        groups = answer_groups(c)
        where = c.scenario.name + (f", {c.model_name}" if c.model_name else "")
        texts = (busy_text(groups, names, busy), target_text(groups, names), *serving_note_texts(groups, names))
        out += [f"- {where}: {text}" for text in texts if text]
    return out


def serving_note_texts(groups: list[Group], names: dict) -> list[str]:
    """One text per note an engine gave, naming the answer's entries it served that way."""
    by_note: dict[tuple[str, str], list[str]] = {}
    for g in groups:
        row = g.runs[0] if g.runs else None
        if row is not None and row.serving_note:
            by_note.setdefault((row.engine, row.serving_note), []).append(names[g.identity])
    return [f"{', '.join(served)} served by {engine} with a note: {note}" for (engine, note), served in by_note.items()]


def answer_groups(c: Choice) -> list[Group]:
    """The groups an answer rests on: the pick, the original its speed-up divides by, and the runner-up."""
    found = [c.pick.group, c.pick.group.baseline] if c.pick else []
    found += [c.runner_up.group] if c.runner_up else []
    unique: list[Group] = []
    for g in found:
        if g is not None and all(g is not u for u in unique):
            unique.append(g)
    return unique


def busy_text(groups: list[Group], names: dict, busy: BusyHost) -> str | None:
    counts = [(g, len(busy.busy_runs(g.runs))) for g in groups]
    counts = [f"{n} of {len(g.runs)} runs of {names[g.identity]}" for g, n in counts if n]
    if not counts:
        return None
    return (f"{BUSY_MARK}: {', '.join(counts)} ran while other processes took more than "
            f"{busy.threshold_pct:g} % of the host's CPU time (`busy_host_pct=`); these speeds may not repeat "
            "on a quiet host (*Detailed runs* gives each run's share)")


def target_text(groups: list[Group], names: dict) -> str | None:
    """Which groups' runs=auto met the target interval, which stopped at the cap."""
    auto = [g for g in groups if (g.precision or {}).get("rule") == "auto"]
    if not auto:
        return None
    met = [names[g.identity] for g in auto if g.precision.get("stopped") == "target met"]
    missed = [f"{names[g.identity]} ({missed_text(g.precision)})" for g in auto
              if g.precision.get("stopped") != "target met"]
    goal = auto[0].precision.get("target_ci_pct")
    parts = [f"met by {', '.join(met)}"] * bool(met) + [f"not met by {', '.join(missed)}"] * bool(missed)
    return f"runs=auto's target (95% interval within ±{fmt_fixed(goal, 1)} % of the mean) {'; '.join(parts)}"


def missed_text(p: dict) -> str:
    ci = p.get("achieved_ci_pct")
    width = f"±{ci:.1f} %" if isinstance(ci, (int, float)) else MISSING
    if p.get("stopped") == "max_runs reached":
        return f"{width} at the cap, {p.get('runs')} runs"
    return f"{width} after {p.get('runs')} runs, interrupted"


def busy_cell(row, busy: BusyHost) -> str:
    """A run's other-process CPU share (%), marked where it makes the run busy."""
    pct = busy.other_cpu_pct(row)
    return fmt_fixed(pct, 1) + (f" {BUSY_MARK}" if busy.is_busy(row) else "")
