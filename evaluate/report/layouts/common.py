"""What several layouts share."""
from evaluate.analysis.groups import Group
from evaluate.report.formatting import short
from evaluate.report.labels import setup_difference


def result_label(g: Group, others: list[Group]) -> str:
    """`recipe · engine` (one group per identity in `others`), with the model,
    the artifact or the differing setup settings only where `others` need them."""
    name = f"{g.model_name}/{g.recipe}" if len({o.model_name for o in others}) > 1 else g.recipe
    same = [o for o in others if (o.model_name, o.recipe) == (g.model_name, g.recipe)]
    name += f" ({short(g.artifact_id)})" if len({o.artifact_id for o in same}) > 1 else ""
    twins = [o for o in same if (o.artifact_id, o.engine) == (g.artifact_id, g.engine)]
    return f"{name} · {g.engine}" + (f" ({setup_difference(g, twins)})" if len(twins) > 1 else "")
