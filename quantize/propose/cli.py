"""`python -m quantize.propose recipe=<base> (max_size_mb=<MB> | max_kl=<nats> | kept_dense=<k>)
[model=...] [sensitivity=<path|auto>] [name=<new recipe>] [force=true]`"""
import sys

import hydra

from quantize.common.cli_help import print_help_if_asked
from quantize.common.config import prepare_argv
from quantize.common.jobs import run_job
from quantize.common.paths import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="propose", version_base="1.3")
def _hydra_main(cfg) -> None:
    run_job(_propose, cfg)


def _propose(cfg):
    """The entry point's one conversion: the composed config becomes a typed ProposeConfig."""
    from quantize.common.extensions import plain
    from quantize.propose.config import ProposeConfig
    from quantize.propose.run import run
    return run(ProposeConfig.from_config(plain(cfg)))


def main() -> None:
    if print_help_if_asked("propose", sys.argv[1:]):
        return
    prepare_argv("propose")
    _hydra_main()
