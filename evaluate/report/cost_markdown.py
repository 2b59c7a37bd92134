"""The cost per 1M output tokens as report.md shows it (evaluate.analysis.cost):
its column in the Summary and the answer where a price is set, the sentence
that gives the rule and the price, or says that none is set, and the cost at
the level the serving recommendation picks."""
from evaluate.analysis.cost import Prices, group_cost, row_cost
from evaluate.analysis.groups import Group
from evaluate.report.formatting import fmt_number
from evaluate.results import Row

COST_HEADER = "Cost (USD per 1M output tokens)"


def cost_cell(prices: Prices, g: Group) -> str:
    return fmt_number(group_cost(prices, g))


def cost_sentence(prices: Prices) -> str:
    if not prices.any:
        return ("No cost per 1M output tokens: no price is set (`cost.usd_per_hour=<USD>` on the command line, or "
                "a price per GPU or per hardware profile under `cost.per_gpu` or `cost.per_profile` in "
                "conf/report.yaml).")
    return (f"{COST_HEADER} = USD per hour ÷ (output tok/s × 3600) × 10^6 at the mean output throughput, with "
            f"{prices.describe()}" + ("" if prices.usd_per_hour is not None else
                                      "; — where no price is set for a row's GPUs or hardware profile") + ".")


def level_cost_text(prices: Prices, row: Row, output_tok_s: float | None) -> str:
    """`, USD 0.0312 per 1M output tokens at 53.2 output tok/s`; "" without a price or a throughput."""
    cost = row_cost(prices, row, output_tok_s)
    return "" if cost is None else f", USD {fmt_number(cost)} per 1M output tokens at {output_tok_s:.1f} output tok/s"
