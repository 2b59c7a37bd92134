"""`python -m quantize.sensitivity recipe=<name> [model=…] [results_dir=…] [text.num_windows=…] [force=true]`"""
import sys

import hydra

from quantize.common.cli_help import print_help_if_asked
from quantize.common.config import prepare_argv
from quantize.common.hf_load import detach_stdin
from quantize.common.jobs import run_command, run_job
from quantize.common.paths import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="sensitivity", version_base="1.3")
def _hydra_main(cfg) -> None:
    from omegaconf import OmegaConf

    from quantize.common.hub import is_repo_id
    model = OmegaConf.select(cfg, "model.path", throw_on_missing=False)
    run_job(_sensitivity, cfg, needs_hub=is_repo_id(model or ""))


def _sensitivity(cfg):
    """The entry point's one conversion into a typed SensitivityConfig."""
    from quantize.common.extensions import plain
    from quantize.sensitivity.config import SensitivityConfig
    from quantize.sensitivity.run import run
    return run(SensitivityConfig.from_config(plain(cfg)))


def main() -> None:
    if print_help_if_asked("sensitivity", sys.argv[1:]):
        return
    prepare_argv("sensitivity")
    _hydra_main()


if __name__ == "__main__":
    detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    run_command(main, "quantize.sensitivity", "sensitivity")
