"""Where quantbench keeps things: one place, so every module agrees."""
import errno
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
    """Resolve a user path: absolute stays, relative is taken from the cwd.
    That is the directory the user launched from: Hydra keeps it
    (`hydra.job.chdir: false` in conf/*.yaml), and every launcher starts its
    jobs there (submitit's local processes, Slurm's sbatch, local Ray)."""
    p = Path(os.path.expanduser(str(path)))
    return p if p.is_absolute() else Path.cwd() / p


def _path_text(key: str, value, what: str, example: str) -> str:
    """A path setting's text: Hydra reads `out_dir=7` as an int (its digits are
    the name), but `=true`, `=[1]` and `=1e999` as a bool, a list and inf,
    whose str() ('True', '[1]', 'inf') is not what was typed."""
    from quantize.common.errors import UserError
    from quantize.common.settings import is_integer, is_number, shown
    if value is None or isinstance(value, str) or is_integer(value):
        return "" if value is None else str(value)
    quote = f"; to name a folder {value}, quote it: '{key}=\"{value}\"'" if is_number(value) else ""
    raise UserError(f"{key}={shown(value)} is not {what}; pass one, e.g. {key}={example}{quote}")


def folder_setting(key: str, value) -> str:
    """A folder setting as given; empty is refused: `results_dir=$OUT` with OUT
    unset wrote into the working directory, and an empty artifacts_dir made
    `${artifacts_dir}/<model>/<recipe>` a folder at the file system's root."""
    from quantize.common.errors import UserError
    text = _path_text(key, value, "a folder path", "my-folder")
    if not text.strip():
        raise UserError(f"{key} is empty (an unset shell variable?); pass {key}=<a folder>, or {key}=. for this one")
    return text


def folder_name(key: str, value, under: str = "artifacts_dir") -> str:
    """A name that is one folder of a path (<artifacts_dir>/<model.name>/<recipe.name>):
    a '/' or '..' in it wrote outside artifacts_dir, and an empty one dropped a level.
    `under`: the folder the message says it is made in."""
    from quantize.common.errors import UserError
    text = _path_text(key, value, "a folder name", f"my-{key.partition('.')[0]}")
    if not text.strip() or text in (".", "..") or any(c in text for c in "/\\\0"):
        raise UserError(f"{key}={text!r} is not a folder name: it becomes one folder under {under}; "
                        f"pass a name without '/', e.g. {key}=my-{key.partition('.')[0]}")
    return text


def check_output_dir(path: str | os.PathLike, fix: str) -> Path:
    """`resolve(path)` for a folder a stage creates and writes into: a regular
    file at it or above it is a one-line error (before any work), not a
    NotADirectoryError when the stage saves. `fix` is the setting to pass."""
    from quantize.common.errors import UserError
    out = resolve(path)
    for existing in (out, *out.parents):
        if existing.exists():
            if not existing.is_dir():
                where = "" if existing == out else f", so {out} cannot be created"
                raise UserError(f"{existing} is a file, not a directory{where}; pass {fix}")
            break
    return out


def check_writable_dir(path: str | os.PathLike, fix: str) -> Path:
    """check_output_dir, and this user can create files where the folder is or
    would be made (its nearest existing folder); nothing is left behind."""
    import tempfile

    from quantize.common.errors import UserError
    out = check_output_dir(path, fix)
    existing = next(p for p in (out, *out.parents) if p.exists())
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        # /proc and the like answer "No such file or directory" about a folder that exists
        reason = f"no file can be made in {existing}" if e.errno == errno.ENOENT else e.strerror or str(e)
        raise UserError(f"cannot write to {out} ({reason}); pass {fix}") from None
    return out
