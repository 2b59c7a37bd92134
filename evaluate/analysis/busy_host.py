"""Runs measured on a busy host. A run is busy when other processes took
more than `threshold_pct` % of the host's CPU time while it ran (its row's
`host_load`, evaluate.host_load): its speed says as much about the other
work as about the artifact. The threshold is conf/report.yaml's
`busy_host_pct`. Rows written before host load was recorded are never busy:
nothing is known about them."""
from dataclasses import dataclass

from evaluate.host_load import HostLoad
from evaluate.results import Row
from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR
from quantize.common.settings import is_number, shown

KEY = "busy_host_pct"  # conf/report.yaml's key


@dataclass(frozen=True)
class BusyHost:
    """The busy-host rule with its threshold (% of the host's CPU time)."""
    threshold_pct: float

    @classmethod
    def from_config(cls, value=None) -> "BusyHost":
        """`value`: busy_host_pct as given (None: conf/report.yaml's)."""
        if value is None:
            import yaml
            value = yaml.safe_load((CONF_DIR / "report.yaml").read_text())[KEY]
        if not is_number(value) or not 0 <= value <= 100:
            raise UserError(f"{KEY}={shown(value)} is not a share of the host's CPU time in %; pass a number from 0 to "
                            f"100, e.g. {KEY}=10")
        return cls(float(value))

    def other_cpu_pct(self, row: Row) -> float | None:
        """Other processes' share of the host's CPU time during the run (%); None: not recorded."""
        load = HostLoad.from_dict(row.host_load)
        return load.other_cpu_pct if load else None

    def is_busy(self, row: Row) -> bool:
        pct = self.other_cpu_pct(row)
        return pct is not None and pct > self.threshold_pct

    def busy_runs(self, rows: list[Row]) -> list[Row]:
        return [r for r in rows if self.is_busy(r)]

    def recorded(self, rows: list[Row]) -> bool:
        """Whether any of the rows recorded its host load."""
        return any(self.other_cpu_pct(r) is not None for r in rows)
