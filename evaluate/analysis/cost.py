"""Cost per 1M output tokens: what an hour of the machine costs (the report's
`cost:` setting, conf/report.yaml), spread over the output tokens it
produces in that hour, USD per hour ÷ (output tok/s × 3600) × 10^6. A row's
price is, first that applies:
- `cost.usd_per_hour`: one for every row;
- `cost.per_gpu={<name>: USD}`: USD per hour of one GPU whose name contains
  <name> (H100 in "NVIDIA H100 80GB HBM3"; the longest such name wins), times the
  GPUs the row's engine split the model across (tensor x pipeline parallel),
  so a 2-GPU run costs twice a 1-GPU one. Not for a remote engine, whose GPUs
  are not this machine's;
- `cost.per_profile.<profile>`: by the hardware profile the row ran under
  (conf/hardware/).
Where no price applies there is no cost, never a guess."""
from dataclasses import dataclass, field

from evaluate.analysis.groups import SPEED, Group, engine_class
from evaluate.engines import parallel
from evaluate.results import Row
from quantize.common.errors import UserError
from quantize.common.settings import is_number, shown

SECONDS_PER_HOUR = 3600
TOKENS = 1e6    # the cost is per million output tokens


@dataclass(frozen=True)
class Prices:
    """USD per hour of the machine the rows ran on: one for all, else per GPU, else per hardware profile."""
    usd_per_hour: float | None = None
    per_profile: dict[str, float] = field(default_factory=dict)
    per_gpu: dict[str, float] = field(default_factory=dict)   # USD per GPU-hour by a part of the GPU's name

    @classmethod
    def from_config(cls, values: dict | None) -> "Prices":
        """conf/report.yaml's `cost:` (plain); a value that is not a positive number is one line."""
        values = values or {}
        return cls(price("cost.usd_per_hour", values.get("usd_per_hour")),
                   prices_by_name("cost.per_profile", values.get("per_profile"), "cuda"),
                   prices_by_name("cost.per_gpu", values.get("per_gpu"), "H100"))

    @property
    def any(self) -> bool:
        return self.usd_per_hour is not None or bool(self.per_profile) or bool(self.per_gpu)

    def of(self, row: Row) -> float | None:
        """The price of the machine a row ran on; None where none is set for it."""
        if self.usd_per_hour is not None:
            return self.usd_per_hour
        by_gpu = self.of_gpus(row)
        return by_gpu if by_gpu is not None else self.per_profile.get(row.hardware_defaults)

    def of_gpus(self, row: Row) -> float | None:
        """cost.per_gpu's price of the GPUs a row's engine ran on (the first tensor x pipeline
        parallel ones it saw, as CUDA numbers them); None where one of them has no price."""
        if not self.per_gpu or engine_class(row.engine).remote:
            return None
        seen, used = (row.hardware or {}).get("accelerators") or [], parallel.ranks(row.engine_args or {})
        prices = [self.per_gpu_hour(name) for name in seen[:used]]
        return sum(prices) if len(prices) == used and None not in prices else None

    def per_gpu_hour(self, gpu_name: str) -> float | None:
        """The price of one GPU named `gpu_name`: the longest cost.per_gpu key it contains (any case)."""
        keys = [k for k in self.per_gpu if k.lower() in gpu_name.lower()]
        return self.per_gpu[max(keys, key=len)] if keys else None

    def describe(self) -> str:
        """The prices in words: `USD 2.50 per hour`, or each price per GPU and per profile."""
        if self.usd_per_hour is not None:
            return f"USD {self.usd_per_hour:g} per hour"
        gpus = [f"USD {p:g} per hour of each {name} GPU a run used" for name, p in sorted(self.per_gpu.items())]
        profiles = [f"USD {p:g} per hour under hardware={name}" for name, p in sorted(self.per_profile.items())]
        return ", ".join(gpus + profiles)


def prices_by_name(key: str, values, example: str) -> dict[str, float]:
    """`cost.per_profile` or `cost.per_gpu` as {name: USD per hour}, names without a price left out."""
    if values is not None and not hasattr(values, "items"):
        raise UserError(f"{key}={values} is not a mapping of names to prices in USD per hour; pass e.g. "
                        f"{key}={{{example}:2.5}}")
    return {str(name): p for name, v in (values or {}).items() if (p := price(f"{key}.{name}", v))}


def price(key: str, value) -> float | None:
    if value is None:
        return None
    if not is_number(value) or value <= 0:
        raise UserError(f"{key}={shown(value)} is not a price in USD per hour; pass a positive number, e.g. "
                        f"{key}=2.5 (null: no price)")
    return float(value)


def usd_per_million_tokens(usd_per_hour: float | None, output_tok_s: float | None) -> float | None:
    """USD per 1M output tokens at this output throughput; None without a price or a throughput."""
    if usd_per_hour is None or not output_tok_s or output_tok_s <= 0:
        return None
    return usd_per_hour / (output_tok_s * SECONDS_PER_HOUR) * TOKENS


def row_cost(prices: Prices, row: Row, output_tok_s: float | None) -> float | None:
    """USD per 1M output tokens of a row's machine at this output throughput."""
    return usd_per_million_tokens(prices.of(row), output_tok_s)


def group_cost(prices: Prices, g: Group) -> float | None:
    """USD per 1M output tokens at a speed group's mean output throughput."""
    return row_cost(prices, g.runs[0], g.mean(SPEED)) if g.runs else None
