"""Cost control: a trial's speed is measured only for a kernel path this host
has not measured yet with the trial's evaluate setup. Two artifacts of one base model share a kernel path when
their checkpoints have the same quantization format, weight and activation
schemes (bits, type, strategy, group size, dynamic) and 2:4 pattern: the
engine runs the same kernels on the same shapes. SmoothQuant strength, GPTQ
dampening and the values themselves change accuracy, not the kernel; kept-dense
modules change which Linear layers run dense (a small share for small k)."""
from dataclasses import dataclass
from typing import Callable

from evaluate.analysis.groups import mean_std, numeric_metrics
from evaluate.results import Row
from quantize.common import provenance


@dataclass(frozen=True)
class Host:
    """What a measurement's rows must share with this one to be reused: the
    machine (a twin node counts: the hostname is left out, as in setup_id)
    and the versions of what measures."""
    hardware: dict
    versions: dict

    @classmethod
    def here(cls) -> "Host":
        return cls(_machine(provenance.hardware()), provenance.setup_versions(provenance.versions()))

    def ran(self, row: Row) -> bool:
        return _machine(row.hardware) == self.hardware and provenance.setup_versions(row.versions) == self.versions


def _machine(hardware: dict) -> dict:
    return {k: v for k, v in (hardware or {}).items() if k != "hostname"}


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
                    same_setup: Callable[[Row], bool]) -> str | None:
    """The artifact id whose speed at (engine, scenario) this host measured
    for the same kernel path with the trial's own evaluate setup
    (`same_setup`: its engine args and env, runs ...), first measured first;
    None if there is none."""
    key = kernel_path(manifest_fields)
    for row in speed_rows(rows, engine, scenario):
        if row.manifest and host.ran(row) and same_setup(row) and kernel_path(row.manifest) == key:
            return row.artifact_id
    return None


def mean_of(rows: list[Row], artifact_id: str, engine: str, scenario: str, metric: str, host: Host,
            same_setup: Callable[[Row], bool]) -> float | None:
    """Mean of `metric` over this host's ok runs of the artifact at (engine,
    scenario) with the trial's evaluate setup (never across setups)."""
    values = [numeric_metrics(r).get(metric) for r in speed_rows(rows, engine, scenario)
              if r.artifact_id == artifact_id and host.ran(r) and same_setup(r)]
    values = [v for v in values if v is not None]
    return mean_std(values)[0] if values else None
