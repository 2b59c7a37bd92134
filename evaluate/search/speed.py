"""Cost control: a trial's speed is measured only for a kernel path this host
has not measured yet with the trial's evaluate setup. Two artifacts of one base model share a kernel path when
their checkpoints have the same quantization format, weight and activation
schemes (bits, type, strategy, group size, dynamic) and 2:4 pattern: the
engine runs the same kernels on the same shapes. SmoothQuant strength, GPTQ
dampening and the values themselves change accuracy, not the kernel; kept-dense
modules change which Linear layers run dense (a small share for small k)."""
from dataclasses import dataclass
from typing import Callable

from omegaconf import OmegaConf

from evaluate import engines, precision, results
from evaluate.analysis.groups import mean_std, numeric_metrics
from evaluate.batch import stored_runs
from evaluate.results import Row
from quantize.common import provenance
from quantize.common.paths import CONF_DIR

# evaluate's settings that decide how many timed runs a scenario owes (evaluate.precision.plan)
RUN_SETTINGS = ("runs", "warmup_runs", "min_runs", "max_runs", "target_ci_pct", "max_warmup_runs",
                "warmup_tolerance_pct")


@dataclass(frozen=True)
class Host:
    """What a measurement's rows must share with this one to be reused: the
    machine (a twin node counts: the hostname is left out, as in setup_id)
    and the versions of what measures."""
    hardware: dict
    versions: dict

    @classmethod
    def here(cls) -> "Host":
        return cls(results.machine_of(provenance.hardware()), provenance.setup_versions(provenance.versions()))

    def ran(self, row: Row) -> bool:
        return results.machine_of(row.hardware) == self.hardware and provenance.setup_versions(row.versions) == self.versions


def evaluate_setup(evaluate_args: list[str], host: Host) -> str:
    """The setup as configured that `python -m evaluate <evaluate_args>`
    records on this host (its rows' comparison_id), computed by evaluate's
    own code: its engine config composed from the arguments as its entry
    reads them, with the speed variables exported in this shell, which the
    trial's evaluate inherits (engines.identity)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    from evaluate.pipeline import comparison_id
    from quantize.common.config import expand_path_shorthands, open_pass_through_keys, register
    register()
    args = open_pass_through_keys(expand_path_shorthands(list(evaluate_args)))
    running = get_gh_backup()  # a trial is a Hydra job itself: its own composition is put back after
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            engine_cfg = engines.build(compose("evaluate", overrides=args).engine)
    finally:
        restore_gh_from_backup(running)
    return comparison_id(engine_cfg, host.versions, host.hardware)


def kernel_path(manifest_fields: dict) -> tuple:
    """The manifest's (or a row's `manifest`) kernel path: base weights,
    format, each scheme's weight and activation arguments, 2:4."""
    quantization = manifest_fields.get("quantization") or {}
    schemes = tuple(sorted(
        (_args(s.get("weights")), _args(s.get("activations") or s.get("input_activations")))
        for s in quantization.get("schemes") or ()))
    model = manifest_fields.get("model") or {}
    sparse = bool((manifest_fields.get("sparsity") or {}).get("all_layers_hold_pattern"))
    return (model.get("weights_sha256") or model.get("name"), quantization.get("format") or "dense", schemes, sparse)


def _args(scheme: dict | None) -> tuple:
    keys = ("num_bits", "type", "strategy", "group_size", "dynamic")
    return tuple((scheme or {}).get(k) for k in keys)


def speed_rows(rows: list[Row], engine: str, scenario: str) -> list[Row]:
    return [r for r in rows if r.kind == "speed" and r.ok and r.engine == engine and r.scenario == scenario]


def measured_before(rows: list[Row], manifest_fields: dict, engine: str, scenario: str, host: Host,
                    same_setup: Callable[[Row], bool], plan: precision.RunPlan) -> str | None:
    """The artifact id whose speed at (engine, scenario) this host measured
    for the same kernel path with the trial's own evaluate setup
    (`same_setup`: its engine args and env, those exported in the shell too,
    runs ...), first measured first;
    None if there is none. A measurement that still owes runs (`plan`, as
    evaluate decides them: a run failed or was cut short) does not count:
    the trial's evaluate measures the missing runs."""
    key = kernel_path(manifest_fields)
    measurements: dict[tuple, list[Row]] = {}
    for row in speed_rows(rows, engine, scenario):
        if row.manifest and host.ran(row) and same_setup(row) and kernel_path(row.manifest) == key:
            measurements.setdefault(row.measurement_key(), []).append(row)
    for runs in measurements.values():
        if not plan.indices(*stored_runs(runs)):
            return runs[0].artifact_id
    return None


def run_plan(evaluate_overrides: list[str]) -> precision.RunPlan:
    """The timed runs the trial's evaluate owes a scenario: conf/evaluate.yaml's
    run settings with the evaluate_overrides' on top."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "evaluate.yaml"))
    settings = {k: v for k, v in defaults.items() if k in RUN_SETTINGS}
    for override in OverridesParser.create().parse_overrides(list(evaluate_overrides)):
        if override.key_or_group in RUN_SETTINGS:
            settings[override.key_or_group] = override.value()
    return precision.plan(settings)


def mean_of(rows: list[Row], artifact_id: str, engine: str, scenario: str, metric: str, host: Host,
            same_setup: Callable[[Row], bool]) -> float | None:
    """Mean of `metric` over this host's ok runs of the artifact at (engine,
    scenario) with the trial's evaluate setup (never across setups)."""
    values = [numeric_metrics(r).get(metric) for r in speed_rows(rows, engine, scenario)
              if r.artifact_id == artifact_id and host.ran(r) and same_setup(r)]
    values = [v for v in values if v is not None]
    return mean_std(values)[0] if values else None
