"""Cost per 1M output tokens: what an hour of the machine costs (the report's
`cost:` setting, conf/report.yaml), spread over the output tokens it
produces in that hour, USD per hour ÷ (output tok/s × 3600) × 10^6. A price
is one for every row (`cost.usd_per_hour`) or one per hardware profile the
rows ran under (`cost.per_profile.<profile>`, conf/hardware/). Where no
price applies there is no cost, never a guess."""
import math
from dataclasses import dataclass, field

from evaluate.analysis.groups import SPEED, Group
from evaluate.results import Row
from quantize.common.errors import UserError

SECONDS_PER_HOUR = 3600
TOKENS = 1e6    # the cost is per million output tokens


@dataclass(frozen=True)
class Prices:
    """USD per hour of the machine the rows ran on: one for all, else per hardware profile."""
    usd_per_hour: float | None = None
    per_profile: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_config(cls, values: dict | None) -> "Prices":
        """conf/report.yaml's `cost:` (plain); a value that is not a positive number is one line."""
        values = values or {}
        profiles = values.get("per_profile") or {}
        return cls(price("cost.usd_per_hour", values.get("usd_per_hour")),
                   {name: p for name, v in profiles.items() if (p := price(f"cost.per_profile.{name}", v))})

    @property
    def any(self) -> bool:
        return self.usd_per_hour is not None or bool(self.per_profile)

    def of(self, row: Row) -> float | None:
        """The price of the machine a row ran on; None where none is set for it."""
        return self.usd_per_hour if self.usd_per_hour is not None else self.per_profile.get(row.hardware_defaults)

    def describe(self) -> str:
        """The prices in words: `USD 2.50 per hour` or `USD 2.50 per hour under hardware=cuda, ...`."""
        if self.usd_per_hour is not None:
            return f"USD {self.usd_per_hour:g} per hour"
        return ", ".join(f"USD {p:g} per hour under hardware={name}" for name, p in sorted(self.per_profile.items()))


def price(key: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{key}={value} is not a price in USD per hour; pass a positive number, e.g. "
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
