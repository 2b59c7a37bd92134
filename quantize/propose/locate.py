"""Which sensitivity file a proposal uses: the one given, or the one
`python -m quantize.sensitivity` wrote for this model's weights and the base
recipe's weight scheme."""
import sys
from dataclasses import dataclass
from pathlib import Path

from quantize.common import sensitivity_file
from quantize.common.errors import UserError
from quantize.common.recipe_edit import WeightScheme
from quantize.common.sensitivity_file import Sensitivity

HASH_CHARS = 12   # the folder name's share of the weights hash
SCHEME_FIELDS = ("num_bits", "type", "symmetric", "strategy", "group_size")


@dataclass(frozen=True)
class Fitting:
    """The sensitivity file that fits the base recipe, as `python -m
    quantize.sensitivity` records it: its scheme key (with -m<hash> for other
    modules than the usual) and the modules it covers (modules_of); both None
    when the sensitivity cannot measure the recipe, `unmeasured` saying why."""
    key: str | None
    coverage: dict | None
    unmeasured: str | None = None


def sensitivity_for(choice: str, results_dir: Path, model_name: str, weights_hash: str, scheme: WeightScheme,
                    fitting: Fitting, measure_command: str) -> tuple[Path, Sensitivity]:
    """`choice` "auto" or a path; the file, checked to be of these weights."""
    coverage = fitting.coverage
    if choice == "auto":
        return _auto(results_dir, model_name, weights_hash, scheme, fitting, measure_command)
    path = Path(choice)
    found = sensitivity_file.read(path)
    if found.weights_hash[:HASH_CHARS] != weights_hash[:HASH_CHARS]:
        raise UserError(f"sensitivity file {path} was measured on other weights ({found.model_name}, "
                        f"{found.weights_hash[:HASH_CHARS]}) than model {model_name} ({weights_hash[:HASH_CHARS]}); "
                        f"pass the model it was measured on, or {_measure_hint(fitting, measure_command)}")
    if not same_scheme(found, scheme, coverage):
        print(f"warning: sensitivity file {path} was measured with scheme {found.scheme_key}, the recipe quantizes "
              f"with {scheme.key}{_other_modules(found, coverage)}; the ranking is a guide only", file=sys.stderr)
    return path, found


def _auto(results_dir: Path, model_name: str, weights_hash: str, scheme: WeightScheme, fitting: Fitting,
          measure_command: str) -> tuple[Path, Sensitivity]:
    folder = Path(results_dir) / "sensitivity" / model_name
    of_weights = [(p, s) for p, s in sensitivity_file.readable(sensitivity_file.find(results_dir))
                  if s.model_name == model_name and s.weights_hash[:HASH_CHARS] == weights_hash[:HASH_CHARS]]
    matching = [(p, s) for p, s in of_weights if same_scheme(s, scheme, fitting.coverage)]
    if not matching and fitting.unmeasured:
        found = f" (files of these weights: {', '.join(str(p) for p, _ in of_weights)})" if of_weights else ""
        raise UserError(f"no sensitivity file fits: {fitting.unmeasured}, which the sensitivity does not measure; "
                        f"pass sensitivity=<path to sensitivity.json> of model {model_name} (weights "
                        f"{weights_hash[:HASH_CHARS]}) measured with a recipe of one weight scheme, as a guide"
                        f"{found}; {_measure_hint(fitting, measure_command)}")
    if not matching:
        others = f" (only for other schemes: {', '.join(s.scheme_key for _, s in of_weights)})" if of_weights else ""
        raise UserError(f"no sensitivity file for model {model_name} (weights {weights_hash[:HASH_CHARS]}) and scheme "
                        f"{fitting.key} under {folder}{others}; measure it first: {measure_command} "
                        "(or pass sensitivity=<path to sensitivity.json>)")
    return max(matching, key=lambda found: found[1].created)


def _measure_hint(fitting: Fitting, measure_command: str) -> str:
    """How to get a file: `measure_command` measures the recipe itself, or, one
    the sensitivity cannot measure, a recipe of one weight scheme whose file is a guide."""
    if fitting.unmeasured:
        return f"measure one of a single-scheme recipe: {measure_command}"
    return f"measure this one: {measure_command}"


def same_scheme(found: Sensitivity, scheme: WeightScheme, coverage: dict | None) -> bool:
    """The file was measured on the modules the recipe quantizes, and its weight
    arguments agree with the scheme on every field both state."""
    if coverage is None or found.modules() != coverage:
        return False
    weights = found.scheme.get("weights", found.scheme) if isinstance(found.scheme, dict) else {}
    if not isinstance(weights, dict) or "num_bits" not in weights:
        return False
    mine = {"num_bits": scheme.num_bits, "type": scheme.type, "symmetric": scheme.symmetric,
            "strategy": scheme.strategy, "group_size": scheme.group_size}
    return all(weights[k] == mine[k] for k in SCHEME_FIELDS if weights.get(k) is not None and mine[k] is not None)


def _other_modules(found: Sensitivity, coverage: dict | None) -> str:
    if coverage is None or found.modules() == coverage:
        return ""
    return " on other modules (the file's scheme has another targets or ignore list)"
