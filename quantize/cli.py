"""`python -m quantize recipe=<name> [model=…] [calibration=…] [key=value …]`"""
import hydra

from quantize.common.config import prepare_argv
from quantize.common.jobs import run_job
from quantize.common.paths import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="quantize", version_base="1.3")
def _hydra_main(cfg) -> None:
    from quantize import pipeline
    run_job(pipeline.run, cfg, needs_hub=cfg.calibration.get("source") == "hub")


def main() -> None:
    prepare_argv()
    _hydra_main()
