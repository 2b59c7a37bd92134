"""Where a study lives: an Optuna storage URL, opened (and so checked) before
any trial starts.

    default   sqlite:///<results_dir>/search/<study>/study.db   (beside study.json)
    MariaDB   mysql+pymysql://<user>:<password>@127.0.0.1:3307/<database>
              (the MariaDB that `bash scripts/slurm_local.sh start` runs)

A URL is shown (logs, study.json, errors) without its password."""
from pathlib import Path

from quantize.common.credentials import redact  # noqa: F401 (storages.redact: the sweeper's too)
from quantize.common.errors import UserError
from quantize.common.jobs import one_line

FILE = "study.db"
MARIADB_FIX = ("start the database (`eval \"$(bash scripts/slurm_local.sh start)\"` runs MariaDB on "
               "127.0.0.1:3307), create the database and its user, or set hydra.sweeper.storage="
               "sqlite:///<file> to keep the study in a file")


def default_url(results_dir: Path, study: str) -> str:
    """The study's SQLite file beside its study.json, as an absolute path so
    that jobs started elsewhere (a Slurm node, another directory) mean the same file."""
    return f"sqlite:///{(Path(results_dir) / 'search' / study / FILE).resolve()}"


def open_storage(url: str):
    """The Optuna storage at `url` (tables created on first use); a one-line
    UserError naming the URL and the fix when it cannot be opened."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    url = str(url)   # Hydra reads storage=5 as a number
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(f"hydra.sweeper.storage={redact(url)} is not a database URL; use "
                        "sqlite:///<file> or mysql+pymysql://<user>:<password>@<host>:<port>/<database>") from None
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and parsed.database and parsed.database != ":memory:":
        _make_folder(Path(parsed.database), url)
    # A sweep can sit for hours between writes: test a pooled connection before
    # use, since MariaDB drops idle ones (wait_timeout).
    engine_kwargs = None if sqlite else {"pool_pre_ping": True}
    try:
        return _shown_as(redact(url))(url, engine_kwargs=engine_kwargs)
    except ModuleNotFoundError as e:
        raise UserError(f"cannot open the study storage {redact(url)}: the driver {e.name} is not installed; "
                        "install requirements/common.txt (PyMySQL for mysql+pymysql://)") from None
    except Exception as e:  # sqlalchemy's and the drivers' errors, whatever the backend
        fix = "check that the file's folder is writable" if sqlite else MARIADB_FIX
        raise UserError(f"cannot open the study storage {redact(url)} ({_cause(e)}); {fix}") from None


def _shown_as(shown: str):
    """RDBStorage whose repr is its URL without the password (the plugin logs the storage)."""
    import optuna

    class Storage(optuna.storages.RDBStorage):
        def __repr__(self) -> str:
            return shown
    return Storage


def _make_folder(path: Path, url: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the folder of the study storage {redact(url)} ({e.strerror}); "
                        "set results_dir or hydra.sweeper.storage to a writable place") from None


def _cause(e: Exception) -> str:
    """The driver's own message (sqlalchemy wraps it with SQL and a link)."""
    return one_line(getattr(e, "orig", None) or e)
