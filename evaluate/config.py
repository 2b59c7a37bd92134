"""`python -m evaluate`'s config, typed: the entry point (evaluate.cli)
converts Hydra's composed DictConfig once, here, and everything below it
receives these objects. Bad values are one UserError line naming the fix."""
from dataclasses import dataclass

from omegaconf import OmegaConf

from evaluate import engines, precision, scenarios
from evaluate.accuracy import AccuracyConfig
from evaluate.engines import EngineConfig
from evaluate.limits import Limits
from evaluate.lmeval import LmEvalConfig
from evaluate.precision import RunPlan
from evaluate.scenarios import ScenarioChoice
from evaluate.serving import profiles
from evaluate.serving.profiles import LoadProfile
from evaluate.serving.slo import SLO
from evaluate.target import TargetConfig, artifact_dir, verify_mode
from quantize.common import hf_load, hub, manifest, tracking
from quantize.common.errors import UserError
from quantize.common.extensions import plain
from quantize.common.paths import folder_name, folder_setting
from quantize.common.settings import flag, integer, is_name, shown
from quantize.common.tracking import Tracker

# The top-level keys that decide how many warm-up and timed runs a scenario gets.
RUN_KEYS = ("runs", "min_runs", "max_runs", "target_ci_pct", "warmup_runs", "warmup_tolerance_pct",
            "max_warmup_runs")


@dataclass(frozen=True)
class EvaluateConfig:
    """One evaluate job: what to open, in which engine, what to measure, where to write."""
    target: TargetConfig
    engine: EngineConfig
    scenario: ScenarioChoice
    plan: RunPlan                         # warm-up and timed runs (fixed or auto)
    limits: Limits                        # the most work a scenario may ask for (conf/evaluate.yaml limits:)
    accuracy: AccuracyConfig | None       # None: accuracy=none
    lm_eval: LmEvalConfig | None          # None: lm_eval=none
    load: LoadProfile | None              # conf/load/; None: load=none, batch timed runs
    slo: SLO | None                       # conf/slo/; None: slo=none
    seed: int                             # prompt token ids are drawn from it (+ run index)
    results_dir: str
    results_per_process: bool
    skip_completed: bool
    hardware: str | None                  # the conf/hardware/ profile the defaults came from
    tracker: Tracker | None = None        # conf/tracking/; None: tracking=none

    @classmethod
    def from_cfg(cls, cfg) -> "EvaluateConfig":
        """The composed `evaluate` config -> the typed one (the entry point's one conversion)."""
        hf_load.check_setting(cfg.get("trust_remote_code"))
        plan, limits = precision.plan({key: cfg.get(key) for key in RUN_KEYS}), Limits.from_group(_group(cfg, "limits"))
        limits.check_plan(plan)
        return cls(
            target=target_config(cfg), engine=engines.build(cfg.engine), scenario=scenario_choice(cfg.scenario),
            plan=plan, limits=limits,
            accuracy=AccuracyConfig.from_group(plain(cfg.accuracy)),
            lm_eval=LmEvalConfig.from_group(plain(cfg.lm_eval)),
            load=profiles.from_group(_group(cfg, "load")), slo=SLO.from_dict(_group(cfg, "slo")),
            seed=integer("seed", cfg.seed, minimum=0),
            results_dir=folder_setting("results_dir", cfg.results_dir), results_per_process=flag("results_per_process", cfg.results_per_process),
            skip_completed=flag("skip_completed", cfg.skip_completed),
            hardware=hardware_profile(cfg.get("hardware")),
            tracker=tracking.from_group(_group(cfg, "tracking")))


def hardware_profile(group) -> str | None:
    """The conf/hardware/ profile's name (`group`: the hardware group), which every row records."""
    if not group:
        return None
    name = group.get("name")
    if not is_name(name):
        raise UserError(f"hardware.name={shown(name)} is not a name: it is the conf/hardware/ profile the rows record; "
                        "choose a profile with hardware=cpu or hardware=cuda")
    return name


def target_config(cfg) -> TargetConfig:
    """What a composed evaluate config opens (model=, recipe=, artifacts_dir);
    also what `python -m evaluate.capabilities` plans recipes with."""
    recipe = cfg.get("recipe")
    name = cfg.model.get("name")
    revision = None
    if cfg.model.get("path") is not None:  # a revision names the artifact folder (model.name); a local folder has none
        revision = hub.check_revision(str(cfg.model.path), cfg.model.get("revision"))
    config = TargetConfig(model_name=None if name is None else folder_name("model.name", name),
                          model_path=_text(cfg.model.get("path")),
                          recipe_name=folder_name("recipe.name", recipe.name) if recipe else None,
                          recipe_path=_text(recipe.get("path")) if recipe else None,
                          artifacts_dir=folder_setting("artifacts_dir", cfg.artifacts_dir), verify=verify_mode(cfg.get("verify", "fingerprint")))
    if revision is not None and config.recipe_name is not None:
        _check_built_revision(config, revision)
    return config


def _check_built_revision(config: TargetConfig, revision: str) -> None:
    """The artifact found for model.revision was built from it (a folder
    named by another revision, or a model.name given, holds another's)."""
    where = artifact_dir(config)
    try:
        built = manifest.read(where)
    except UserError:   # not a manifest: opening the artifact says so
        return
    if built is not None:
        hub.check_built_revision(revision, dict((built.config or {}).get("model") or {}), built.model.revision, where)


def scenario_choice(node) -> ScenarioChoice:
    """The composed scenario group -> its typed choice (files it names are read later)."""
    if OmegaConf.is_config(node) and "path" in node.keys() and OmegaConf.is_missing(node, "path"):
        values = {k: node[k] for k in node.keys() if k not in ("path", "name")}  # unset: name cannot resolve
        return scenarios.choose({**plain(values), "path": None}, "scenario")
    return scenarios.choose(plain(node), "scenario")


def _group(cfg, key: str) -> dict | None:
    return plain(cfg[key]) if cfg.get(key) is not None else None


def _text(value) -> str | None:
    return None if value is None else str(value)
