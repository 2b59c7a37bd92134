"""`python -m evaluate model=<artifact dir | preset> [recipe=…] [scenario=…] [engine=…] [runs=…] [hardware=…]`"""
import sys

import hydra

from evaluate import hardware, memory
from quantize.common.cli_help import print_help_if_asked
from quantize.common.config import prepare_argv
from quantize.common.extensions import plain
from quantize.common.jobs import run_job
from quantize.common.paths import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="evaluate", version_base="1.3")
def _hydra_main(cfg) -> None:
    from evaluate import lmeval
    lm_eval = plain(cfg.lm_eval)
    tasks = list(lm_eval.get("tasks") or []) if lm_eval.get("enabled") else None
    run_job(_evaluate, cfg, needs_hub=lmeval.needs_hub(tasks))


def _evaluate(cfg) -> None:
    """The one conversion of the composed config: everything below takes the typed EvaluateConfig."""
    from evaluate import pipeline
    from evaluate.config import EvaluateConfig
    pipeline.run(EvaluateConfig.from_cfg(cfg))


def main() -> None:
    if print_help_if_asked("evaluate", sys.argv[1:]):
        return
    memory.one_malloc_arena()  # before any thread allocates: engines' peak memory (evaluate.memory)
    # once, before the checks compose (a GPU's defaults have keys, as slo.ttft_ms, the CPU's lack):
    # the machine's defaults (conf/hardware/), under the command line's
    sys.argv[1:] = hardware.with_default(sys.argv[1:])
    prepare_argv("evaluate")
    _hydra_main()
