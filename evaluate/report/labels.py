"""What the report calls each group: a recipe name, with what tells it apart
from the others (artifact, engine, differing setup settings) where needed."""
import json
from collections import Counter

from evaluate.analysis.groups import Group
from evaluate.report.formatting import MISSING, short
from evaluate.results import Row, machine_of
from quantize.common.provenance import setup_versions


def labels(groups: list[Group]) -> dict[tuple, str]:
    """Recipe name, as `model/recipe` when several models are present; where
    several identities share it, what tells them apart: the artifact, the
    engine, the store (where several are read side by side), and the
    settings of the setups that differ (within one store)."""
    first = {}
    for g in groups:
        first.setdefault(g.identity, g)
    several_models = len({g.model_name for g in first.values()}) > 1
    count = Counter((g.model_name, g.recipe) for g in first.values())
    out = {}
    for ident, g in first.items():
        name = f"{g.model_name}/{g.recipe}" if several_models else g.recipe
        if count[g.model_name, g.recipe] == 1:
            out[ident] = name
            continue
        twins = [t for t in first.values() if (t.model_name, t.recipe) == (g.model_name, g.recipe)]
        parts = [short(g.artifact_id)] if len({t.artifact_id for t in twins}) > 1 else []
        parts += [g.engine] if len({t.engine for t in twins}) > 1 else []
        store = g.runs[0].store if g.runs else None
        if store and len({t.runs[0].store for t in twins if t.runs}) > 1:  # stores side by side: each apart
            parts.append(f"store {store.name}")
            twins = [t for t in twins if t.runs and t.runs[0].store == store]
        if len({(t.setup_id, t.machine) for t in twins}) > 1:   # rows from before setup ids: machine apart
            parts.append(setup_difference(g, twins))
        out[ident] = f"{name} ({'; '.join(parts)})"
    return out


def in_table(names: dict[tuple, str], g: Group) -> str:
    """g's label in a table that has a Model column: without the model prefix."""
    return names[g.identity].removeprefix(f"{g.model_name}/")


CPU_KEYS = ("cpu", "cpu_count", "cpu_affinity", "accelerators")  # what setup_settings says of the hardware


def setup_settings(row: Row, machine: bool = False) -> dict[str, str]:
    """What a setup is made of, flat: engine args and environment, the
    library versions that enter a setup id, machine; with `machine`, the
    rest of the hardware that tells machines apart (results.machine_of: RAM, ISA)."""
    hw = row.hardware
    rest = {k: " ".join(map(str, v)) if isinstance(v, list) else str(v)
            for k, v in machine_of(hw).items() if k not in CPU_KEYS} if machine else {}
    return {**{k: json.dumps(v) for k, v in row.engine_args.items()},
            **{k: str(v) for k, v in row.engine_env.items()},
            **{k: str(v) for k, v in setup_versions(row.versions).items()},
            "cpu": f"{hw.get('cpu')} x{hw.get('cpu_affinity') or hw.get('cpu_count')}",
            "accelerators": ",".join(hw.get("accelerators") or []) or "none", **rest}


def setup_difference(g: Group, twins: list[Group]) -> str:
    """`key=value` for every setting in which g's setup differs from a twin's;
    the machine's too where a twin of the same setup id, or like g of none
    (rows from before setup ids), ran on another machine."""
    machine = any(t.setup_id == g.setup_id and t.machine != g.machine for t in twins)
    mine = setup_settings(g.runs[0], machine)
    theirs = [setup_settings(t.runs[0], machine) for t in twins]
    keys = sorted({k for s in theirs for k in s | mine if s.get(k) != mine.get(k)})
    return ", ".join(f"{k}={mine.get(k, MISSING)}" for k in keys) or f"setup {g.setup_id or 'not recorded'}"


def run_labels(runs: list[Row]) -> list[str]:
    """`run N` from run_index + 1; a repeated index gets `(repeat k)` so labels stay unique."""
    seen: Counter = Counter()
    out = []
    for i, row in enumerate(runs):
        idx = row.run_index
        base = f"run {idx + 1}" if isinstance(idx, int) else f"run ?{i + 1}"
        seen[base] += 1
        out.append(base if seen[base] == 1 else f"{base} (repeat {seen[base]})")
    return out


def dtype_note(g: Group, names: dict[tuple, str]) -> str | None:
    """Where g's speed-up compares two dtypes (`dtype: auto` chose each for its
    artifact's kernels): which, in words; None where both ran in one dtype."""
    if not g.dtype_differs:
        return None
    return dtypes_text(names.get(g.baseline.identity, g.baseline.recipe), g.baseline.dtype,
                       names.get(g.identity, g.recipe), g.dtype)


def dtypes_text(base: str, base_dtype: str, name: str, dtype: str) -> str:
    return f"{base} {base_dtype} vs {name} {dtype}: each at its best on this host"
