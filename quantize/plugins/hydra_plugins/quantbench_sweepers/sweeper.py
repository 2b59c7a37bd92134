"""The plugin class Hydra instantiates for conf/hydra/sweeper/quantbench_optuna.yaml.

Hydra builds sweepers only from classes in its `hydra_plugins` namespace; the
sweeper's work belongs to the search (evaluate/search/sweeper.py), which this
package may not import (quantize never imports evaluate). So the preset names
that class in `impl`, and this one hands it every other setting."""
from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.utils import get_class


class QuantbenchSweeper(Sweeper):
    """Delegates to `impl`, a Sweeper built from the preset's other keys."""

    def __init__(self, impl: str, **settings: Any) -> None:
        self.sweeper = get_class(impl)(**settings)

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.sweeper.sweep(arguments)
