"""report.md's first section, "What to use on this machine": the choices of
evaluate.analysis.choice as a table (one per store where the report reads
several, one per machine where a store holds rows of several), what was
faster but left out and why, where serving rows exist the serving
recommendation, and where the stores hold recipe searches the point each
one recommends."""
from evaluate.analysis import Analysis
from evaluate.analysis.choice import ACCURACY_FLOOR_PCT, Choice, SPEED, choose
from evaluate.analysis.cost import Prices
from evaluate.analysis.groups import Group
from evaluate.analysis.significance import Verdict, on_its_side
from evaluate.analysis.recommendation import recommend
from evaluate.report.accuracy_markdown import RECOVERY_HEADER, recovery_cell, recovery_interval_text
from evaluate.report.conditions_markdown import condition_lines
from evaluate.report.cost_markdown import COST_HEADER, cost_cell, cost_sentence
from evaluate.report.formatting import MISSING, fmt_fixed, header, interval_text, mb, md_table, speedup_text
from evaluate.report.labels import labels
from evaluate.report.search_files import StudyEntry, studies
from evaluate.report.search_markdown import search_answer
from evaluate.report.serving_markdown import recommendation_lines
from evaluate.report.stores_markdown import several_machines, store_heading

TITLE = "## What to use on this machine"
# The answer's columns a narrow screen may leave out (report.html, under 1000 px): the Summary has them.
SECONDARY_COLUMNS = (header(SPEED), "Model size (MB)")
SPEEDUP_HEADER = "Speed-up vs original (x, 95% CI)"
UNDER_LOAD = "### Under load"


def render_answer(analysis: Analysis, floor_pct: float = ACCURACY_FLOOR_PCT,
                  searches: list[StudyEntry] | None = None, prices: Prices = Prices()) -> str:
    """The section; `searches`, the stores' recipe searches, are read from them where not given;
    `prices`, the machines' (a cost column and the serving pick's cost; a sentence where none is set)."""
    choices = choose(analysis.speed, analysis.accuracy, floor_pct)
    out = [TITLE, ""]
    if choices:
        names = labels(analysis.speed)
        places = list(dict.fromkeys((c.store, c.machine) for c in choices))
        machines = several_machines(analysis.speed)
        out.append(intro(floor_pct, several=len(places) > 1, machines=machines))
        for store, machine in places:
            mine = [c for c in choices if (c.store, c.machine) == (store, machine)]
            out += ["", store_heading(store, analysis.rows, machine if machines else None)] * (len(places) > 1) + [
                "", answer_table(mine, names, prices)]
            left_out = [line for c in mine for line in left_out_lines(c, names)]
            out += [""] + left_out if left_out else []
        conditions = condition_lines(choices, names, analysis.busy_host)
        out += ["", "What these speeds rest on:", ""] + conditions if conditions else []
    else:
        out.append("No successful speed runs to choose from.")
    if choices or analysis.serving:
        out += ["", cost_sentence(prices)]
    if analysis.serving:
        serving_names = labels(analysis.serving.groups)
        out += ["", UNDER_LOAD, "", "From the serving rows (see *Serving under load* for every level):"]
        out += recommendation_lines(recommend(analysis.serving, analysis.accuracy), analysis.serving.groups,
                                    serving_names, prices)
    from_search = search_answer(studies(analysis.results_dirs, analysis.suspect_ids) if searches is None else searches, floor_pct)
    return "\n".join(out + ([""] + from_search if from_search else []))


def intro(floor_pct: float, several: bool, machines: bool = False) -> str:
    """What the table answers (per store, or per machine where a store holds
    several), and how the floor and the original's recovery are taken."""
    per = (" and machine (the hardware its rows recorded, hostname aside)" if machines
           else " and store (each its own machine)" if several else "")
    return (f"Per scenario{per}, the fastest artifact (mean "
            f"output throughput) whose accuracy recovery is at least {floor_pct:g} % (`accuracy_floor_pct=`; "
            "*Accuracy* says what recovery is), and the runner-up. The floor applies to the recovery's point "
            "estimate; ⚠ marks a pick whose 95% interval reaches below it. The original counts as its own "
            "accuracy row measures it (the engine against the reference, its own weights), or 100 % by "
            "definition where it has none. Speed-ups are against the original in the same setup as configured.")


def answer_table(choices: list[Choice], names: dict, prices: Prices = Prices()) -> str:
    several = len({c.model_name for c in choices}) > 1
    heads = ["Scenario"] + ["Model"] * several + [
        "Use", header(SPEED), SPEEDUP_HEADER, "Model size (MB)", RECOVERY_HEADER, "Runner-up"]
    rows = [[c.scenario.heading()] + [c.model_name] * several + pick_cells(c, names) for c in choices]
    if prices.any:  # the cost before the runner-up, the last column
        heads.insert(-1, COST_HEADER)
        for c, row in zip(choices, rows):
            row.insert(-1, cost_cell(prices, c.pick.group) if c.pick else MISSING)
    return md_table(heads, rows)


def pick_cells(c: Choice, names: dict) -> list[str]:
    if c.pick is None:   # the original counts 100 % by definition: no recovery at all means it has no ok run here
        why = (f"none meets {c.floor_pct:g} %" if c.measured else
               "none known: the original has no ok run here and no accuracy was measured (measure the original, "
               "or python -m evaluate accuracy=austen)")
        return [why] + [MISSING] * 5
    g = c.pick.group
    return [f"**{names[g.identity]}**", fmt_fixed(g.mean(SPEED)), speedup_cell(g),
            fmt_fixed(mb(g.model_bytes), 1), pick_recovery(c), runner_up_text(c, names)]


def pick_recovery(c: Choice) -> str:
    text = recovery_cell(c.pick.recovery, c.floor_pct)
    return text + (f" ⚠ interval below {c.floor_pct:g} %" if c.floor_in_interval else "")


def speedup_cell(g: Group) -> str:
    """The speed-up with its 95% interval, the two dtypes where `auto` chose
    different ones, and why it is not ranked where it is flagged."""
    if g.speedup is None:
        return MISSING
    text = speedup_text(g.speedup) + (f" ({interval_text(g.speedup_ci)})" if g.speedup_ci else "")
    if g.dtype_differs:
        text += f", {g.baseline.dtype} → {g.dtype}"
    if g.speedup_verdict is Verdict.SAME and g.baseline is not g:
        text += f", {Verdict.SAME.value}"
    return text + (f" ⚠ {g.flag}" if g.flag else "")


def runner_up_text(c: Choice, names: dict) -> str:
    if c.runner_up is None:
        return MISSING
    g = c.runner_up.group
    text = f"{names[g.identity]}: {fmt_fixed(g.mean(SPEED))} tok/s, {fmt_fixed(mb(g.model_bytes), 1)} MB"
    return text + {Verdict.SAME: f" ({Verdict.SAME.value})", Verdict.UNTESTED: " (not tested: a single run)"}.get(
        c.vs_runner_up.verdict, "")


def interval_note(interval: tuple[float, float] | None, floor_pct: float) -> str:
    return f" (95% CI {recovery_interval_text(interval, floor_pct)})" if interval else ""


def left_out_lines(c: Choice, names: dict) -> list[str]:
    """The artifacts faster than the pick that are not the answer, and why."""
    where = c.scenario.name + (f", {c.model_name}" if c.model_name else "")
    out = [f"- {where}: {names[p.group.identity]} is faster ({fmt_fixed(p.group.mean(SPEED))} tok/s) but keeps "
           f"{on_its_side(p.recovery_pct, c.floor_pct, 1)} % of the accuracy"
           f"{interval_note(p.recovery.interval, c.floor_pct)}, "
           "below the floor" for p in c.below_floor]
    out += [f"- {where}: {names[g.identity]} is faster ({fmt_fixed(g.mean(SPEED))} tok/s) but its accuracy was "
            "not measured (python -m evaluate accuracy=austen)" for g in c.unmeasured]
    return out
