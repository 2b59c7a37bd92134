"""`python -m evaluate.search [search=default] [model=<preset|dir>] [engine=vllm|hf] [n_trials=12]
[study=<name>] [storage=<url>] [hydra/launcher=<name>]`

A Hydra app that is always a multirun: Optuna's sweeper (conf/search.yaml)
proposes each trial's `trial.*` values from the space of conf/search/<name>.yaml,
and every trial is one job (evaluate.search.trial) on whatever launcher is chosen."""
import sys

import hydra
from omegaconf import OmegaConf

from quantize.common.cli_help import print_help_if_asked
from quantize.common.config import prepare_argv
from quantize.common.errors import UserError
from quantize.common.extensions import plain
from quantize.common.hf_load import detach_stdin
from quantize.common.jobs import run_command, run_job
from quantize.common.paths import CONF_DIR

DEFAULT_SPACE = "default"


def register_resolvers() -> None:
    """The sweeper's keys that conf/search.yaml derives from the app's own (idempotent)."""
    resolvers = {
        # one Optuna direction per objective, in the objectives' order
        "search_directions": lambda objectives: [str(o["direction"]) for o in objectives],
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_resolvers()   # also where a launcher imports this module to run a job


@hydra.main(config_path=str(CONF_DIR), config_name="search", version_base="1.3")
def _hydra_main(cfg):
    # A trial downloads nothing itself; its stages do, each going offline unless it needs the hub
    # (its own run_job). An HF_HUB_OFFLINE=1 set here would reach them as the user's own.
    return run_job(_trial, cfg, needs_hub=True)


def _trial(cfg) -> list[float]:
    """The entry point's one conversion: everything below takes the typed SearchConfig."""
    from hydra.core.hydra_config import HydraConfig

    from evaluate.search import trial
    from evaluate.search.config import SearchConfig
    register_resolvers()
    job = HydraConfig.get()
    config = SearchConfig.from_values(plain(cfg), job.runtime.choices.get("search") or DEFAULT_SPACE)
    # the sweeper's trial number; a sweeper that sets none: the job's index in the sweep
    return trial.run(config, config.trial_number if config.trial_number is not None else job.job.num)


def preflight(argv: list[str]) -> None:
    """Before any trial: the composed config converts and the space can run
    (its keep_dense has a sensitivity file, its scenario is one), so a bad
    search is one line and exit 2, not N failed trials. Hydra's compose()
    takes no sweep expression, so each is composed at its first value and
    checked over all of them. A config Hydra cannot compose is left to
    Hydra's own message."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from evaluate.search import check
    from evaluate.search.config import SearchConfig
    overrides = [a for a in argv if not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]
    try:
        plain_overrides, swept = one_value_each(overrides)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="search"):
            composed = compose("search", overrides=plain_overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException):  # _hydra_main reports them in Hydra's words
        return
    space = composed.hydra.runtime.choices.get("search") or DEFAULT_SPACE
    values = plain(OmegaConf.masked_copy(composed, [k for k in composed if k != "hydra"]))
    try:
        fixed = {a.partition("=")[0] for a in overrides if a.startswith(check.PREFIX)} - set(swept)
        check.before_sweep(SearchConfig.from_values(values, space), fixed,
                           {k: v for k, v in swept.items() if k.startswith(check.PREFIX)})
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code)


def one_value_each(overrides: list[str]) -> tuple[list[str], dict[str, str]]:
    """The overrides with each sweep expression at its first value (a
    choice's first, a range's or an interval's lower bound), and the sweep
    expressions by key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import IntervalSweep
    plain_overrides, swept = [], {}
    for text, override in zip(overrides, OverridesParser.create().parse_overrides(overrides)):
        if not override.is_sweep_override():
            plain_overrides.append(text)
            continue
        value = override.value()
        first = str(value.start) if isinstance(value, IntervalSweep) else next(override.sweep_string_iterator(), None)
        if first is None:   # range(5,1): no value to search
            raise UserError(f"{text} gives no value to search; give it one at least, e.g. "
                            f"{override.get_key_element()}=range(1,5)")
        plain_overrides.append(f"{override.get_key_element()}={first}")
        swept[override.key_or_group] = text.partition("=")[2]
    return plain_overrides, swept


def check_sweeper_installed() -> None:
    """The search runs on hydra-optuna-sweeper; without it Hydra's own error
    names a missing `hydra/sweeper/sampler` config, not the package."""
    from importlib.util import find_spec
    missing = [name for name in ("optuna", "hydra_plugins.hydra_optuna_sweeper") if find_spec(name) is None]
    if missing:
        raise UserError(f"the recipe search needs Optuna and hydra-optuna-sweeper, which this Python lacks "
                        f"({', '.join(missing)}); run bash scripts/setup.sh (by hand: optuna from requirements/common.txt, "
                        "then pip install --no-deps -r requirements/no-deps.txt: the sweeper's own pins would "
                        "replace Optuna 5 with 2.x)")


def main() -> None:
    if print_help_if_asked("search", sys.argv[1:]):
        return
    prepare_argv("search")
    try:
        check_sweeper_installed()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code)
    preflight(sys.argv[1:])
    _hydra_main()


if __name__ == "__main__":
    detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    run_command(main, "evaluate.search", "search")
