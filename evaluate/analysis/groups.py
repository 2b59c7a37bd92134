"""Aggregation: result rows -> groups with per-metric stats, speed-ups and
their intervals, rankings. Plain functions over `Row`s; the report's output
modules only format what these return. Only rows with status "ok" enter a
group; rows of different setups or machines are never grouped together."""
import functools
import math
import statistics
from dataclasses import dataclass, field

from evaluate import engines
from evaluate.analysis.significance import Comparison, Contrast, Estimate, Verdict, on_its_side
from evaluate.engines import Engine
from evaluate.metrics import t95
from evaluate.results import Kind, Row, Store, machine_id
from evaluate.scenarios import Scenario
from quantize.common.errors import UserError
from quantize.common.manifest import checkpoint_id_before_config, checkpoint_id_of
from quantize.common.recipe_choices import BASELINE
ACCURACY_HEADLINE = ("recovery_pct", "perplexity", "kl_divergence", "top1_agreement")
SPEED = "output_throughput"
# A speed-up is flagged (⚠) when the runs of either side vary more than this
# (coefficient of variation of output throughput): more than the interval's
# noise model (independent runs of one steady host) expects.
CV_MAX = 0.15


def name_originals(rows: list[Row]) -> list[Row]:
    """Rows of an original measured as a plain checkpoint, named as the artifacts
    built from it name their model (their manifests record its weights and
    config.json hashes, which are its id): so it is their baseline however
    it was named when measured (`model=<dir>` beside a preset's artifacts,
    or a store from before evaluate named it by the model choice)."""
    names: dict[str, str] = {}
    for r in rows:
        base = (r.manifest or {}).get("model") or {}
        weights, config = base.get("weights_sha256"), base.get("config_sha256")
        if r.recipe != BASELINE and r.model_name and weights and config:
            for base_id in (checkpoint_id_of(weights, config), checkpoint_id_before_config(weights)):
                names.setdefault(base_id, r.model_name)
    return [r.but(model_name=names[r.artifact_id])
            if r.recipe == BASELINE and not r.manifest and names.get(r.artifact_id, r.model_name) != r.model_name
            else r for r in rows]


@dataclass
class Group:
    """All ok rows of one (scenario, recipe, artifact, engine, setup, machine), with per-metric stats."""
    scenario: Scenario
    model_name: str
    recipe: str
    artifact_id: str
    engine: str
    setup_id: str | None
    quant_format: str | None
    model_bytes: int | None
    runs: list[Row]
    stats: dict[str, tuple[float, float | None, int]] = field(default_factory=dict)  # mean, std, n
    vs_original: Comparison | None = None  # mean output throughput / the baseline's (significance.compare)
    flag: str | None = None  # why its speed is to be read with care (⚠): a single run, or noisy runs
    # accuracy groups: metric -> 95% interval over the rows' windows or items (accuracy_bounds)
    sample_intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    # the `original` group the speed-up is against (itself for the original)
    baseline: "Group | None" = field(default=None, repr=False, compare=False)

    @property
    def identity(self) -> tuple:
        return (self.model_name, self.recipe, self.artifact_id, self.engine, self.setup_id, self.machine)

    @property
    def comparison(self) -> tuple[str | None, str | None]:
        """What the group may be compared within: the setup as configured
        (Row.comparison_id), else, for rows written before it was recorded, the
        setup; and the machine, which rows from before setup ids do not name otherwise."""
        configured = self.runs[0].comparison_id or self.setup_id if self.runs else self.setup_id
        return configured, self.machine

    @property
    def dtype(self) -> str | None:
        """The dtype the engine ran in (`auto` resolved per artifact)."""
        return self.runs[0].engine_args.get("dtype") if self.runs else None

    @property
    def dtype_differs(self) -> bool:
        """Whether the speed-up compares two dtypes (each chosen by `dtype: auto`)."""
        return bool(self.baseline and self.dtype and self.baseline.dtype and self.dtype != self.baseline.dtype)

    @property
    def speedup(self) -> float | None:
        return self.vs_original.ratio if self.vs_original else None

    @property
    def speedup_ci(self) -> tuple[float, float] | None:
        """The speed-up's 95% interval; None where a side has one run, and for the baseline itself."""
        return self.vs_original.interval if self.vs_original and self.baseline is not self else None

    @property
    def speedup_verdict(self) -> Verdict | None:
        """Faster (HIGHER), slower (LOWER), no difference from the original, or not tested."""
        return self.vs_original.verdict if self.vs_original else None

    @property
    def store(self) -> Store | None:
        """The store its rows came from, where the report reads several."""
        return self.runs[0].store if self.runs else None

    @property
    def machine(self) -> str | None:
        """The machine its rows were measured on (results.machine_id): a store
        of a cluster's jobs may hold several."""
        return machine_id(self.runs[0].hardware) if self.runs else None

    def estimate(self, metric: str = SPEED) -> Estimate | None:
        """The mean of `metric` as the significance rule takes it; None where never measured."""
        if metric not in self.stats:
            return None
        mean, std, n = self.stats[metric]
        return Estimate((metric, self.scenario, self.identity), mean, std, n)

    def mean(self, metric: str) -> float | None:
        return self.stats[metric][0] if metric in self.stats else None

    def std(self, metric: str) -> float | None:
        return self.stats[metric][1] if metric in self.stats else None

    def cv(self, metric: str) -> float | None:
        """Coefficient of variation (std / mean); None with fewer than two runs."""
        mean, std = self.mean(metric), self.std(metric)
        return std / mean if mean and std is not None else None

    def interval(self, metric: str) -> tuple[float, float] | None:
        """95% Student-t interval of the mean; None with fewer than two runs."""
        mean, std, n = self.stats.get(metric, (None, None, 0))
        if std is None or n < 2:
            return None
        half = t95(n - 1) * std / math.sqrt(n)
        return mean - half, mean + half

    @property
    def precision(self) -> dict | None:
        """How the last run's count was decided (Row.precision), if recorded."""
        return self.runs[-1].precision if self.runs else None


def scenario_of(row: Row) -> Scenario:
    """Speed rows name a scenario; accuracy rows may name their eval set instead."""
    name = row.scenario or row.dataset or row.kind
    return Scenario(str(name), row.batch_size, row.input_len, row.output_len)


def numeric_metrics(row: Row) -> dict[str, float]:
    """The row's numeric metrics, with input throughput derived when it is missing.

    A throughput <= 0 cannot come from a completed run (it is the reference
    report's always-0.00 defect), so it counts as not measured. Derived input
    (prefill) throughput is batch_size x input_len / mean TTFT."""
    out = {k: float(v) for k, v in row.metrics.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    for k in [k for k in out if "throughput" in k and out[k] <= 0]:
        del out[k]
    ttft = out.get("ttft_ms_mean")
    if "input_throughput" not in out and ttft and row.batch_size and row.input_len:
        out["input_throughput"] = row.batch_size * row.input_len / (ttft / 1000)
    return out


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None with fewer than two values)."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def group_stats(runs: list[Row]) -> dict[str, tuple[float, float | None, int]]:
    values: dict[str, list[float]] = {}
    for row in runs:
        for k, v in numeric_metrics(row).items():
            values.setdefault(k, []).append(v)
    return {k: (*mean_std(vs), len(vs)) for k, vs in values.items()}


def aggregate(rows: list[Row], kind: Kind = "speed") -> list[Group]:
    """Ok rows of one kind grouped per (scenario, recipe, artifact, engine,
    setup, machine), in order of first appearance; runs inside a group sorted by run index."""
    groups: dict[tuple, Group] = {}
    for row in latest_config([r for r in rows if r.ok and r.kind == kind]):
        key = group_key(row)
        if key not in groups:
            groups[key] = Group(key[0], row.model_name or "?", row.recipe or "?", row.artifact_id or "?",
                                row.engine or "?", row.setup_id, row.quant_format, row.model_bytes, [])
        groups[key].runs.append(row)
    for g in groups.values():
        g.runs.sort(key=lambda r: (r.run_index if isinstance(r.run_index, int) else 1 << 30, r.timestamp or ""))
        g.stats = group_stats(g.runs)
    return list(groups.values())


def identity_of(row: Row) -> tuple:
    """The Group.identity of the group a row of any status would join (aggregate names a missing field "?")."""
    return (row.model_name or "?", row.recipe or "?", row.artifact_id or "?", row.engine or "?", row.setup_id,
            machine_id(row.hardware))


def group_key(row: Row) -> tuple:
    """A setup id names its machine; the machine is in the key all the same, as
    rows written before setup ids were recorded have none (None for all)."""
    return scenario_of(row), row.recipe, row.artifact_id, row.engine, row.setup_id, machine_id(row.hardware)


def latest_config(rows: list[Row]) -> list[Row]:
    """The rows measured as each group's latest row was (Row.measured_with:
    the accuracy or lm-eval config, the seed): a rerun with another config
    measures anew, and its rows replace the older ones rather than being
    averaged with them. Speed rows have one config per group already."""
    keyed = [(row, group_key(row), row.measured_with()) for row in rows]   # each hashed once
    latest = {}
    for _, group, config in sorted(keyed, key=lambda k: k[0].timestamp or ""):   # stable: file order among equal times
        latest[group] = config
    return [row for row, group, config in keyed if latest[group] == config]


def add_speedups(groups: list[Group], metric: str = SPEED) -> None:
    """Speed-up = mean `metric` / that of the `original` recipe with the same
    model, engine, configured setup (Group.comparison) and scenario, with its
    95% interval and verdict (significance.compare); None when there is no
    such baseline. Configured, not resolved: under `dtype: auto` each
    artifact runs in the dtype its kernels do best on this machine, and that
    is the comparison the user asked for (Group.dtype_differs says where the
    two dtypes differ). A group whose runs (or its baseline's) are too few or
    too noisy to trust the interval gets a flag saying why."""
    baselines: dict[tuple, Group] = {}
    for g in sorted(groups, key=lambda g: g.artifact_id):  # deterministic if several originals
        if g.recipe == BASELINE and g.mean(metric):
            baselines.setdefault((g.model_name, g.engine, g.comparison, g.scenario), g)
    for g in groups:
        base = baselines.get((g.model_name, g.engine, g.comparison, g.scenario))
        g.baseline = base
        ours = g.estimate(metric)
        g.vs_original = Contrast.ratio(ours, base.estimate(metric)).compare() if base and ours else None
        g.flag = speedup_flag(g, base, metric) if ours is not None else None


def speedup_flag(g: Group, base: Group | None, metric: str) -> str | None:
    """Why g's speed (and speed-up) is to be read with care, or None."""
    for who, x in (("", g), ("baseline ", base if base is not g else None)):
        if x is None:
            continue
        cv = x.cv(metric)
        if cv is None:
            return f"{who}1 run: no spread measured"
        if cv > CV_MAX:
            return f"{who}CV {on_its_side(100 * cv, 100 * CV_MAX, 0)}% > {CV_MAX:.0%}"   # 15.2%, never 15%
    return None


def testable(g: Group, metric: str = SPEED) -> bool:
    """Whether the rule can compare g's mean with another's: two runs or more."""
    est = g.estimate(metric)
    return bool(est and est.log_variance is not None)


def compare_groups(a: Group, b: Group, metric: str = SPEED) -> Comparison:
    """The rule (significance.compare) on two groups' means: a / b."""
    return Contrast.ratio(a.estimate(metric), b.estimate(metric)).compare()


def overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return bool(a and b) and a[0] <= b[1] and b[0] <= a[1]


def scenarios(groups: list[Group]) -> list[Scenario]:
    return list(dict.fromkeys(g.scenario for g in groups))


def pareto_scenario(speed: list[Group], wanted: str | None) -> Scenario:
    """The scenario named `wanted` (pareto_scenario=: its Pareto plot alone); the first where None."""
    scs = scenarios(speed)
    if wanted is None:
        return scs[0]
    match = [s for s in scs if s.name == wanted]
    if not match:
        raise UserError(f"pareto_scenario={wanted} is not in the results; have: {', '.join(s.name for s in scs)}")
    return match[0]


def by_throughput(groups: list[Group]) -> list[Group]:
    """Highest mean output throughput first; groups without it last."""
    return sorted(groups, key=lambda g: (g.mean("output_throughput") is None, -(g.mean("output_throughput") or 0)))


def by_model(groups: list[Group]) -> list[Group]:
    """Grouped by model (in order of appearance), fastest first within each."""
    order = {m: i for i, m in enumerate(dict.fromkeys(g.model_name for g in groups))}
    return sorted(by_throughput(groups), key=lambda g: order[g.model_name])  # sorted is stable


def same_setup(candidates: list[Group], g: Group) -> Group | None:
    """The first candidate measured in g's setup as configured
    (Group.comparison); never one of another setup (its engine, versions or
    machine could explain any difference)."""
    return next((c for c in candidates if c.comparison == g.comparison), None)


def accuracy_of(accuracy_groups: list[Group], g: Group) -> Group | None:
    """Accuracy shown beside a speed group: its artifact's, measured in the
    same setup, in the first eval set; None (shown as missing) otherwise."""
    same = sorted((a for a in accuracy_groups if a.artifact_id == g.artifact_id), key=lambda a: a.scenario.name)
    return same_setup(same, g)


def accuracy_keys(accuracy_groups: list[Group]) -> list[str]:
    keys = {k for g in accuracy_groups for k in g.stats}
    return [k for k in ACCURACY_HEADLINE if k in keys] + sorted(keys - set(ACCURACY_HEADLINE))


def headline_accuracy_keys(accuracy_groups: list[Group]) -> list[str]:
    keys = accuracy_keys(accuracy_groups)
    return [k for k in ACCURACY_HEADLINE if k in keys] or keys[:3]


@functools.cache
def engine_class(name: str | None) -> type[Engine]:
    """The engine class of a row's `engine`, which says what its rows mean;
    the base Engine for a name without a config (test engines, old stores)."""
    try:
        return engines.get(name) if name else Engine
    except UserError:
        return Engine


def kv_cache_bytes(row: Row) -> int | None:
    """The KV cache the engine allocated up front: what it reported
    (`engine_memory`), else what its engine says the recorded environment
    allocated (vLLM-CPU: VLLM_CPU_KVCACHE_SPACE GiB, whatever the batch).
    On a CPU part of the engine's peak host memory, on a GPU device memory. None elsewhere (transformers grows its
    cache per request)."""
    reported = (row.engine_memory or {}).get("kv_cache_bytes")
    if reported is not None:
        return int(reported)
    return engine_class(row.engine).preallocated_kv_cache_bytes(row.engine_env, row.hardware)


def weight_memory_bytes(row: Row) -> int | None:
    """The weights' memory as the engine reported it (`engine_memory`); None when it did not."""
    reported = (row.engine_memory or {}).get("weights_bytes")
    return None if reported is None else int(reported)


def stderr_key(metric: str) -> str:
    """lm-eval's standard-error metric of `metric`: acc -> acc_stderr, em[f] -> em_stderr[f]."""
    name, bracket, filt = metric.partition("[")
    return f"{name}_stderr{bracket}{filt}"


def lm_recovery(g: Group, base: Group | None, metric: str) -> float | None:
    """Artifact vs baseline in %, oriented so that 100 means no loss."""
    a, b = g.mean(metric), base.mean(metric) if base else None
    if a is None or b is None:
        return None
    higher = ((g.runs[0].lm_eval or {}).get("higher_is_better") or {}).get(metric.partition("[")[0], True)
    if higher:   # a score of 0 is a 0 % recovery, not a missing one
        return 100 * a / b if b else None
    return 100 * b / a if a else None


def lm_baseline(groups: list[Group], g: Group) -> Group | None:
    """The `original` of g's model, measured in g's setup with g's lm-eval
    settings, seeds and lm-eval versions (Row.measured_with): a ratio of two
    scores measured otherwise (another chat template, another lm-eval) is no
    recovery."""
    settings = g.runs[0].measured_with()
    return same_setup([b for b in groups if b.recipe == BASELINE and b.model_name == g.model_name
                       and b.runs[0].measured_with() == settings], g)
