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


@dataclass
class AcrossStores:
    """One artifact, as configured, in one scenario, measured in several stores."""
    scenario: Scenario
    stores: list[Store]                   # every store compared in the report, in order: the first is the reference
    groups: dict[Store, Group]            # the stores that measured this artifact, in the stores' order
    ratios: dict[Store, Comparison]       # each other store's mean / the reference's; none where it lacks the artifact

    @property
    def first(self) -> Group:
        return next(iter(self.groups.values()))


def across_stores(speed: list[Group]) -> list[AcrossStores]:
    """Per scenario, each artifact (and engine) measured in two stores or
    more, with each store's ratio to the reference's mean output throughput:
    the first store compared, in every row, so a column divides by one store
    throughout (none where the reference did not measure the artifact).
    Nothing with one store; an artifact a store measured in several setups
    is left out, as which of them to compare would be a guess."""
    same: dict[tuple, dict[Store, list[Group]]] = {}
    for g in speed:
        if g.store and g.mean(SPEED):
            key = (g.scenario, g.model_name, g.recipe, g.artifact_id, g.engine)
            same.setdefault(key, {}).setdefault(g.store, []).append(g)
    compared = {key: {s: gs[0] for s, gs in by_store.items()} for key, by_store in same.items()
                if len(by_store) > 1 and all(len(gs) == 1 for gs in by_store.values())}
    stores = [s for s in dict.fromkeys(g.store for g in speed) if any(s in b for b in compared.values())]
    out = []
    for sc in scenarios(speed):
        for key, by_store in compared.items():
            if key[0] != sc:
                continue
            ordered = {s: by_store[s] for s in stores if s in by_store}
            base = ordered.get(stores[0])
            ratios = {s: compare_groups(g, base) for s, g in ordered.items() if base and g is not base}
            out.append(AcrossStores(sc, stores, ordered, ratios))
    return out
