"""quantbench's Optuna sweeper: Hydra's Optuna sweeper plugin
(hydra-optuna-sweeper) with what a long search on shared machines needs.

- Resume: `n_trials` is the study's total target. A rerun with the same study
  name and storage loads the study, marks the trials a killed sweeper left
  RUNNING as FAIL (user attr `interrupted`), queues their parameters to run
  first (user attr `retry_of` on the new trial), and runs only the trials the
  target still lacks. A left-RUNNING trial whose job had finished (its record
  holds its values: a batch's first jobs, or Slurm jobs that ran on) is
  completed with those values instead (user attr `recovered`). A trial whose
  job was ended from outside (the launcher's time limit, scancel, preemption,
  a lost node, a kill signal: user attr `killed`) is FAIL in its run and, on
  the next, run again first like an interrupted one: once, as a retry that is
  ended so again counts as failed. Finished trials (COMPLETE, PRUNED, FAIL
  other than interrupted or killed) count towards the target; so a trial that
  fails on its own is not retried.
- One sweeper per study at a time: the running one names itself in the
  study's user attr `sweeper` (host, pid, the pid's start time, heartbeat
  every 30 s); another one started on the same study refuses with one line
  while that process lives (same host: that pid with that start time, so a
  stopped sweeper still owns it and a reused pid does not) or its heartbeat is
  fresh (another host, or no start time known).
- One name: a job config's `study` names the study (hydra.sweeper.study_name
  is `${study}`); a sweeper name of its own is refused, as the trial jobs
  would write their records, recipes and logs under the other.
- Trial numbers: each job gets `++trial_number=<n>`, so the job can write its
  own record (study_file.write_trial_info) and the snapshot joins it.
- The storage URL stays with the sweeper: a `storage=` or
  `hydra.sweeper.storage=` on the command line is not passed on to the jobs
  (their overrides, job files, FAILED.json) nor set as the trials' user
  attrs, where its password would show.
- Snapshot: study.json (evaluate/search/study_file.py) after each batch and at
  the end: every trial's number, state, params and values, joined with its
  job's record, the storage URL without its password, and the machines the
  jobs ran on (each job records its own: a launcher may run it elsewhere).
- Progress: one line per finished batch, "trial k/N done (state), elapsed, ETA".
- Trial user attrs: `artifact_id`, `recipe` and `artifact_dir` from the
  job's record (an MLflow run of the artifact carries the tag artifact_id),
  `error` for a failed job. The study's metric names are the objectives'
  (what optuna-dashboard labels the values with).
- Failures: a failed job fails its trial and the search goes on (the preset's
  max_failure_rate: 1.0); the trial's error line goes into study.json.
- Storage: by default sqlite:///<results_dir>/search/<study>/study.db; any
  Optuna RDB URL (MariaDB: mysql+pymysql://...). It is opened before any trial
  starts; one that cannot be reached stops the search with one line, exit 2.

Hydra instantiates sweepers only from its `hydra_plugins` namespace:
conf/hydra/sweeper/quantbench_optuna.yaml names
hydra_plugins.quantbench_sweepers.sweeper.QuantbenchSweeper, which builds this
class (the preset's `impl`)."""
import json
import logging
import os
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

import optuna
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl
from omegaconf import DictConfig, OmegaConf, read_write
from optuna.trial import FrozenTrial, Trial, TrialState

from evaluate import results
from evaluate.search import storage as storages
from evaluate.search import study_file
from quantize.common import fingerprint, hub
from quantize.common.checkpoint import weight_files
from quantize.common.credentials import redact_override
from quantize.common.errors import UserError
from quantize.common.extensions import plain
from quantize.common.jobs import FAILURE_FILE, one_line
from quantize.common.progress import duration

log = logging.getLogger(__name__)

TRIAL_KEY = "trial_number"     # the job's override: ++trial_number=<n>
OWNER_ATTR = "sweeper"         # study user attr: the sweeper running the study now
INTERRUPTED_ATTR = "interrupted"
KILLED_ATTR = "killed"
RECOVERED_ATTR = "recovered"
RETRY_ATTR = "retry_of"
ERROR_ATTR = "error"
OBJECTIVES_ATTR = "objectives"  # study user attr: [name, direction, scenario] of each objective
IDENTITY_ATTR = "identity"      # study user attr: what the trials measured besides their params (_identity)
# The job config's keys that change what a trial measures but not its params
# or the study's default name; a plain Hydra app may lack any of them.
IDENTITY_KEYS = ("model.path", "seed", "quantize_overrides", "evaluate_overrides")
OVERRIDE_KEYS = ("quantize_overrides", "evaluate_overrides")   # identity: kept with a URL's password as ***
WEIGHTS_KEY = "model weights"   # identity: the fingerprint of model.path's weights, where the sweeper sees them
REVISION_KEY = "model revision"  # identity: the snapshot a hub id's weights are in (shown; the weights decide)
BUILT_ATTRS = ("artifact_id", "recipe", "artifact_dir")   # trial user attrs from the job's record
HEARTBEAT_S = 30
STALE_S = 4 * HEARTBEAT_S      # a sweeper counts as gone after this long silent
RECORD_CLOCK_SLACK_S = 60
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
SWEEPER_ONLY = ("storage", "hydra.sweeper.storage")   # command-line keys no trial job reads
PINNED_KEYS = ("model.revision", "model.name")   # a hub id's trials get the study's (_pinned)
# How a job's error begins when it was ended from outside, not by its trial's
# config: the words quantbench's submitit launchers (hydra_plugins.quantbench_launchers:
# slurm.ENDED_BY_SLURM, local) and quantize.common.jobs.TIME_LIMIT open with.
# Slurm's "out of memory" and a non-zero exit are the trial's own.
ENDED_FROM_OUTSIDE = ("time limit", "cancelled", "preempted", "node failure", "deadline", "killed")


@dataclass(frozen=True)
class SearchSettings:
    """What the snapshot takes from the job config (conf/search.yaml); each key
    may be missing (a plain Hydra app), with the default shown."""
    results_dir: Path                               # results_dir: results
    space: str                                      # search.name: ""
    engine: str                                     # engine.name: ""
    model: str                                      # model.name: ""
    objectives: list[study_file.Objective] | None   # search.objectives: one per direction, unnamed
    study: Any                                      # study: None (the study's one name, checked where used)
    identity_values: dict                           # IDENTITY_KEYS: None (_identity, once the cheap checks passed)
    revision: str | None = None                     # model.revision: None (a hub id's main)

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> "SearchSettings":
        def get(key: str, default: Any) -> Any:
            value = OmegaConf.select(cfg, key, default=default)
            return plain(value) if isinstance(value, DictConfig) else value
        objectives = OmegaConf.select(cfg, "search.objectives", default=None)
        return cls(
            results_dir=Path(get("results_dir", "results")),
            space=str(get("search.name", "") or ""),
            engine=str(get("engine.name", "") or ""),
            model=str(get("model.name", "") or ""),
            objectives=None if objectives is None else [_objective(plain(o)) for o in objectives],
            study=get("study", None),
            identity_values={key: get(key, None) for key in IDENTITY_KEYS},
            revision=hub.check_revision(str(get("model.path", "")), get("model.revision", None)),
        )


def _identity(values: dict, revision: str | None = None) -> dict:
    """The IDENTITY_KEYS the config has; weights this host sees also by their
    fingerprint (WEIGHTS_KEY), so a checkpoint moved to another folder still
    resumes (_check_identity), and a hub id's by those of the snapshot it
    resolves to at `revision` (None: main) and its commit (REVISION_KEY), so a
    resume after the hub repo changed is not taken for the same model."""
    out = _redacted({k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                     for k, v in values.items() if v is not None})
    path = str(out.get("model.path", ""))
    snapshot = _snapshot(path, revision) if path and hub.is_repo_id(path) else None
    weights = _snapshot_weights(snapshot) if snapshot else weight_files(Path(path)) if path else []
    if weights:
        out[WEIGHTS_KEY] = fingerprint.compute(weights).sha256
        if snapshot:
            out[REVISION_KEY] = snapshot.name
    return out


def _pinned(identity: dict, model_name: str) -> tuple[str, ...]:
    """Each trial's overrides that keep a hub id at the commit the study
    resolved at start (REVISION_KEY), so a repo changed mid-study cannot
    mix two models' trials; its name stays the study's (a revision would
    otherwise name its artifacts' folder: hub.folder_name)."""
    commit = identity.get(REVISION_KEY)
    if not commit:
        return ()
    return (f"++model.revision={commit}", *([f"++model.name={model_name}"] if model_name else []))


def _redacted(identity: dict) -> dict:
    """The identity as the study stores and shows it: a password in an
    override as *** (optuna-dashboard shows user attrs), and one that
    changed does not count as another search."""
    return {k: [redact_override(str(a)) for a in v] if k in OVERRIDE_KEYS and isinstance(v, list) else v
            for k, v in identity.items()}


def _snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The snapshot the trials' quantize takes (_pinned): a revision given, its
    own (downloaded now, or one line where it cannot be). Else where the hub
    is reachable and its main branch is not the one this host's cache holds,
    main's, downloaded now (a stale cache told of weights the trials never
    saw); else the cached one (an offline download reads it); None where neither."""
    if revision is not None:
        return hub.download(repo_id, revision)
    cached, main = hub.cached_snapshot(repo_id), hub.main_commit(repo_id)
    if main and (cached is None or cached.name != main):
        log.info("model %s: downloading the hub's main (%s) the trials will quantize", repo_id, main[:12])
        return hub.download(repo_id)
    return cached


def _snapshot_weights(snapshot: Path) -> list[Path]:
    try:
        return weight_files(snapshot)
    except UserError:  # a download cut short: the trial's quantize fetches the rest
        return []


def _objective(entry: dict) -> study_file.Objective:
    known = {f.name for f in fields(study_file.Objective)}
    try:
        return study_file.Objective(**{k: v for k, v in entry.items() if k in known})
    except TypeError:
        raise UserError(f"search.objectives entry {entry} lacks a name or direction; write it as "
                        "{name: <metric>, direction: maximize|minimize, unit: <unit>}") from None


class QuantbenchOptunaSweeper(OptunaSweeperImpl):
    """The plugin's sweeper; see the module's docstring for what it adds."""

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.launcher = _RecordingLauncher(self.launcher, self._record_job_returns)
        self.target = self.n_trials
        self.batch: list[Trial] = []
        self.progress: _Progress | None = None
        self.pinned: tuple[str, ...] = ()

    def sweep(self, arguments: list[str]) -> None:
        try:
            self._sweep(arguments)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(e.exit_code) from None

    def _sweep(self, arguments: list[str]) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # its "created"/"using existing" lines: ours say more
        self.settings = SearchSettings.from_cfg(self.config)
        fallback = self.settings.space or self.config.hydra.job.name
        self.study_name = _study_name(self.settings.study, self.study_name, fallback)
        directions = self._get_directions()
        self.objectives = _objectives(self.settings.objectives, directions)   # refused before a storage is made
        self.url = self.storage or storages.default_url(self.settings.results_dir, self.study_name)
        self.storage = storages.open_storage(self.url)
        self._keep_storage_from_jobs()
        study = _load_study(self.study_name, self.storage, directions, self.url)
        _check_objectives(study, self.objectives, self.url)
        _check_distributions(study, self._distributions(arguments), self.url)
        with _Ownership(study, self.url):
            # last: a hub id's weights may be downloaded for it, after every refusal that needs none
            identity = _identity(self.settings.identity_values, self.settings.revision)
            _check_identity(study, identity, self.url)
            self.pinned = _pinned(identity, self.settings.model)
            _name_values(study, self.objectives)
            settled = _settle_interrupted(study, self.settings.results_dir, len(directions))
            done = len(_finished(study))
            self.n_trials = max(0, self.target - done)
            self.job_idx = _next_trial_number(study)  # job folders follow trial numbers across reruns
            if study.trials and hasattr(self.sampler, "reseed_rng"):
                self.sampler.reseed_rng()  # a seeded sampler would repeat the first run's points
            _log_start(study, self.url, self.target, done, settled, self.n_trials)
            self.progress = _Progress(self.target, done)
            # the plugin saves its summary there, and a finished study launches no job that would make it
            Path(self.config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)
            try:
                super().sweep(arguments)
            except ValueError:
                if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                    # the plugin's closing summary needs a completed trial
                    raise UserError(f"none of study {self.study_name}'s trials completed; each one's error "
                                    f"is in {study_file.path_for(self.settings.results_dir, self.study_name)}")
                raise
            finally:
                self._batch_told(study)

    def _distributions(self, arguments: list[str]) -> dict:
        """The search space this sweep will ask for, as the plugin builds it."""
        from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
        with warnings.catch_warnings():  # the plugin's pre-3.0 distributions: it warns when it builds them itself
            warnings.simplefilter("ignore", FutureWarning)
            distributions, fixed = create_params_from_overrides([*self._parse_sweeper_params_config(), *arguments])
        return {name: d for name, d in distributions.items() if name not in fixed}   # as the plugin drops them

    def _configure_trials(self, trials: list[Trial], search_space_distributions: dict,
                          fixed_params: dict) -> Sequence[Sequence[str]]:
        study = trials[0].study
        self._batch_told(study)
        # the storage URL (password and all) would become each trial's user attr and job override
        fixed_params = {k: v for k, v in fixed_params.items()
                        if k.lstrip("+~") not in SWEEPER_ONLY + (PINNED_KEYS if self.pinned else ())}
        overrides = super()._configure_trials(trials, search_space_distributions, fixed_params)
        self.batch = list(trials)
        self._snapshot(study)  # the new batch shows as RUNNING, with its parameters
        return [(*job, *self.pinned, f"++{TRIAL_KEY}={trial.number}") for job, trial in zip(overrides, trials)]

    def _batch_told(self, study: optuna.Study) -> None:
        """After the plugin told the batch's results to the study: progress and snapshot."""
        numbers = {t.number for t in self.batch}
        states = [t.state for t in study.get_trials(deepcopy=False) if t.number in numbers]
        if states and self.progress and all(state.is_finished() for state in states):  # not when stopped mid-batch
            log.info(self.progress.line(len(_finished(study, killed=True)), [state.name for state in states],
                                        sorted(numbers)))
        self.batch = []
        self._snapshot(study)

    def _record_job_returns(self, returns: Sequence[JobReturn]) -> None:
        """On each trial, before the plugin tells the study: a failed job's one
        line, and what the job built (artifact id, recipe), by which the trial
        is found in the results store and in a tracker (tag artifact_id)."""
        for trial, ret in zip(self.batch, returns):
            error = job_error(ret, len(self.objectives))
            if error:
                trial.set_user_attr(ERROR_ATTR, error)
                if error.startswith(ENDED_FROM_OUTSIDE):   # run again first on the next run (_settle_killed)
                    trial.set_user_attr(KILLED_ATTR, error)
            built = study_file.read_trial_info(self.settings.results_dir, self.study_name, trial.number)
            for key in BUILT_ATTRS:
                if built.get(key):
                    trial.set_user_attr(key, built[key])

    def _snapshot(self, study: optuna.Study) -> Path:
        record = snapshot(study, self.settings, self.objectives, self.url, self.target)
        return study_file.write(self.settings.results_dir, record)

    def _keep_storage_from_jobs(self) -> None:
        """Drop a hydra.sweeper.storage= override from what the launcher composes
        each job with: Hydra would save it, password and all, in every job's
        .hydra/hydra.yaml, and no job opens the study."""
        overrides = self.config.hydra.overrides
        with read_write(overrides):
            overrides.hydra = [o for o in overrides.hydra
                               if str(o).partition("=")[0].lstrip("+~") not in SWEEPER_ONLY]


class _RecordingLauncher:
    """The configured launcher, with the jobs' returns seen before the plugin reads them."""

    def __init__(self, launcher, on_returns) -> None:
        self.launcher = launcher
        self.on_returns = on_returns

    def launch(self, job_overrides, initial_job_idx: int) -> Sequence[JobReturn]:
        returns = self.launcher.launch(job_overrides, initial_job_idx=initial_job_idx)
        self.on_returns(returns)
        return returns


def job_error(ret: JobReturn, n_objectives: int) -> str | None:
    """Why a job gave its trial no values, in one line; None when it did."""
    if ret.status != JobStatus.COMPLETED:
        return one_line(ret._return_value) if isinstance(ret._return_value, BaseException) else "the job failed"
    value = ret._return_value
    if value is None:  # quantize.common.jobs.run_job in a multirun: the error is in the job's FAILED.json
        return _failure_file_error(ret) or "the job returned nothing"
    values = value if isinstance(value, (list, tuple)) or OmegaConf.is_list(value) else [value]
    try:
        [float(v) for v in values]
    except (TypeError, ValueError):
        return f"the job returned {value!r}, not {n_objectives} number(s)"
    if len(values) != n_objectives:
        return f"the job returned {len(values)} value(s) for {n_objectives} objective(s)"
    return None


def _failure_file_error(ret: JobReturn) -> str | None:
    try:
        # a job the launcher recorded (it ended without a result) brings no config back, only its folder
        folder = Path(ret.working_dir if ret.hydra_cfg is None else ret.hydra_cfg.hydra.runtime.output_dir)
        return json.loads((folder / FAILURE_FILE).read_text())["error"]
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        return None


def snapshot(study: optuna.Study, settings: SearchSettings, objectives: list[study_file.Objective],
             url: str, target: int) -> study_file.SearchRecord:
    """The study as study.json holds it: every trial joined with its job's
    record, and the machines the jobs ran on (a launcher may run them on
    other hosts than the sweeper's)."""
    trials = study.get_trials(deepcopy=False)
    jobs = {t.number: _job_record(settings.results_dir, study.study_name, t) for t in trials}
    machines = {results.machine_id(job["hardware"]): results.machine_of(job["hardware"])
                for job in jobs.values() if job.get("hardware")}
    return study_file.SearchRecord(
        study=study.study_name, storage=storages.redact(url), objectives=objectives,
        engine=settings.engine, model=settings.model, space=settings.space, n_trials=target,
        trials=[_trial_record(t, jobs[t.number]) for t in trials],
        hardware=machines, versions=_versions(), wall_s=_study_wall_s(trials),
        updated=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _trial_record(trial: FrozenTrial, job: dict) -> study_file.Trial:
    info = dict(job)
    info.pop("values", None)  # the study's own values are the ones told
    hardware = info.pop("hardware", None)
    error = info.pop("error", None) or trial.user_attrs.get(ERROR_ATTR)
    if trial.user_attrs.get(INTERRUPTED_ATTR):
        error = error or trial.user_attrs[INTERRUPTED_ATTR]
    wall_s = info.pop("wall_s", None)
    if wall_s is None and trial.duration is not None:
        wall_s = round(trial.duration.total_seconds(), 1)
    return study_file.Trial(number=trial.number, state=trial.state.name, params=dict(trial.params),
                            values=list(trial.values) if trial.values is not None else None,
                            error=error, wall_s=wall_s, machine=results.machine_id(hardware) if hardware else None,
                            **info)


def _job_record(results_dir: Path, study: str, trial: FrozenTrial) -> dict:
    """The trial's job record, if this trial's job wrote it: one older than the
    trial (a deleted study's, recreated under the same name) is not its own.
    The slack allows for clocks of other hosts sharing the folder."""
    path = study_file.trial_info_path(results_dir, study, trial.number)
    try:
        written = path.stat().st_mtime
    except OSError:
        return {}
    if trial.datetime_start and written < trial.datetime_start.timestamp() - RECORD_CLOCK_SLACK_S:
        return {}
    return study_file.read_trial_info(results_dir, study, trial.number)


def _study_wall_s(trials: list[FrozenTrial]) -> float | None:
    """Seconds during which at least one trial ran: the union of the trials'
    start-to-end intervals (parallel trials count once; the time between two
    runs of a resumed study does not count). A trial a stopped sweeper
    interrupted is left out: its end is when the rerun settled it."""
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials
                   if t.datetime_start and t.datetime_complete and not t.user_attrs.get(INTERRUPTED_ATTR))
    if not spans:
        return None
    total, (start, end) = 0.0, spans[0]
    for next_start, next_end in spans[1:]:
        if next_start > end:
            total += (end - start).total_seconds()
            start, end = next_start, next_end
        else:
            end = max(end, next_end)
    return round(total + (end - start).total_seconds(), 1)


def _versions() -> dict:
    out = {}
    for dist in ("optuna", "hydra-optuna-sweeper", "hydra-core"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _study_name(study: Any, configured: str | None, fallback: str) -> str:
    """The study's one name: the job config's `study` where it has one, the
    name each trial job writes its record, recipes and logs under; a sweeper
    name of its own would split the study from its trials' records."""
    if study is None:   # a plain Hydra app
        return configured or fallback
    if configured and str(configured) != str(study):
        raise UserError(f"hydra.sweeper.study_name={configured} differs from study={study}, the name the trials "
                        f"record under; pass study={configured} instead")
    return study_file.study_name(study)


def _objectives(configured: list[study_file.Objective] | None,
                directions: list[str]) -> list[study_file.Objective]:
    """search.objectives, checked against the sweeper's directions; unnamed ones without it."""
    if configured is None:
        return [study_file.Objective(name=f"value_{i}", direction=d, unit="") for i, d in enumerate(directions)]
    asked = [o.direction for o in configured]
    if asked != directions:
        raise UserError(f"search.objectives ({', '.join(f'{o.name}: {o.direction}' for o in configured)}) do not "
                        f"match hydra.sweeper.direction {directions}; set hydra.sweeper.direction to {asked}")
    return configured


def _load_study(name: str, storage, directions: list[str], url: str) -> optuna.Study:
    """The study, new or stored; a stored one must optimize the same directions
    (Optuna would load it as it is, and the values would be judged the wrong way)."""
    study = optuna.create_study(study_name=name, storage=storage, directions=directions, load_if_exists=True)
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        raise UserError(f"study {name} in {storages.redact(url)} optimizes {stored}, this search {directions}; "
                        "use study=<new name> for the new objectives, or the old ones to resume it")
    return study


def _check_objectives(study: optuna.Study, objectives: list[study_file.Objective], url: str) -> None:
    """A stored study must measure the same objectives (name, direction,
    scenario): its values would be mixed with, and labelled as, the new ones.
    A new study (or one from before this check) records them."""
    asked = [[o.name, o.direction, o.scenario] for o in objectives]
    stored = study.user_attrs.get(OBJECTIVES_ATTR)
    if stored is None:
        study.set_user_attr(OBJECTIVES_ATTR, asked)
    elif stored != asked:
        def shown(entries) -> str:
            return ", ".join(f"{n} ({d}{f' at {s}' if s else ''})" for n, d, s in entries)
        raise UserError(f"study {study.study_name} in {storages.redact(url)} measured {shown(stored)}, this search "
                        f"{shown(asked)}; use study=<new name> for the new objectives, "
                        "or the old ones to resume it")


def _check_identity(study: optuna.Study, identity: dict, url: str) -> None:
    """A stored study must have measured the same weights with the same seed
    and stage overrides: its trials would count as this search's, and their
    front be reported as its answer. A new study (or one from before this
    check) records them; a record that knew the weights by their path only
    takes their fingerprint once this host sees them. A record from before
    passwords were redacted is compared, and rewritten, redacted."""
    recorded = study.user_attrs.get(IDENTITY_ATTR)
    if recorded is None:
        study.set_user_attr(IDENTITY_ATTR, identity)
        return
    stored = _redacted(recorded)
    others = (set(stored) | set(identity)) - {"model.path", WEIGHTS_KEY, REVISION_KEY}
    differ = _model_differs(stored, identity) + [k for k in sorted(others) if stored.get(k) != identity.get(k)]
    if differ:
        was = ", ".join(f"{k}={_shown(k, stored.get(k))} (now {_shown(k, identity.get(k))})" for k in differ)
        raise UserError(f"study {study.study_name} in {storages.redact(url)} was searched with {was}; "
                        "use study=<new name> for this search, or the same settings to resume it")
    if {**stored, **identity} != recorded:  # its weights now seen, or moved, or a password shown: the record follows
        study.set_user_attr(IDENTITY_ATTR, {**stored, **identity})


def _model_differs(stored: dict, identity: dict) -> list[str]:
    """The model's identity keys that differ: the weights' fingerprints where
    both sides saw the weights (a moved folder is the same model), else the
    paths (weights made by the first trial, or seen from one host only)."""
    keys = (WEIGHTS_KEY, "model.path")
    both = [k for k in keys if k in stored and k in identity]
    if not both:  # a model on one side only
        return ["model.path"] if any(k in stored for k in keys) != any(k in identity for k in keys) else []
    if stored[both[0]] == identity[both[0]]:
        return []
    revised = both[0] == WEIGHTS_KEY and stored.get(REVISION_KEY) != identity.get(REVISION_KEY)
    return [both[0], REVISION_KEY] if revised else [both[0]]   # a hub id: the snapshot says why


def _shown(key: str, value: Any) -> str:
    hashed = key in (WEIGHTS_KEY, REVISION_KEY) and value is not None
    return str(value)[:12] if hashed else str(value)  # a sha256 or commit: its start


def _check_distributions(study: optuna.Study, distributions: dict, url: str) -> None:
    """A stored study's params must keep their choices: Optuna raises
    mid-sweep on a categorical param's new choices, leaving its trial RUNNING."""
    with warnings.catch_warnings():  # the stored pre-3.0 distributions warn as they are read
        warnings.simplefilter("ignore", FutureWarning)
        trials = study.get_trials(deepcopy=False)
    for trial in trials:
        for name, stored in trial.distributions.items():
            if name not in distributions:
                continue
            try:
                optuna.distributions.check_distribution_compatibility(stored, distributions[name])
            except ValueError:
                raise UserError(f"study {study.study_name} in {storages.redact(url)} was searched with {name} in "
                                f"{_values(stored)}; use study=<new name> or the same "
                                "choices") from None


def _values(distribution) -> str:
    choices = getattr(distribution, "choices", None)
    return f"[{', '.join(map(str, choices))}]" if choices is not None else f"[{distribution.low}, {distribution.high}]"


def _name_values(study: optuna.Study, objectives: list[study_file.Objective]) -> None:
    """The study's metric names: the objectives', as optuna-dashboard labels the values."""
    with warnings.catch_warnings():  # experimental since Optuna 3.2, still in 5.0
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([o.name for o in objectives])


def _finished(study: optuna.Study, killed: bool = False) -> list[FrozenTrial]:
    """The trials that count towards n_trials (an interrupted one, or one
    killed, is run again instead); `killed`: count those killed in this run
    too (its own progress: only the next run queues them again)."""
    trials = study.get_trials(deepcopy=False)
    queued = {t.user_attrs.get(RETRY_ATTR) for t in trials}
    return [t for t in trials if t.state in FINISHED and not t.user_attrs.get(INTERRUPTED_ATTR)
            and (not _killed_and_retried(t, trials) or (killed and t.number not in queued))]


def _killed_and_retried(trial: FrozenTrial, trials: list[FrozenTrial]) -> bool:
    """Whether a trial was ended from outside and is run again (once: not
    when the trial it retried was ended so too)."""
    if trial.state != TrialState.FAIL or not trial.user_attrs.get(KILLED_ATTR):
        return False
    retried = trial.user_attrs.get(RETRY_ATTR)
    return retried is None or not any(t.number == retried and t.user_attrs.get(KILLED_ATTR) for t in trials)


@dataclass(frozen=True)
class Settled:
    """What became of the trials a dead sweeper left RUNNING, and of those ended from outside."""
    recovered: list[int]    # their jobs had finished: values taken from the jobs' records
    requeued: list[int]     # FAIL (interrupted); their parameters run again first
    killed: list[int]       # FAIL, their jobs ended from outside (KILLED_ATTR); their parameters run again first


def _settle_interrupted(study: optuna.Study, results_dir: Path, n_objectives: int) -> Settled:
    """The trials a dead sweeper left RUNNING: a job that finished (its record
    holds its values) completes its trial; the others are marked FAIL
    (interrupted) and their parameters queued to run first. Only while this
    sweeper owns the study."""
    storage = study._storage  # the study's own storage object: Optuna has no public way to fail another run's trial
    study_id = storage.get_study_id_from_name(study.study_name)
    recovered, requeued = [], []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        values = _finished_values(_job_record(results_dir, study.study_name, trial), n_objectives)
        if values is not None:
            storage.set_trial_user_attr(trial_id, RECOVERED_ATTR,
                                        "values from the job's record after the sweeper stopped")
            study.tell(trial.number, values=values)
            recovered.append(trial.number)
            continue
        storage.set_trial_user_attr(trial_id, INTERRUPTED_ATTR,
                                    "interrupted: the sweeper stopped while this trial ran; run again")
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
        if trial.params:  # asked but never configured: nothing to repeat
            study.enqueue_trial(trial.params, user_attrs={RETRY_ATTR: trial.number})
        requeued.append(trial.number)
    return Settled(recovered, requeued, _settle_killed(study))


def _settle_killed(study: optuna.Study) -> list[int]:
    """Queue the parameters of each trial ended from outside (the launcher's
    time limit, scancel, a kill) that runs again and is not queued yet: its
    job may have been cut short by no fault of its config, and a rerun costs
    only what its stages lack."""
    trials = study.get_trials(deepcopy=False)
    queued = {t.user_attrs.get(RETRY_ATTR) for t in trials}
    killed = [t for t in trials if _killed_and_retried(t, trials) and t.number not in queued]
    for trial in killed:
        study.enqueue_trial(trial.params, user_attrs={RETRY_ATTR: trial.number})
    return [t.number for t in killed]


def _finished_values(info: dict, n_objectives: int) -> list[float] | None:
    """A finished job's values from its record; None if it did not finish or failed."""
    values = info.get("values")
    if info.get("error") or not isinstance(values, list) or len(values) != n_objectives:
        return None
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        return None


def _next_trial_number(study: optuna.Study) -> int:
    """The number study.ask() gives next: the oldest queued trial's, else a new one's."""
    trials = study.get_trials(deepcopy=False)
    waiting = [t.number for t in trials if t.state == TrialState.WAITING]
    return min(waiting) if waiting else len(trials)


def _log_start(study: optuna.Study, url: str, target: int, done: int, settled: Settled, to_run: int) -> None:
    where = f"study {study.study_name} in {storages.redact(url)}"
    if not study.trials:
        log.info("%s: new, %d trial(s) to run", where, target)
        return
    notes = ""
    if settled.recovered:
        notes += f"; trial(s) {_numbers(settled.recovered)} had finished: values from their jobs' records"
    if settled.requeued:
        notes += f"; interrupted trial(s) {_numbers(settled.requeued)} run again first"
    if settled.killed:
        notes += (f"; trial(s) {_numbers(settled.killed)}, ended from outside (time limit, cancelled, killed), "
                  "run again first")
    log.info("%s: resumed with %d of %d trial(s) finished, %d to run%s", where, done, target, to_run, notes)


def _numbers(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers))


class _Progress:
    """'trial k/N done (state), elapsed, ETA' from this run's pace."""

    def __init__(self, target: int, done_before: int) -> None:
        self.target = target
        self.done_before = done_before
        self.start = time.monotonic()

    def line(self, done: int, states: list[str], numbers: list[int]) -> str:
        elapsed = time.monotonic() - self.start
        ran = done - self.done_before
        left = max(0, self.target - done)
        eta = duration(elapsed / ran * left) if ran > 0 else "unknown"
        first = done - len(states) + 1
        which = f"trial {done}/{self.target}" if first == done else f"trials {first}-{done}/{self.target}"
        shown = ", ".join(f"#{n} {s}" for n, s in zip(numbers, states))
        return f"{which} done ({shown}), elapsed {duration(elapsed)}, ETA {eta if left else '0 s'}"


class _Ownership:
    """The study's `sweeper` user attr names the one sweeper running it; a
    heartbeat thread keeps it fresh for sweepers on other hosts to see."""

    def __init__(self, study: optuna.Study, url: str) -> None:
        self.study = study
        self.url = url
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": _start_time(os.getpid())}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="study-heartbeat", daemon=True)

    def __enter__(self) -> "_Ownership":
        other = self.study.user_attrs.get(OWNER_ATTR)
        if other and _alive(other) and not self._is_me(other):
            since = other.get("started", "?")
            raise UserError(f"study {self.study.study_name} in {storages.redact(self.url)} is being run by "
                            f"pid {other.get('pid')} on {other.get('host')} (since {since}); one sweeper per "
                            "study: wait for it, stop it, or use study=<new name>")
        self.me["started"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._claim()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        try:
            self.study.set_user_attr(OWNER_ATTR, None)
        except Exception as e:  # the storage went away: the next sweeper sees this pid gone
            log.warning("could not release study %s: %s", self.study.study_name, one_line(e))

    def _is_me(self, owner: dict) -> bool:
        return owner.get("host") == self.me["host"] and owner.get("pid") == self.me["pid"]

    def _claim(self) -> None:
        self.study.set_user_attr(OWNER_ATTR, {**self.me, "heartbeat": time.time()})

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            try:
                self._claim()
            except Exception as e:  # a passing storage error; the next beat retries
                log.debug("study heartbeat failed: %s", one_line(e))


def _alive(owner: dict) -> bool:
    """Whether the sweeper named in the study's `sweeper` attr still runs. On
    this host: its pid lives with the start time it recorded, however long
    its heartbeat is silent (a sweeper stopped with Ctrl-Z still owns the
    study); a pid with another start time (reused, or another pid namespace
    under this hostname) counts only while its heartbeat is fresh. Elsewhere,
    or with no start time (not Linux, an older record): its heartbeat is fresh
    and, on this host, its pid lives."""
    fresh = time.time() - float(owner.get("heartbeat") or 0) < STALE_S
    if owner.get("host") != socket.gethostname():
        return fresh
    try:
        pid = int(owner["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    recorded, now = owner.get("pid_start"), _start_time(pid)
    if recorded is not None and now is not None:
        # another start time: a reused pid, or a sweeper in another pid
        # namespace under this hostname (a container), whose beat says it runs
        return now == recorded or fresh
    return fresh and _pid_lives(pid)


def _start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot: /proc/<pid>/stat
    field 22); None without /proc, or for a process gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, *rest = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return None if state in ("Z", "X") else int(rest[18])  # fields 3 and 22


def _pid_lives(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
