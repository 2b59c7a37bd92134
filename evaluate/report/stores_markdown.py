"""What report.md says about the machines: the hardware lines, tied to
their store's name where the report reads several (`results_dir=a,b`), the
heading of each store's (or machine's) answer, what names a block of one
store and machine, the warning when two stores hold the same
rows, and *Across stores*: the same artifact on each machine, as a ratio."""
import json
from typing import Callable

from evaluate.analysis.groups import SPEED, Group, scenarios
from evaluate.analysis.stores import (AcrossStores, SharedRows, across_stores, differing_keys, not_compared,
                                     shared_rows)
from evaluate.report.formatting import (
    MISSING, fmt_fixed, header, interval_text, md_table, short, speed_verdict, speedup_text)
from evaluate.results import Row, Store, machine_id, machine_of

ACROSS_TITLE = "## Across stores"


def hardware_text(hw: dict) -> str:
    parts = [str(hw.get("cpu") or "unknown CPU")]
    if hw.get("cpu_count"):
        parts.append(f"{hw['cpu_count']} CPUs" + (f" ({hw['cpu_affinity']} usable)" if hw.get("cpu_affinity") else ""))
    if hw.get("memory_gib"):
        parts.append(f"{hw['memory_gib']} GiB RAM")
    if hw.get("cpu_isa"):
        parts.append("ISA " + " ".join(hw["cpu_isa"]))
    parts.append("accelerators: " + (", ".join(hw.get("accelerators") or []) or "none"))
    host = f"`{hw['hostname']}` " if hw.get("hostname") else ""
    return host + "; ".join(parts)


def setup_hardware_text(hw: dict) -> str:
    """The hardware a setup id hashes, in words: hardware_text without the
    host, so a setup line reads as the `- Hardware:` line of its machine."""
    return hardware_text(machine_of(hw))


def machine_text(hw: dict) -> str:
    """The machine in a few words: host, CPU, accelerators."""
    accelerators = ", ".join(hw.get("accelerators") or []) or "no accelerator"
    host = f"`{hw['hostname']}`, " if hw.get("hostname") else ""
    return f"{host}{hw.get('cpu') or 'unknown CPU'}, {accelerators}"


def hardware_of(rows: list[Row]) -> list[dict]:
    """The distinct hardware the rows recorded, in order of first appearance."""
    seen = {json.dumps(r.hardware, sort_keys=True, default=str): r.hardware for r in rows if r.hardware}
    return list(seen.values())


def hardware_lines(rows: list[Row]) -> list[str]:
    """`- Hardware: …` per machine; with several stores, each tied to its store's name."""
    stores = list(dict.fromkeys(r.store for r in rows))
    if len(stores) < 2:
        return [f"- Hardware: {hardware_text(hw)}" for hw in hardware_of(rows)]
    return [f"- Hardware (store {store.name}): {hardware_text(hw)}"
            for store in stores for hw in hardware_of([r for r in rows if r.store == store])]


def shared_rows_lines(rows: list[Row]) -> list[str]:
    """A warning per pair of stores that hold the same rows."""
    return [shared_text(s) for s in shared_rows(rows)]


def shared_text(s: SharedRows) -> str:
    what = (f"the same {s.shared} rows" if s.identical
            else f"{s.shared} rows in common ({s.of_first} rows in {s.first.name}, {s.of_second} in {s.second.name})")
    return (f"- ⚠ Stores {s.first.name} and {s.second.name} hold {what}: one measurement read twice (a copied "
            "store?), so where they agree they compare a machine with itself; check `results_dir=`.")


def store_heading(store: Store | None, rows: list[Row], machine: str | None = None) -> str:
    """A store's part of the answer, or that of one `machine` (Group.machine)
    of it: its name and its machine(s), by host."""
    mine = [r for r in rows if r.store == store and (machine is None or machine_id(r.hardware) == machine)]
    machines = "; ".join(machine_text(hw) for hw in hardware_of(mine))
    title = f"Store {store.name}" if store else ("Machine" if machine else f"Store {MISSING}")
    return f"### {title}" + (f": {machines}" if machines else "")


def several_machines(groups: list[Group]) -> bool:
    """Whether a store holds the groups of more than one machine (a cluster's jobs on unlike nodes)."""
    return len({(g.store, g.machine) for g in groups}) > len({g.store for g in groups})


def place_names(groups: list[Group]) -> Callable[[Store | None, str | None], list[str]]:
    """What names a block's store and machine among the groups': `store a`
    where there are several stores, `machine <CPU, accelerators>` where a
    store holds several machines; nothing where neither."""
    stores = len({g.store for g in groups}) > 1
    machines = machine_labels(groups)

    def name(store: Store | None, machine: str | None) -> list[str]:
        return ([f"store {store.name}"] if stores and store else []) + (
            [f"machine {machines[machine]}"] if machine in machines else [])
    return name


def machine_labels(groups: list[Group]) -> dict[str, str]:
    """Group.machine -> its name, where a store holds several machines; empty where none does."""
    if not several_machines(groups):
        return {}
    return machine_names({g.machine: g.runs[0].hardware for g in groups if g.runs})


def machine_names(hardware: dict[str, dict]) -> dict[str, str]:
    """Each machine (id -> its hardware) in the fewest words that tell it from the others, no hostname."""
    for text in (machine_text, hardware_text):
        names = {m: text(machine_of(hw)) for m, hw in hardware.items()}
        if len(set(names.values())) == len(names):
            return names
    return {m: f"{hardware_text(machine_of(hw))} (id {m})" for m, hw in hardware.items()}


def render_across_stores(speed: list[Group]) -> str:
    """Per scenario, each artifact measured in one setup in several stores:
    its mean output throughput in each, and each store's ratio to the
    first's (AcrossStores.stores); a Setup column where they share several;
    then a line per artifact left out (not_compared)."""
    compared = across_stores(speed)
    left_out = not_compared(speed, compared)
    if not compared and not left_out:
        return ""
    out = [ACROSS_TITLE]
    if compared:
        out += across_tables(compared)
    out += [""] * bool(left_out) + [
        f"- Not compared across stores: {n.recipe} `{short(n.artifact_id)}` ({n.engine}"
        + (f", model {n.model_name}" if len({m.model_name for m in left_out}) > 1 else "")
        + f"): {n.reason}." for n in left_out]
    return "\n".join(out)


def across_tables(compared: list[AcrossStores]) -> list[str]:
    stores = compared[0].stores
    first, others = stores[0], stores[1:]
    several = len({c.first.model_name for c in compared}) > 1
    setups = setup_texts(compared)
    out = ["", f"The same artifact and engine, in one setup as configured, measured in each store, each store its "
           f"own machine: its mean output throughput, and each store's as a ratio to store {first.name}'s with the "
           f"95% interval and verdict of the rule in *Method and setups* ({MISSING} where store {first.name} did "
           "not measure it). Hardware: the report's header."]
    heads = (["Model"] * several + ["Recipe", "Artifact", "Engine"] + ["Setup"] * bool(setups)
             + [f"{header(SPEED)}, store {s.name}" for s in stores]
             + [f"Store {s.name} ÷ store {first.name} (x, 95% CI)" for s in others])
    for sc in scenarios([c.first for c in compared]):
        rows = [[c.first.model_name] * several + across_row(c, stores, others, setups) for c in compared
                if c.scenario == sc]
        out += ["", f"### {sc.heading()}", "", md_table(heads, rows)]
    return out


def setup_texts(compared: list[AcrossStores]) -> dict[str, str]:
    """Each compared setup (as JSON) in the settings that tell them apart; empty where there is one."""
    configs = {json.dumps(c.setup, sort_keys=True): c.setup for c in compared}
    keys = differing_keys(list(configs.values()))
    return {j: ", ".join(f"{k}={c.get(k, MISSING)}" for k in keys) for j, c in configs.items()} if keys else {}


def across_row(c: AcrossStores, stores: list[Store], others: list[Store], setups: dict[str, str]) -> list[str]:
    g = c.first
    cells = [g.recipe, f"`{short(g.artifact_id)}`", g.engine]
    cells += [setups[json.dumps(c.setup, sort_keys=True)]] if setups else []
    cells += [fmt_fixed(c.groups[s].mean(SPEED)) if s in c.groups else MISSING for s in stores]
    return cells + [ratio_cell(c.ratios.get(s)) for s in others]


def ratio_cell(ratio) -> str:
    if ratio is None:
        return MISSING
    ci = f" ({interval_text(ratio.interval)})" if ratio.interval else ""
    return f"{speedup_text(ratio.ratio)}{ci}, {speed_verdict(ratio.verdict)}"
