"""`python -m evaluate model=<artifact dir | preset> [recipe=…] [scenario=…] [engine=…] [runs=…] [hardware=…]`"""
import sys

import hydra

from evaluate import hardware
from quantize.common.config import prepare_argv
from quantize.common.jobs import run_job
from quantize.common.paths import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="evaluate", version_base="1.3")
def _hydra_main(cfg) -> None:
    from evaluate import lmeval, pipeline
    run_job(pipeline.run, cfg, needs_hub=lmeval.needs_hub(cfg.lm_eval))


def main() -> None:
    prepare_argv()
    # once, before Hydra composes: the machine's defaults (conf/hardware/), under the command line's
    sys.argv[1:] = hardware.with_default(sys.argv[1:])
    _hydra_main()
