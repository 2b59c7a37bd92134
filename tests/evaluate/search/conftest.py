"""The search's tests that drive Optuna or its Hydra sweeper are not
collected where Optuna is not installed (a machine with only the stages, as
the GPU device check's): they would fail at import. What such a machine gets
from `python -m evaluate.search` is tested in test_needs_sweeper.py."""
from importlib.util import find_spec

NEED_OPTUNA = ["test_dashboard.py", "test_search.py", "test_study_wall_time.py", "test_sweeper.py", "test_sweeper_mariadb.py"]
collect_ignore = [] if find_spec("optuna") else NEED_OPTUNA
