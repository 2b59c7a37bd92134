"""The report's colours, in one place: one colour per recipe, the same in
every plot and in PNG and SVG alike, and the colours of what plots mark
(the accuracy floor, an SLO bound, the answer's pick, an entry the rule
cannot test)."""
from evaluate.analysis.groups import BASELINE

# Okabe-Ito, told apart with every common colour-vision deficiency, then
# tab10's colours it lacks; the original is always dark grey.
RECIPE_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
                  "#9467BD", "#8C564B", "#17BECF", "#BCBD22", "#1F77B4")
BASELINE_COLOUR = "#4D4D4D"
UNTESTED_COLOUR = "#BDBDBD"    # a single run: the rule cannot place it
FLOOR_COLOUR = "#C0392B"       # the accuracy floor and an SLO bound
PICK_COLOUR = "#000000"        # the ring around the answer's pick
FRONT_COLOUR = "#555555"       # the Pareto front's line


def recipe_colours(recipes) -> dict[str, str]:
    """recipe -> colour: the original grey, the others in order of name, so a
    report gives each recipe the same colour in every plot (colours repeat
    only past len(RECIPE_COLOURS) recipes)."""
    others = sorted(set(recipes) - {BASELINE})
    colours = {r: RECIPE_COLOURS[i % len(RECIPE_COLOURS)] for i, r in enumerate(others)}
    return colours | {BASELINE: BASELINE_COLOUR}
