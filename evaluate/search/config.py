"""The search's typed config: what `python -m evaluate.search` composed
(conf/search.yaml + conf/search/<name>.yaml), converted once at the entry
point; the trial job and the checks before the sweep take this, never the
DictConfig."""
from dataclasses import dataclass, field
from pathlib import Path

from evaluate.search import study_file
from evaluate.search.space import RecipeSpace, TrialValues
from evaluate.search.study_file import Objective
from quantize.common import hub
from quantize.common.errors import UserError
from quantize.common.extensions import build
from quantize.common.paths import folder_name, folder_setting
from quantize.common.settings import integer

# Where each objective's value comes from.
ACCURACY_METRICS = ("recovery_pct", "kl_divergence", "top1_agreement", "perplexity", "lastword_recovery_pct")
SPEED_METRICS = ("output_throughput", "total_token_throughput", "input_throughput", "tpot_ms_mean",
                 "ttft_ms_mean", "latency_s")
SIZE_METRICS = ("size_mb",)
DIRECTIONS = ("maximize", "minimize")


@dataclass(frozen=True)
class SearchConfig:
    study: str
    space: RecipeSpace
    space_name: str                 # the conf/search/<name> option
    objectives: list[Objective]
    trial: TrialValues
    trial_number: int | None        # the sweeper's; None under a sweeper that sets none
    n_trials: int
    storage: str | None
    results_dir: Path
    artifacts_dir: Path
    model_name: str
    model_path: str
    model_revision: str | None      # a hub id's branch, tag or commit; the sweeper pins it to the study's commit
    engine: str
    scenario: dict                  # the scenario group's values (name, shape or path)
    accuracy: str                   # evaluate's accuracy option (conf/accuracy/): austen | none
    sensitivity: str                # auto | none | <path to a sensitivity file or its folder>
    seed: int
    quantize_overrides: list[str] = field(default_factory=list)
    evaluate_overrides: list[str] = field(default_factory=list)

    @classmethod
    def from_values(cls, values: dict, space_name: str) -> "SearchConfig":
        """From the composed config as a plain, resolved dict."""
        space = build(values["search"], RecipeSpace, f"conf/search/{space_name}.yaml")
        integer("n_jobs", values.get("n_jobs", 1), 2, minimum=1)   # the sweeper's; checked here, before the sweep
        # before the study's name, which it is part of by default: a bad one is the user's model.name
        model_name = folder_name("model.name", values["model"]["name"])
        config = cls(
            study=study_file.study_name(values["study"]), space=space, space_name=space_name,
            objectives=objectives(space.objectives, space_name),
            trial=TrialValues.from_values(values.get("trial") or {}),
            trial_number=_int_or_none(values.get("trial_number")),
            n_trials=integer("n_trials", values["n_trials"], 20, minimum=1), storage=values.get("storage"),
            results_dir=Path(folder_setting("results_dir", values["results_dir"])),
            artifacts_dir=Path(folder_setting("artifacts_dir", values["artifacts_dir"])),
            model_name=model_name, model_path=str(values["model"]["path"]),
            model_revision=hub.check_revision(str(values["model"]["path"]), values["model"].get("revision")),
            engine=str(values["engine"]["name"]), scenario=dict(values["scenario"]),
            accuracy=str(values["accuracy"]["name"]), sensitivity=str(values.get("sensitivity") or "none"),
            seed=integer("seed", values.get("seed") or 0, minimum=0),
            quantize_overrides=[str(a) for a in values.get("quantize_overrides") or []],
            evaluate_overrides=[str(a) for a in values.get("evaluate_overrides") or []],
        )
        config.check()
        return config

    @property
    def accuracy_enabled(self) -> bool:
        return self.accuracy != "none"

    @property
    def scenario_arg(self) -> str:
        """`scenario=` of the evaluate command: the file a path choice named, else the option's name."""
        return str(self.scenario.get("path") or self.scenario.get("name"))

    def check(self) -> None:
        where = f"conf/search/{self.space_name}.yaml"
        for o in self.objectives:
            if o.name in ACCURACY_METRICS and not self.accuracy_enabled:
                raise UserError(f"objective {o.name} needs an accuracy measurement; drop accuracy=none "
                                f"or remove it from {where}")
            if o.name in SPEED_METRICS and not o.scenario:
                raise UserError(f"objective {o.name} needs a scenario; pass scenario=<name> (not none) "
                                f"or remove it from {where}")


def objectives(entries: list[dict], space_name: str) -> list[Objective]:
    where = f"conf/search/{space_name}.yaml"
    if not entries:
        raise UserError(f"{where} names no objectives; add objectives: [{{name, direction, unit}}, ...]")
    out = []
    for entry in entries:
        try:
            objective = Objective(**entry)
        except TypeError as e:
            raise UserError(f"{where}: an objective takes name, direction, unit, scenario ({e})") from None
        known = ACCURACY_METRICS + SPEED_METRICS + SIZE_METRICS
        if objective.name not in known:
            raise UserError(f"{where}: unknown objective {objective.name!r}; choose from {', '.join(known)}")
        if objective.direction not in DIRECTIONS:
            raise UserError(f"{where}: objective {objective.name} direction must be maximize or minimize, "
                            f"not {objective.direction!r}")
        if objective.scenario in ("none", ""):
            objective = Objective(objective.name, objective.direction, objective.unit, None)
        out.append(objective)
    return out


def _int_or_none(value) -> int | None:
    return None if value is None else integer("trial_number", value, 3)
