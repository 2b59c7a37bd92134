"""One trial of the search: the trial's recipe -> `python -m quantize` ->
`python -m evaluate` -> its objective values, in the study's order.

Both stages run as subprocesses (evaluate never imports quantize's stages):
a complete artifact is skipped by quantize itself, completed rows by
evaluate, so a rerun trial costs what is missing. The speed is measured only
for a kernel path this host has not measured (evaluate.search.speed);
otherwise evaluate runs with scenario=none and the trial reuses the earlier
artifact's runs. The trial's record (study_file.write_trial_info) says which.
A stage whose very command already ran for this point (an earlier trial that
drew the same recipe) is not started again: its outputs are complete."""
import hashlib
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from evaluate import hardware, results, scenarios, store_lock
from evaluate.search import kept_dense, speed, study_file
from evaluate.search.config import ACCURACY_METRICS, SIZE_METRICS, SearchConfig
from quantize.common import atomic, hub, manifest
from quantize.common.config import expand_path_shorthands
from quantize.common.credentials import redact_override
from quantize.common.errors import UserError
from quantize.common.jobs import one_line
from quantize.common.paths import PROJECT_ROOT

log = logging.getLogger("quantbench.search")
MB = 1e6
SCENARIO_KEYS = ("scenario", "scenario.path")   # accuracy rows do not depend on them
MODEL_KEYS = ("model", "model.path", "model.name")   # a kernel path's speed is shared across its artifacts


@dataclass(frozen=True)
class Built:
    recipe: str
    recipe_path: Path
    artifact_dir: Path
    manifest: manifest.Manifest


def run(config: SearchConfig, number: int) -> list[float]:
    """The trial's objective values; raises (and records the one-line reason) when a stage fails."""
    start = time.monotonic()
    info: dict = {}
    try:
        values = _measure(config, number, info)
    except Exception as e:
        info.update(error=one_line(e), wall_s=round(time.monotonic() - start, 1))
        study_file.write_trial_info(config.results_dir, config.study, number, info)
        raise
    # the values too: a sweeper killed before it told the study takes them from here on resume
    info.update(values=values, wall_s=round(time.monotonic() - start, 1))
    study_file.write_trial_info(config.results_dir, config.study, number, info)
    log.info("trial %d: %s (%s)", number, dict(zip([o.name for o in config.objectives], values)), info["speed"])
    return values


def _measure(config: SearchConfig, number: int, info: dict) -> list[float]:
    host = speed.Host.here()
    info["hardware"] = host.hardware   # study.json names the machines its speed numbers came from
    built = build(config, number, info)
    scenario = speed_scenario(config)
    info["repro"] = " && ".join(
        shlex.join(["python", *c[1:]]) for c in (quantize_command(config, built.recipe_path, built.artifact_dir),
                                                evaluate_command(config, built.artifact_dir, True)))
    reused = _measure_speed(config, number, built, scenario, host) if scenario else None
    accuracy_only = evaluate_command(config, built.artifact_dir, measure_speed=False)
    if (reused or not scenario) and not _accuracy_stored(config, built, host):
        _run_stage("evaluate", accuracy_only, config, number)
    info["speed"] = f"reused from {reused}" if reused else ("measured" if scenario else "not measured")
    rows = results.read(config.results_dir)
    speed_source = reused or built.manifest.artifact_id
    return [objective_value(o.name, rows, config, built, speed_source, scenario, host) for o in config.objectives]


def _measure_speed(config: SearchConfig, number: int, built: Built, scenario: str, host: speed.Host) -> str | None:
    """Evaluate with the speed scenario unless this host measured the kernel
    path before; returns the artifact id measured before, None when this
    trial measured. Trials running side by side (a parallel launcher) take
    one kernel path's lock in turn, so the second reuses the first's runs."""
    fields = built.manifest.row_fields()
    key = ("search speed", config.engine, scenario, repr(speed.kernel_path(fields)))
    with store_lock.measurement(config.results_dir, key, f"the speed of {built.recipe}'s kernel path"):
        reused = speed.measured_before(results.read(config.results_dir), fields, config.engine, scenario, host,
                                       same_speed_setup(config, built.artifact_dir, host),
                                       speed.run_plan(config.evaluate_overrides))
        if not reused:
            _run_stage("evaluate", evaluate_command(config, built.artifact_dir, measure_speed=True), config, number)
    return reused


def build(config: SearchConfig, number: int, info: dict) -> Built:
    """The trial's recipe file and its artifact (quantize skips a complete one)."""
    values = config.trial
    kept = kept_dense.kept(config.results_dir, config.model_name, config.model_path, values.scheme,
                           values.keep_dense, config.sensitivity)
    name, text = config.space.recipe(values, kept, kept_dense.linear_widths(config.model_path))
    recipe_path = (config.results_dir / "search" / config.study / "recipes" / f"{name}.yaml").resolve()
    info.update(recipe=name, recipe_path=str(recipe_path))
    if not recipe_path.is_file() or recipe_path.read_text() != text:
        atomic.write_text(recipe_path, text)
    artifact_dir = (config.artifacts_dir / config.model_name / artifact_name(config, name)).resolve()
    command = quantize_command(config, recipe_path, artifact_dir)
    built = manifest.read(artifact_dir)
    if built is None or not built_by(built, command, config.model_revision):
        check_servable(config, recipe_path)
        _run_stage("quantize", command, config, number)
        built = manifest.read(artifact_dir)
    if built is None:
        raise UserError(f"quantize finished without a manifest in {artifact_dir}; rerun the search")
    info.update(artifact_id=built.artifact_id, artifact_dir=str(artifact_dir))
    return Built(name, recipe_path, artifact_dir, built)


def built_by(built: manifest.Manifest, command: list[str], revision: str | None) -> bool:
    """The artifact is what this quantize command makes: built by it, or by
    it but for `model.revision` (artifacts from before trials were pinned to
    the study's commit) from the very commit it pins (the manifest's
    model.revision, else the commit of the snapshot it read): not quantized
    again for minutes to the same weights."""
    if ran_before(built.command, "quantize", command):
        return True
    if revision is None or not ran_before(built.command, "quantize", command, ignore=("model.revision",)):
        return False
    return (built.model.revision or hub.commit(Path(built.model.path))) == revision


def check_servable(config: SearchConfig, recipe_path: Path) -> None:
    """Before minutes of quantizing: a recipe whose format the engine cannot
    serve on this host (the capability table's answer, e.g. W8A16 on vLLM-CPU)
    fails its trial with the table's one line."""
    command = [sys.executable, "-m", "evaluate.capabilities", f"servable={recipe_path}", f"engine={config.engine}",
               "model=local", f"model.path={config.model_path}", f"model.name={config.model_name}",
               *config.evaluate_overrides]
    proc = subprocess.run(command, capture_output=True, env=_stage_env(), text=True)
    if proc.returncode == 0 and str(recipe_path) in proc.stdout.strip().split(","):
        return
    why = [line for line in proc.stderr.splitlines() if line.startswith((f"{recipe_path}:", "error:"))]
    raise UserError(f"not quantized: {(why or ['the capability check failed'])[-1].removeprefix(f'{recipe_path}: ')}")


def artifact_name(config: SearchConfig, recipe: str) -> str:
    """The recipe's name, plus a digest of the quantize settings when they are
    not the defaults: two studies that calibrate differently (another seed,
    quantize_overrides) build the same recipe into two artifacts, not one
    folder that refuses the second. A password in them counts as ***: a
    changed one builds the same artifact."""
    if config.seed == 0 and not config.quantize_overrides:
        return recipe
    settings = json.dumps([config.seed, [redact_override(a) for a in config.quantize_overrides]])
    return f"{recipe}-q{hashlib.sha256(settings.encode()).hexdigest()[:8]}"


def quantize_command(config: SearchConfig, recipe_path: Path, artifact_dir: Path) -> list[str]:
    return [sys.executable, "-m", "quantize", "recipe=file", f"recipe.path={recipe_path}", "model=local",
            f"model.path={config.model_path}", f"model.name={config.model_name}",
            *([f"model.revision={config.model_revision}"] if config.model_revision else []),
            f"artifact_dir={artifact_dir}", f"seed={config.seed}", *config.quantize_overrides]


def evaluate_command(config: SearchConfig, artifact_dir: Path, measure_speed: bool) -> list[str]:
    """With this machine's hardware profile named as evaluate's entry adds it
    (`hardware=cuda` on a GPU): the command is then the one its rows record,
    which is how the trial finds them (`ran_before`)."""
    args = [f"model={artifact_dir}", f"engine={config.engine}",
            f"scenario={config.scenario_arg if measure_speed else 'none'}", f"accuracy={config.accuracy}",
            f"results_dir={config.results_dir.resolve()}", *config.evaluate_overrides]
    return [sys.executable, "-m", "evaluate", *hardware.with_default(args)]


def same_speed_setup(config: SearchConfig, artifact_dir: Path, host: speed.Host) -> Callable[[results.Row], bool]:
    """Whether a row was measured by this trial's speed evaluate command but
    for its model, in the setup it runs in here: rows of other engine args or
    env (exported in the shell too), runs or evaluate settings are neither
    reused nor averaged in. A row from before rows recorded their setup as
    configured (comparison_id) is judged by its command alone."""
    command = evaluate_command(config, artifact_dir, measure_speed=True)
    setup = speed.evaluate_setup(command[3:], host)
    return lambda row: ran_before(row.repro, "evaluate", command, ignore=MODEL_KEYS) and \
        row.comparison_id in (setup, None)


def ran_before(recorded: str | None, module: str, command: list[str], ignore: tuple[str, ...] = ()) -> bool:
    """Whether a recorded command (a manifest's `command`, a row's `repro`)
    ran `python -m <module>` with this command's arguments, as its entry
    point rewrites them, but for the keys in `ignore`: that job's outputs are
    complete, and running it again would only find them so (an earlier trial
    of the same point)."""
    if not recorded or f"python -m {module} " not in recorded:
        return False

    def kept(args: list[str]) -> list[str]:
        # the entry writes `engine.args.X=v` as `++engine.args.X=v` (open_pass_through_keys),
        # and a URL's password as *** (job_command): compared so on both sides
        args = [redact_override(a.lstrip("+")) for a in args]
        return [a for a in args if a.partition("=")[0] not in ignore]
    return kept(shlex.split(recorded.rpartition(f"python -m {module} ")[2])) == \
        kept(expand_path_shorthands(command[3:]))


def _accuracy_stored(config: SearchConfig, built: Built, host: speed.Host) -> bool:
    """This host already measured the artifact's accuracy with this very evaluate command."""
    if not config.accuracy_enabled:
        return True
    return bool(accuracy_rows(results.read(config.results_dir), config, built, host))


def accuracy_rows(rows: list[results.Row], config: SearchConfig, built: Built, host: speed.Host) -> list[results.Row]:
    """The artifact's accuracy rows this host measured with this study's
    evaluate command (not another study's accuracy settings), oldest first."""
    command = evaluate_command(config, built.artifact_dir, measure_speed=False)
    found = [r for r in rows if r.kind == "accuracy" and r.ok and r.artifact_id == built.manifest.artifact_id
             and r.engine == config.engine and host.ran(r)
             and ran_before(r.repro, "evaluate", command, ignore=SCENARIO_KEYS)]
    return sorted(found, key=lambda r: r.timestamp or "")


def speed_scenario(config: SearchConfig) -> str | None:
    """The name the speed rows carry; None when no objective needs speed."""
    if not any(o.scenario for o in config.objectives):
        return None
    found = scenarios.resolve(scenarios.choose(config.scenario))
    if len(found) != 1:
        raise UserError(f"the search measures speed at one scenario; scenario={config.scenario_arg} holds "
                        f"{len(found)}: pass one (e.g. scenario=interactive)")
    # the trials measure at scenario=; an objective naming another would be labelled with a scenario not measured
    for o in config.objectives:
        if o.scenario and o.scenario != found[0].name:
            raise UserError(f"objective {o.name} is at scenario {o.scenario}, but the search measures at "
                            f"scenario={found[0].name}; pass scenario={o.scenario}, or set the objective's "
                            "scenario to \"${scenario.name}\" in conf/search/" + f"{config.space_name}.yaml")
    return found[0].name


def objective_value(name: str, rows: list[results.Row], config: SearchConfig, built: Built,
                    speed_source: str, scenario: str | None, host: speed.Host) -> float:
    if name in SIZE_METRICS:
        return (built.manifest.bytes_on_disk or {}).get("total", 0) / MB
    if name in ACCURACY_METRICS:
        accuracy = [r for r in accuracy_rows(rows, config, built, host) if name in r.metrics]
        if not accuracy:
            raise UserError(f"evaluate wrote no {name} for {built.artifact_dir} in {config.results_dir}; "
                            "see the evaluate log of this trial")
        return float(accuracy[-1].metrics[name])
    value = speed.mean_of(rows, speed_source, config.engine, scenario, name, host,
                          same_speed_setup(config, built.artifact_dir, host))
    if value is None:
        raise UserError(f"no {name} at scenario {scenario} on engine {config.engine} for artifact {speed_source} "
                        f"in {config.results_dir}; see the evaluate log of this trial")
    return value


def _run_stage(stage: str, command: list[str], config: SearchConfig, number: int) -> None:
    """Run one stage; its output goes to search/<study>/logs/<trial>-<stage>.log, a failure is one line."""
    log_path = config.results_dir / "search" / config.study / "logs" / f"{number}-{stage}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("trial %d: %s", number, shlex.join(command[1:]))
    with open(log_path, "w") as out:
        proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=_stage_env(), text=True)
    if proc.returncode:
        raise UserError(f"{stage} failed (exit {proc.returncode}): {_last_error(log_path)} (log: {log_path})")


def _stage_env() -> dict:
    """The stages import this checkout (and its Hydra launcher plugins), as the search itself does."""
    env = dict(os.environ)
    paths = [str(PROJECT_ROOT), str(PROJECT_ROOT / "quantize" / "plugins"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def _last_error(log_path: Path) -> str:
    """The stage's own one line (`error: ...`), else its last unindented line
    (a traceback's exception, Hydra's message) but Hydra's pointer to HYDRA_FULL_ERROR."""
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines()
             if line.strip() and not line[0].isspace() and "HYDRA_FULL_ERROR" not in line]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no output"])[-1]
