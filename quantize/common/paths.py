"""Where quantbench keeps things: one place, so every module agrees."""
import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"
RECIPES_DIR = PROJECT_ROOT / "recipes"
# Downloads, the materialized default model and corpus, engine compile caches.
CACHE_DIR = Path(os.environ.get("QUANTBENCH_CACHE", PROJECT_ROOT / ".cache"))
MODELS_DIR = CACHE_DIR / "models"
CORPUS_DIR = CACHE_DIR / "corpus"


def resolve(path: str | os.PathLike) -> Path:
    """Resolve a user path: absolute stays, relative is taken from the cwd
    the user launched from (Hydra may change cwd for jobs)."""
    p = Path(os.path.expanduser(str(path)))
    if p.is_absolute():
        return p
    base = os.environ.get("QUANTBENCH_LAUNCH_CWD") or os.getcwd()
    return Path(base) / p
