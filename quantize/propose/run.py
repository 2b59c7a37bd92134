"""A proposal from start to end: the base recipe, its sensitivity file, k for
the target, the new recipe written into recipes/ and the commands that build
and measure it."""
import os
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from quantize.common import atomic, fingerprint, hf_load, hub, recipe_edit
from quantize.common.checkpoint import check_weight_files, weight_files
from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR, RECIPES_DIR, resolve
from quantize.common.recipe_choices import find as find_recipe, has_preset
from quantize.common.sensitivity_file import Sensitivity, modules_of
from quantize.propose import choose
from quantize.propose.config import ProposeConfig, Target
from quantize.propose.locate import Fitting, sensitivity_for
from quantize.propose.size import ModelWeights, UniformSize, dense_cost, uniform_size
from quantize.recipe import RecipeFile, check_with_llmcompressor, load


GUIDE_RECIPE = "w4a16_gptq"   # one weight scheme over every Linear: the sensitivity measures it


@dataclass(frozen=True)
class Proposal:
    name: str
    path: Path                       # the recipe file written
    base: str
    sensitivity_path: Path
    target: Target
    chosen: choose.Estimate
    groups: int                      # cells in the sensitivity file
    modules: list[str]               # kept dense
    uniform: UniformSize


def run(config: ProposeConfig) -> Proposal:
    model_dir = _model_dir(config.model.path, config.model.revision)  # before the recipe's scheme, which imports compressed-tensors (~5 s)
    base, groups, scheme = _base_recipe(config)
    weights_hash = fingerprint.compute(weight_files(model_dir)).sha256
    fitting = _fitting(base)
    sens_path, sens = sensitivity_for(config.sensitivity, Path(config.results_dir), config.model.name, weights_hash,
                                      scheme, fitting, _measure_command(config, measurable=not fitting.unmeasured))
    options, uniform = _estimates(config, base, groups, model_dir, sens)
    chosen = _choose(options, config.target)
    name = config.name or f"{config.recipe.name}_keep{chosen.k}"
    modules = choose.kept_modules(sens, chosen.k)
    proposal = Proposal(name=name, path=Path(config.recipes_dir) / f"{name}.yaml", base=config.recipe.name,
                        sensitivity_path=sens_path, target=config.target, chosen=chosen, groups=len(sens.cells),
                        modules=modules, uniform=uniform)
    text = header(proposal, sens, base.text, config) + recipe_edit.with_kept_dense(base.text, modules)
    _write(proposal, text, config)
    _report(proposal, sens, config)
    return proposal


def _base_recipe(config: ProposeConfig) -> tuple[RecipeFile, list[recipe_edit.ConfigGroup], recipe_edit.WeightScheme]:
    """The base recipe, its config groups and the weight scheme it quantizes
    with; one that quantizes no weights is refused."""
    base = load(config.recipe)
    groups = recipe_edit.config_groups(base.data, base.name)
    scheme = recipe_edit.weight_scheme(groups)
    if scheme is None:
        raise UserError(f"recipe={config.recipe.name} quantizes nothing, so no group can be kept dense; "
                        "start from a recipe that quantizes weights (e.g. recipe=w4a16_gptq)")
    return base, groups, scheme


def _fitting(base: RecipeFile) -> Fitting:
    """The key and modules of the base recipe's sensitivity file, as the
    sensitivity measures the recipe."""
    from quantize.sensitivity.scheme import from_recipe
    try:
        measured = from_recipe(base)
    except UserError as e:   # its first clause says why, e.g. "recipe r quantizes weights with 2 different schemes"
        return Fitting(key=None, coverage=None, unmeasured=str(e).split("; ")[0])
    return Fitting(key=measured.key, coverage=modules_of(measured.targets, measured.ignore))


def _estimates(config: ProposeConfig, base: RecipeFile, groups: list[recipe_edit.ConfigGroup], model_dir: Path,
               sens: Sensitivity) -> tuple[list[choose.Estimate], UniformSize]:
    """KL and size for every k, and the base recipe's size they start from."""
    weights = ModelWeights.read(model_dir)
    uniform = uniform_size(Path(config.artifacts_dir) / config.model.name / config.recipe.name, base.text, model_dir,
                           weights, groups)
    costs = {(c.layer, c.group): dense_cost(c, weights, groups) for c in sens.cells}
    return choose.estimates(sens, uniform.bytes, costs), uniform


def _choose(options: list[choose.Estimate], target: Target) -> choose.Estimate:
    if target.kind == "max_kl":
        return choose.for_max_kl(options, target.value)
    if target.kind == "max_size_mb":
        return choose.for_max_size(options, target.value)
    return choose.for_kept_dense(options, int(target.value))


def _model_dir(path: str, revision: str | None = None) -> Path:
    """The model's local folder (a hub id's snapshot at `revision`, the default model materialized)."""
    from quantize.common.assets import SMOLLM2_DIR, ensure_default_model
    model_dir = hub.local_dir(path, revision)
    if model_dir == SMOLLM2_DIR and not model_dir.exists():
        ensure_default_model()
    hf_load.refuse_model_code(model_dir)  # propose loads no model, but takes no such folder either
    if not weight_files(model_dir):
        raise UserError(f"model {model_dir} has no *.safetensors weights; pass model=<preset|checkpoint dir>")
    check_weight_files(weight_files(model_dir))
    return model_dir


def header(p: Proposal, sens: Sensitivity, base_text: str, config: ProposeConfig) -> str:
    """The recipe's comment: where the choice comes from and what it is expected to give."""
    c = p.chosen
    lines = [
        f"Proposed mixed precision: recipe {p.base} with the {c.k} most sensitive of {p.groups} module groups "
        f"kept dense, with the siblings vLLM loads with them (q/k/v, gate/up, q_a/kv_a, a MoE block's experts): "
        f"{len(p.modules)} modules,",
        f"by the sensitivity file {_shown(p.sensitivity_path)}",
        f"(model {sens.model_name}, weights {sens.weights_hash[:12]}, scheme {sens.scheme_key}: "
        "KL of each group quantized alone).",
        f"Target: {p.target.text}; k = {c.k}.",
        f"Estimated KL: {c.kl_nats:.4g} nats per token, taking KL as additive over groups: the base recipe's "
        f"{choose.base_kl(sens):.4g} nats ({_base_kl_source(sens)}) minus each kept group's own KL{_scaled(sens)}.",
        f"Estimated size: {c.size_bytes / choose.MB:.2f} MB (base recipe {p.uniform.bytes / choose.MB:.2f} MB, "
        f"{p.uniform.source}).",
        "Measure the truth:",
        *[f"  {command}" for command in next_commands(p, config)],
    ]
    made_by = _propose_command()
    if made_by:
        lines.insert(0, f"Made by: {made_by}")
    base_comment = _leading_comment(base_text)
    if base_comment:
        lines.append(f"Base recipe {p.base}:")
        lines += [f"  {line}" for line in base_comment]
    return "".join(f"# {line}\n" for line in lines)


def _leading_comment(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        out.append(line.lstrip("#").strip())
    return out


def _write(p: Proposal, text: str, config: ProposeConfig) -> None:
    """Checked by llm-compressor first, then written in one rename; an existing
    different recipe of that name is kept unless force=true."""
    if p.name == config.recipe.name:
        raise UserError(f"name={p.name} is the base recipe's own name; choose another name=")
    if Path(config.recipes_dir) == RECIPES_DIR and has_preset(p.name):
        raise UserError(f"conf/recipe/{p.name}.yaml is a preset of that name, which `recipe={p.name}` would select; "
                        "choose another name=")
    if p.path.is_file() and p.path.read_text() != text and not config.force:
        raise UserError(f"{p.path} exists with other contents; pass name=<another name> or force=true to replace it")
    with tempfile.TemporaryDirectory() as tmp:
        draft = Path(tmp) / f"{p.name}.yaml"
        draft.write_text(text)
        check_with_llmcompressor(RecipeFile(name=p.name, path=draft, text=text, data={}))
    atomic.write_text(p.path, text)


def _report(p: Proposal, sens: Sensitivity, config: ProposeConfig) -> None:
    c = p.chosen
    print(f"sensitivity: {_shown(p.sensitivity_path)} ({p.groups} groups, scheme {sens.scheme_key})")
    print(f"target {p.target.text}: keep k={c.k} groups dense, with their fused siblings {len(p.modules)} modules; "
          f"estimated KL {c.kl_nats:.4g} nats per token, estimated size {c.size_bytes / choose.MB:.2f} MB")
    print(f"base recipe {p.base}: {p.uniform.bytes / choose.MB:.2f} MB, {p.uniform.source}")
    if c.k in (0, p.groups):
        print(f"note: k={c.k} keeps {'no group' if c.k == 0 else 'every group'} dense: the recipe quantizes "
              f"{'as the base recipe does' if c.k == 0 else 'nothing of the decoder layers'}")
    print(f"wrote {_shown(p.path)}")
    print("next:")
    for command in next_commands(p, config):
        print(f"  {command}")


def next_commands(p: Proposal, config: ProposeConfig) -> list[str]:
    """Build the proposed recipe's artifact, then measure it."""
    recipe_arg = p.name if Path(config.recipes_dir) == RECIPES_DIR else str(p.path)
    extra = _model_args(config)
    return [f"python -m {stage} recipe={shlex.quote(recipe_arg)}{extra}" for stage in ("quantize", "evaluate")]


def _scaled(sens: Sensitivity) -> str:
    scale = choose.interaction_scale(sens)
    return "" if abs(scale - 1) < 1e-6 else f" x {scale:.3g} (measured all-at-once / sum of the groups' own)"


def _base_kl_source(sens: Sensitivity) -> str:
    if sens.baseline_kl is not None:
        return "measured with every group quantized"
    return "the sum of the groups' own KL: the file has no measured baseline"


def _propose_command() -> str | None:
    """This run's command line, without the folder it ran in."""
    from quantize.common.jobs import job_command
    command = job_command("quantize.propose")
    return command.split(" && ", 1)[-1] if command else None


def _model_args(config: ProposeConfig) -> str:
    """The model= and artifacts_dir= the next commands need (none for the defaults)."""
    args = _model_arg(config)
    if Path(config.artifacts_dir) != resolve("artifacts"):
        args += f" artifacts_dir={shlex.quote(config.artifacts_dir)}"
    return args


def _model_arg(config: ProposeConfig) -> str:
    """model= (none for the default model) and model.name= where the name is not
    the one model= gives by itself: the next commands' files are found by it."""
    from quantize.common.assets import SMOLLM2_DIR
    if resolve(config.model.path) == SMOLLM2_DIR:
        arg, default_name = "", yaml.safe_load((CONF_DIR / "model" / "smollm2_135m.yaml").read_text())["name"]
    else:
        arg = f" model={shlex.quote(config.model.path)}"
        if config.model.revision is not None:
            arg += f" {hub.revision_arg(config.model.revision)}"
        default_name = hub.folder_name(Path(config.model.path).name, config.model.revision)
    return arg if config.model.name == default_name else f"{arg} model.name={shlex.quote(config.model.name)}"


def _measure_command(config: ProposeConfig, measurable: bool) -> str:
    """Measures the base recipe's file; one the sensitivity cannot measure, a
    shipped recipe of one weight scheme, whose file propose takes as a guide."""
    results = "" if Path(config.results_dir) == resolve("results") else f" results_dir={shlex.quote(config.results_dir)}"
    recipe = _recipe_arg(config) if measurable else GUIDE_RECIPE
    return f"python -m quantize.sensitivity recipe={recipe}{_model_arg(config)}{results}"


def _recipe_arg(config: ProposeConfig) -> str:
    """The base recipe as `recipe=` selects it: its option name, or its file
    where no option of that name is that file (recipe=<path>)."""
    option = find_recipe(config.recipe.name)
    if option and Path(option.path).resolve() == Path(config.recipe.path).resolve():
        return config.recipe.name
    return shlex.quote(config.recipe.path)


def _shown(path: Path) -> str:
    """A path relative to the cwd when it is below it."""
    try:
        return str(Path(path).resolve().relative_to(Path(os.getcwd()).resolve()))
    except ValueError:
        return str(path)
