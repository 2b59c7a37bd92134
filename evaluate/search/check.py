"""What a search must hold before its first trial, each problem one line:
the space's params name trial values it has, its scheme families exist, a
keep_dense that can be > 0 has a sensitivity file with enough groups, and
the speed objectives have one scenario."""
import dataclasses

from evaluate.search import kept_dense
from evaluate.search.config import SearchConfig
from evaluate.search.space import SCHEMES, TrialValues
from evaluate.search.trial import speed_scenario
from quantize.common.errors import UserError
from quantize.common.settings import shown

PREFIX = "trial."


def before_sweep(config: SearchConfig, fixed: set[str] = frozenset(), swept: dict[str, str] | None = None) -> None:
    """`fixed`: the trial keys the command line sets to one value
    (`trial.keep_dense=0`), `swept`: those it sets to a sweep expression
    (`trial.scheme=choice(w4a16,w8a8)`); both replace the space's params as
    in any Optuna sweep."""
    where = f"conf/search/{config.space_name}.yaml"
    names = {f.name for f in dataclasses.fields(TrialValues)}
    for key in config.space.params:
        if key.startswith(PREFIX) and key[len(PREFIX):] not in names:
            raise UserError(f"{where}: params.{key} is not a trial value; the space sets "
                            f"{', '.join(PREFIX + n for n in sorted(names))}")
    params = {k: v for k, v in config.space.params.items() if k not in fixed} | (swept or {})
    for scheme in _choices(params.get(PREFIX + "scheme"), config.trial.scheme):
        if not isinstance(scheme, str) or scheme not in SCHEMES:
            raise UserError(f"{where}: unknown scheme family {shown(scheme)!r}; choose from {', '.join(SCHEMES)}")
    expression = params.get(PREFIX + "keep_dense")
    most = kept_dense.upper_bound(expression) if expression is not None else config.trial.keep_dense
    if most > 0:
        sensitivity, source = kept_dense.find(config.results_dir, config.model_name, config.model_path, "",
                                              config.sensitivity)
        if most > len(sensitivity.cells):
            raise UserError(f"{where}: keep_dense goes up to {most}, but {source} has {len(sensitivity.cells)} "
                            "module groups; lower the range's top")
    speed_scenario(config)


def _choices(expression, fixed: str) -> list[str]:
    """The values a categorical param can take (a fixed value is one)."""
    if expression is None:
        return [fixed]
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    value = OverridesParser.create().parse_override(f"{PREFIX}scheme={expression}").value()
    return [str(v) for v in value.list] if isinstance(value, ChoiceSweep) else [str(value)]
