"""The OmegaConf resolvers the config files use (`${qb_root:}`, `${qb_cache:}`,
`${basename:…}`, `${stem:…}`, `${model_name:…}`), registered by whoever reads those files: the
stages' Hydra entry points and the recipe choices."""
from pathlib import Path

from omegaconf import OmegaConf

from quantize.common.hub import folder_name
from quantize.common.paths import CACHE_DIR, PROJECT_ROOT


def register_resolvers() -> None:
    """Idempotent."""
    resolvers = {
        "qb_root": lambda: str(PROJECT_ROOT),
        "qb_cache": lambda: str(CACHE_DIR),
        "basename": lambda p: Path(str(p)).name,
        "stem": lambda p: Path(str(p)).stem,
        # a checkpoint folder's name, or a hub id's with its revision (hub.folder_name)
        "model_name": lambda p, revision=None: folder_name(Path(str(p)).name, revision),
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
