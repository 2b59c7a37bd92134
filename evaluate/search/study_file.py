"""The search's record in a results store: every trial of a study, as the study
storage (the database) holds it plus what each trial built, snapshot after each
batch of trials. The report reads this file, not the database, so a report
needs no database driver or password.

    <results_dir>/search/<study name>/study.json
"""
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantize.common import atomic
from quantize.common.errors import UserError
from quantize.common.paths import folder_name

KIND = "quantbench.search"
VERSION = 1
FILE = "study.json"


@dataclass(frozen=True)
class Objective:
    name: str               # the row metric, e.g. "recovery_pct", "output_throughput", "size_mb"
    direction: str          # "maximize" | "minimize"
    unit: str               # "%", "tok/s", "MB", "nats"
    scenario: str | None = None   # the speed objective's scenario


@dataclass(frozen=True)
class Trial:
    number: int
    state: str              # Optuna's: COMPLETE, FAIL, RUNNING, WAITING, PRUNED
    params: dict
    values: list[float] | None = None   # in the order of SearchRecord.objectives
    recipe: str | None = None           # the trial's recipe name (recipe=<name> of quantize)
    recipe_path: str | None = None
    artifact_id: str | None = None
    artifact_dir: str | None = None
    speed: str | None = None            # "measured" or "reused from <artifact id>"
    repro: str | None = None            # the commands that rebuild and remeasure this point
    error: str | None = None            # a failed trial's one line
    wall_s: float | None = None
    machine: str | None = None          # the id of the machine its job ran on (SearchRecord.hardware)


@dataclass(frozen=True)
class SearchRecord:
    study: str
    storage: str            # the storage URL without its password
    objectives: list[Objective]
    engine: str
    model: str
    space: str              # the conf/search/<name> the trials came from
    n_trials: int           # the study's target
    trials: list[Trial]
    # the machines the trials' jobs ran on, which measured their speed (a
    # Slurm or Ray launcher may use several): machine id -> its facts, the
    # hardware of the rows less the hostname (evaluate.results.machine_of)
    hardware: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    wall_s: float | None = None
    updated: str = ""

    def complete(self) -> list[Trial]:
        return [t for t in self.trials if t.state == "COMPLETE" and t.values is not None]


def study_name(value) -> str:
    """study=, checked: each study is one folder under <results_dir>/search
    (a '/' hid its study.json from find(), '..' wrote outside)."""
    return folder_name("study", value, "results_dir/search")


def path_for(results_dir: Path, study: str) -> Path:
    return Path(results_dir) / "search" / study / FILE


def find(results_dir: Path) -> list[Path]:
    return sorted((Path(results_dir) / "search").glob(f"*/{FILE}"))


def write(results_dir: Path, record: SearchRecord) -> Path:
    path = path_for(results_dir, record.study)
    atomic.write_json(path, {"kind": KIND, "version": VERSION, **asdict(record)})
    return path


def read(path: str | Path) -> SearchRecord:
    path = Path(path)
    fix = "rerun `python -m evaluate.search` with the same study name to rewrite it"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not a readable search record ({e}); {fix}") from None
    if not isinstance(record, dict) or record.get("kind") != KIND or record.get("version") != VERSION:
        raise UserError(f"{path} is not a version-{VERSION} search record; {fix}")
    record = {k: v for k, v in record.items() if k not in ("kind", "version")}
    try:
        objectives = [Objective(**o) for o in record.pop("objectives")]
        trials = [Trial(**t) for t in record.pop("trials")]
        return SearchRecord(objectives=objectives, trials=trials, **record)
    except (KeyError, TypeError) as e:
        raise UserError(f"{path} is a damaged search record ({e}); {fix}") from None


# What one trial's job built, written by the job itself (it may run on another
# node) and joined into study.json by trial number when the sweeper snapshots.
# `values` (the objective values the job returned, in the objectives' order):
# a sweeper killed before it told the study a finished trial's values takes
# them from here when the study resumes, instead of running the trial again.
# `hardware`: the machine the job ran on (speed.Host: its hardware but the hostname).
TRIAL_FIELDS = ("recipe", "recipe_path", "artifact_id", "artifact_dir", "speed", "repro", "error", "wall_s",
                "values", "hardware")


def trial_info_path(results_dir: Path, study: str, number: int) -> Path:
    return Path(results_dir) / "search" / study / "trials" / f"{number}.json"


def write_trial_info(results_dir: Path, study: str, number: int, info: dict) -> Path:
    unknown = set(info) - set(TRIAL_FIELDS)
    if unknown:
        raise ValueError(f"unknown trial fields {sorted(unknown)}; known: {TRIAL_FIELDS}")
    path = trial_info_path(results_dir, study, number)
    atomic.write_json(path, info)
    return path


def read_trial_info(results_dir: Path, study: str, number: int) -> dict:
    """The trial job's own record; {} while it has not written one (running, or killed)."""
    try:
        info = json.loads(trial_info_path(results_dir, study, number).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in info.items() if k in TRIAL_FIELDS}
