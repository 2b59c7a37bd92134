"""The plan of a matrix run (scripts/run_matrix.sh), printed before its stages:
the quantize jobs (artifacts to build, those complete and skipped), the
evaluate jobs (engines to start: the jobs with measurements left), and an ETA
from the job times measured on this host (quantize.common.progress).

    python -m evaluate.matrix_plan --quantize a,b --evaluate a,b,c [--servable a,b] --scenario cpu \
        --runs 3 --results-dir results --run-file results/progress/run-<id>.json [overrides]
    python -m evaluate.matrix_plan --check --quantize a,b --evaluate a,b --scenario cpu --runs 3 \
        --results-dir results [overrides]     # the overrides alone: exit 2 and one line, or 0 and nothing

The overrides are those both stages get: each job's config is composed as its
stage will compose it. What is left is read from the files the stages skip by
(manifest.json, ok result rows), matched by model, recipe and scenario whatever
the setup, so a plan may count runs a changed setup would measure anew."""
import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.errors import HydraException

from evaluate import batch, hardware, lmeval, results, scenarios
from evaluate.config import EvaluateConfig
from evaluate.results import Row
from quantize.common import manifest
from quantize.common.errors import UserError
from quantize.common.hf_load import detach_stdin
from quantize.common.paths import resolve
from quantize.common.progress import TIMES_FILE, JobTime, PlannedJob, RunFile, eta, host_kind, read_times


@dataclass(frozen=True)
class MatrixPlan:
    quantize: list[PlannedJob]
    evaluate: list[PlannedJob]
    scenario: str             # the scenario (set) asked for
    scenario_count: int       # scenarios in it
    runs: str                 # timed runs per scenario, as asked (3, auto)
    host: str                 # progress.host_kind()

    @property
    def jobs(self) -> list[PlannedJob]:
        return self.quantize + self.evaluate

    def lines(self, history: list[JobTime]) -> list[str]:
        """The plan as printed: jobs, engines to start, the ETA."""
        build = [j.recipe for j in self.quantize if j.work]
        complete = [j.recipe for j in self.quantize if not j.work]
        engines = [f"{j.recipe} {j.work}" for j in self.evaluate if j.work]
        idle = [f"{j.recipe} ({j.note})" for j in self.evaluate if not j.work]
        out = [f"plan: {_count(len(self.jobs), 'job')} ({len(self.quantize)} quantize, "
               f"{len(self.evaluate)} evaluate) on {self.host}"]
        if self.quantize:
            out.append(f"  quantize: build {_names(build)}; complete, skipped: {_names(complete)}")
        out.append(f"  evaluate on scenario {self.scenario} ({_count(self.scenario_count, 'scenario')}) x "
                   f"{self.runs} runs: {_count(len(engines), 'engine')} to start"
                   + (f" (measurements left: {', '.join(engines)})" if engines else "")
                   + (f"; nothing to measure: {', '.join(idle)}" if idle else ""))
        out.append(f"  {eta(self.jobs, self.host, history)}")
        return out


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _names(items: list) -> str:
    return ", ".join(map(str, items)) or "none"


@dataclass(frozen=True)
class Request:
    """What run_matrix.sh asks the plan about."""
    quantize: list[str]              # recipes the quantize stage builds
    evaluate: list[str]              # recipes the evaluate stage measures
    servable: list[str] | None       # the recipes evaluate's engine can serve here; None: all
    scenario: str                    # evaluate's scenario=, runs=, results_dir=
    runs: str
    results_dir: str
    overrides: list[str]             # what both stages get


def plan(request: Request) -> MatrixPlan:
    """Each job composed as its stage will compose it."""
    from hydra import compose, initialize_config_dir
    from quantize.common import config
    from quantize.common.paths import CONF_DIR
    config.register()
    both = [o for o in request.overrides if not o.lstrip("+~").startswith("hydra")]  # launchers change no job
    evaluate_only = [f"scenario={request.scenario}", f"runs={request.runs}", f"results_dir={request.results_dir}"]
    # an unknown recipe or scenario: the stages' one line naming the choices, exit status 2
    config.check_group_options([f"recipe={','.join(request.quantize + request.evaluate)}", *both, *evaluate_only])
    prepare = lambda argv: config.open_pass_through_keys(config.expand_path_shorthands(argv))  # noqa: E731
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        shared = lambda name: prepare(both + [f"recipe={name}"])  # noqa: E731
        quantize = [_compose("quantize", shared(name), shared(name)) for name in request.quantize]
        q_jobs = [_quantize_job(str(c.model.name), str(c.recipe.name), resolve(str(c.artifact_dir))) for c in quantize]
        typed = [EvaluateConfig.from_cfg(_compose("evaluate", hardware.with_default(
                 prepare(both + evaluate_only + [f"recipe={name}"])), shared(name))) for name in request.evaluate]
    stored = results.read(resolve(request.results_dir))
    built = {j.recipe for j in q_jobs}
    return MatrixPlan(quantize=q_jobs, evaluate=[_evaluate_job(c, stored, request.servable, built) for c in typed],
                      scenario=request.scenario,
                      scenario_count=len(scenarios.resolve(typed[0].scenario)) if typed else 0,
                      runs=request.runs, host=host_kind())


BOTH_STAGES = ("scripts/run_matrix.sh gives its extra arguments to both stages: set evaluate's scenario, runs and "
               "results_dir as SCENARIO=, RUNS=, RESULTS= before the command, and other settings of one stage in a "
               "run of that stage on its own (python -m {stage} -m ...)")


def _compose(stage: str, argv: list[str], shared: list[str]):
    """The stage's config as the stage composes it; Hydra's error as the
    stage's own one line, or, for a key only the other stage has (`shared`:
    the arguments both get), where settings of one stage go."""
    from hydra import compose
    from quantize.common import hydra_errors
    try:
        return compose(stage, argv)
    except HydraException as e:
        unknown = hydra_errors.UNKNOWN_KEY.search(str(e))
        other = "evaluate" if stage == "quantize" else "quantize"
        if unknown and unknown.group(1) in hydra_errors.config_values(other, shared, {unknown.group(1)}):
            raise UserError(f"{unknown.group(1)} is a setting of {other} only (python -m {stage} has no key "
                            f"{unknown.group(1)}); {BOTH_STAGES.format(stage=other)}") from None
        raise hydra_errors.as_user_error(e, stage, stage, argv) or UserError(str(e)) from None


def _quantize_job(model: str, recipe: str, artifact_dir: Path) -> PlannedJob:
    complete = (artifact_dir / manifest.FILE).is_file()
    return PlannedJob("quantize", model, recipe, work=0 if complete else 1, note="complete" if complete else "")


def _evaluate_job(config: EvaluateConfig, stored: list[Row], servable: list[str] | None, built: set) -> PlannedJob:
    """`built`: the recipes the quantize stage builds first."""
    model, recipe = str(config.target.model_name), config.target.recipe_name
    if servable is not None and recipe not in servable:
        return PlannedJob("evaluate", model, recipe, work=0, note="not servable here: recorded unsupported")
    artifact = resolve(config.target.artifacts_dir) / model / str(recipe)
    if recipe not in built and not (artifact / manifest.FILE).is_file():
        return PlannedJob("evaluate", model, recipe, work=0, note=f"no artifact at {artifact}")
    left = measurements_left(config, [r for r in stored if r.model_name == model and r.recipe == recipe])
    return PlannedJob("evaluate", model, recipe, work=left, note="" if left else "every run stored or unsupported")


def measurements_left(config: EvaluateConfig, rows: list[Row]) -> int:
    """Timed runs (serving scenarios, accuracy, lm-eval tasks) the job still
    owes, given its recipe's rows; one last recorded skipped or unsupported
    owes nothing (the job records that again without an engine)."""
    left = 0
    for s in scenarios.resolve(config.scenario):
        mine = [r for r in rows if r.scenario == s.name and r.kind in ("speed", "serving")]
        if _settled(mine):
            continue
        if config.load:
            left += not any(r.ok and r.kind == "serving" for r in mine)
            continue
        shape = (s.batch_size, s.input_len, s.output_len)
        done, values = batch.stored_runs(r for r in mine if r.ok and r.kind == "speed"
                                         and (r.batch_size, r.input_len, r.output_len) == shape)
        left += len(config.plan.indices(done, values))
    once = [("accuracy", config.accuracy.name)] if config.accuracy else []
    once += [("lm_eval", lmeval.label(config.lm_eval, task)) for task in config.lm_eval.tasks] if config.lm_eval else []
    for kind, label in once:
        mine = [r for r in rows if (r.kind, r.scenario) == (kind, label)]
        left += not _settled(mine) and not any(r.ok for r in mine)
    return left


def _settled(rows: list[Row]) -> bool:
    return bool(rows) and rows[-1].status in ("skipped", "unsupported")


def main(argv: list[str] | None = None) -> int:
    """Print the plan, write the run file (--check: neither); the exit status (2: bad input)."""
    from quantize.common.jobs import one_line
    parser = argparse.ArgumentParser(prog="python -m evaluate.matrix_plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quantize", default="", help="recipes the quantize stage builds, a,b")
    parser.add_argument("--evaluate", default="", help="recipes the evaluate stage measures, a,b")
    parser.add_argument("--servable", default=None, help="recipes evaluate can serve here (default: all)")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--runs", required=True)
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--run-file", help="where to write the run file the jobs read (required unless --check)")
    parser.add_argument("--check", action="store_true", help="compose every job, print and write nothing")
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if not (args.check or args.run_file):
        parser.error("the following arguments are required: --run-file")
    split = lambda text: [name for name in (text or "").split(",") if name]  # noqa: E731
    request = Request(quantize=split(args.quantize), evaluate=split(args.evaluate),
                      servable=None if args.servable is None else split(args.servable), scenario=args.scenario,
                      runs=args.runs, results_dir=args.results_dir, overrides=overrides)
    try:
        matrix = plan(request)
    except (UserError, HydraException) as e:  # an override the config does not have, a bad value: one line
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    if args.check:
        return 0
    run_file = Path(args.run_file).absolute()
    times = run_file.parent / TIMES_FILE
    print("\n".join(matrix.lines(read_times(times))), flush=True)
    RunFile(run_id=run_file.stem, started=time.time(), times=str(times), jobs=matrix.jobs).write(run_file)
    return 0


if __name__ == "__main__":
    detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    from quantize.common.jobs import run_command
    # Ctrl-C: one line, exit 130; Hydra's errors name evaluate, whose --help lists the keys it composes
    run_command(main, "evaluate", "evaluate")
