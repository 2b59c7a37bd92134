"""Which modules a trial keeps dense: the k most sensitive module groups of
the model's sensitivity file (quantize.common.sensitivity_file), found
under the results store (`sensitivity=auto`) or named by path."""
import json
from pathlib import Path

from evaluate.search.space import KeptDense
from quantize.common import fingerprint, sensitivity_file
from quantize.common.checkpoint import weight_files
from quantize.common.errors import UserError
from quantize.common.provenance import sha256_files

MEASURE = "python -m quantize.sensitivity recipe=w4a16_gptq"


def upper_bound(expression) -> int:
    """The largest keep_dense an Optuna sweeper expression can give
    (choice, range and interval include their ends there)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    try:
        value = OverridesParser.create().parse_override(f"trial.keep_dense={expression}").value()
    except Exception as e:  # Hydra's grammar errors: all mean "not an expression"
        raise UserError(f"trial.keep_dense: {expression!r} is not a sweep expression ({e})") from None
    if isinstance(value, ChoiceSweep):
        return max(int(v) for v in value.list)
    if isinstance(value, RangeSweep):
        return int(value.stop)
    if isinstance(value, IntervalSweep):
        return int(value.end)
    return int(value)


def find(results_dir: Path, model_name: str, model_path: str, scheme: str, choice: str) -> tuple:
    """(Sensitivity, its path relative to the results store) for `choice`
    (`auto` or a path); auto takes the files measured on every Linear but
    lm_head, as a trial quantizes, and prefers the one of the trial's scheme
    family (its scheme key starts with it), else takes the first for the model."""
    if choice == "none":
        raise UserError(f"keep_dense > 0 needs a sensitivity file, and sensitivity=none; pass sensitivity=auto "
                        f"(after `{MEASURE}`) or a path, or search trial.keep_dense=0")
    if choice != "auto":
        path = Path(choice)
        return _named(path, results_dir, model_name, model_path), str(path)
    candidates = [p for p in sensitivity_file.find(results_dir) if p.parent.parent.name == model_name]
    # a trial quantizes every Linear but lm_head: a file measured with another
    # ignore list (a proposed recipe's) lacks cells and does not rank them
    read = [(s, p) for p, s in sensitivity_file.readable(candidates) if s.modules() == sensitivity_file.USUAL_MODULES]
    if read:
        hashes = _weights_hashes(model_path)
        read = [(s, p) for s, p in read if _of_weights(s, hashes)]
    if not read:
        where = Path(results_dir) / "sensitivity" / model_name
        raise UserError(f"keep_dense > 0 needs the sensitivity of {model_name} (none for these weights, measured on "
                        f"every Linear but lm_head, in {where}); "
                        f"run `{MEASURE} model=<the model> results_dir={results_dir}` first, or search "
                        "trial.keep_dense=0")
    sensitivity, path = next(((s, p) for s, p in read if s.scheme_key.startswith(scheme)), read[0])
    return sensitivity, str(Path(path).relative_to(results_dir))


def _named(path: Path, results_dir: Path, model_name: str, model_path: str) -> sensitivity_file.Sensitivity:
    """The file `sensitivity=<path>` names, held to what auto asks of one: it
    ranked the searched model's layers by another model's (or another
    coverage's) cells."""
    found = sensitivity_file.read(path)
    measure = f"`{MEASURE} model=<the model> results_dir={results_dir}`"
    if not _of_weights(found, _weights_hashes(model_path)):
        raise UserError(f"sensitivity={path} was measured on other weights ({found.model_name}, "
                        f"{found.weights_hash[:12]}) than model {model_name} ({model_path}); pass the file of this "
                        f"model, sensitivity=auto, or measure it: {measure}")
    if found.modules() != sensitivity_file.USUAL_MODULES:
        raise UserError(f"sensitivity={path} was measured with scheme {found.scheme_key} on other modules than "
                        f"a trial quantizes (every Linear but lm_head); pass sensitivity=auto or the file of "
                        f"{measure}")
    return found


def _of_weights(sensitivity: sensitivity_file.Sensitivity, hashes) -> bool:
    """Whether the file was measured on the model's weights (`hashes`: _weights_hashes's; None: cannot tell)."""
    return hashes is None or sensitivity.weights_hash in hashes(sensitivity.weights_hash)


def kept(results_dir: Path, model_name: str, model_path: str, scheme: str, k: int, choice: str) -> KeptDense:
    if k == 0:
        return KeptDense([], "")
    sensitivity, source = find(results_dir, model_name, model_path, scheme, choice)
    # kept_dense: with the siblings vLLM loads with one scheme (q/k/v, gate/up, MLA's q_a/kv_a, a MoE block's experts)
    return KeptDense([m for cell in sensitivity.kept_dense(k) for m in cell.modules], source)


def _weights_hashes(model_path: str):
    """A matcher of a file's weights_hash against the model's weights (the
    sampled fingerprint, else the full SHA-256, computed only if needed);
    None when the model's weights are not local files."""
    weights = weight_files(Path(model_path))
    if not weights:
        return None
    sampled = fingerprint.compute(weights).sha256

    def hashes(recorded: str) -> set[str]:
        return {sampled} if recorded == sampled else {sampled, sha256_files(weights)}
    return hashes


def linear_widths(model_path: str) -> set[int]:
    """The input widths of a decoder layer's Linear modules, from config.json
    (hidden, attention output, MLP intermediate); empty when it says none."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return set()
    config = config.get("text_config", config)
    widths = {config.get("hidden_size"), config.get("intermediate_size")}
    heads, head_dim = config.get("num_attention_heads"), config.get("head_dim")
    if heads and head_dim:
        widths.add(heads * head_dim)
    return {int(w) for w in widths if isinstance(w, int) and w > 0}
