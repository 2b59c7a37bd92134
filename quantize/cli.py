"""`python -m quantize recipe=<name> [model=…] [calibration=…] [key=value …]`"""
import sys

import hydra

from quantize.common.cli_help import print_help_if_asked
from quantize.common.config import prepare_argv
from quantize.common.jobs import run_job
from quantize.common.point_folders import check_forced_sweep
from quantize.common.paths import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="quantize", version_base="1.3")
def _hydra_main(cfg) -> None:
    from omegaconf import OmegaConf

    from quantize.common.hub import is_repo_id
    model = OmegaConf.select(cfg, "model.path", throw_on_missing=False)
    run_job(_quantize, cfg, needs_hub=cfg.calibration.get("source") == "hub" or is_repo_id(model or ""))


def _quantize(cfg):
    """The entry point's one conversion: the composed config becomes a typed
    QuantizeConfig, which is all the pipeline sees. Inside run_job, so a bad
    setting is one line (and, in a sweep, one failed job)."""
    from quantize import pipeline
    from quantize.common.extensions import plain
    from quantize.common.jobs import swept_keys
    from quantize.config import QuantizeConfig
    return pipeline.run(QuantizeConfig.from_config(plain(cfg), swept=swept_keys()))


def main() -> None:
    if print_help_if_asked("quantize", sys.argv[1:]):
        return
    prepare_argv("quantize")
    check_forced_sweep("quantize", sys.argv[1:])
    _hydra_main()
