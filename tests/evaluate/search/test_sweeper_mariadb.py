"""The search's study in MariaDB (the one scripts/slurm_local.sh runs for
Slurm's accounting), its trials as Slurm jobs through the submitit launcher:
the toy search completes there, resumes to a raised target, and study.json
shows the storage without its password."""
import secrets
import subprocess
from pathlib import Path

import optuna
import pytest

from evaluate.search import study_file
from tests.evaluate.search.test_sweeper import run, toy
from tests.scripts.test_slurm_local import cluster, job_ids  # noqa: F401  (the session's local Slurm + MariaDB)

pytestmark = pytest.mark.filterwarnings("ignore:.*Distribution has been deprecated:FutureWarning")

DATABASE, USER = "optuna_toy", "optuna"


@pytest.fixture(scope="module")
def mariadb_url(cluster):  # noqa: F811
    """A database and user for Optuna, made as root over MariaDB's socket."""
    password = secrets.token_hex(8)
    sql = (f"CREATE DATABASE IF NOT EXISTS {DATABASE}; "
           f"CREATE USER IF NOT EXISTS '{USER}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
           f"ALTER USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
           f"GRANT ALL ON {DATABASE}.* TO '{USER}'@'127.0.0.1';")
    socket = Path(cluster.env["QB_SLURM_DIR"]) / "run" / "mysqld.sock"
    out = subprocess.run(["mariadb", "--no-defaults", f"--socket={socket}", "-uroot", "-e", sql],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return f"mysql+pymysql://{USER}:{password}@127.0.0.1:{cluster.env['QB_SLURM_DB_PORT']}/{DATABASE}", password


def test_a_study_in_mariadb_runs_its_trials_on_slurm_and_resumes(cluster, mariadb_url, tmp_path):  # noqa: F811
    url, password = mariadb_url
    search = toy(tmp_path, f"hydra.sweeper.storage='{url}'", "hydra/launcher=slurm_local", "hydra.sweeper.n_trials=4")
    out = run(search, tmp_path, cluster.cli_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(job_ids(tmp_path / "sweep")) == 4  # every trial was a Slurm job
    study = optuna.load_study(study_name="toy", storage=url)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4

    more = run([*search, "hydra.sweeper.n_trials=5"], tmp_path, cluster.cli_env())
    assert more.returncode == 0, more.stderr[-3000:]
    assert "resumed with 4 of 5 trial(s) finished, 1 to run" in more.stdout
    study = optuna.load_study(study_name="toy", storage=url)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 5

    path = study_file.path_for(tmp_path / "res", "toy")
    record = study_file.read(path)
    assert record.storage == url.replace(password, "***") and password not in path.read_text()
    assert sorted(t.number for t in record.complete()) == [0, 1, 2, 3, 4]
    assert sorted(int(n) for n in (tmp_path / "ledger.txt").read_text().split()) == [0, 1, 2, 3, 4]
