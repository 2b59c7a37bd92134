"""Hydra's composed DictConfig stops at the entry points: each stage converts
it once into typed objects (EvaluateConfig, QuantizeConfig, ReportConfig, the
capability request) and no function below takes it. A function taking a
DictConfig is one with a `cfg` parameter or a DictConfig annotation."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The entries' one conversion (and the job wrapper that hands the cfg to it).
ENTRY_FUNCTIONS = {
    ("evaluate/cli.py", "_hydra_main"), ("evaluate/cli.py", "_evaluate"),
    ("evaluate/config.py", "from_cfg"), ("evaluate/config.py", "target_config"), ("evaluate/config.py", "_group"),
    ("evaluate/capabilities.py", "_hydra_main"), ("evaluate/capabilities.py", "from_cfg"),
    ("evaluate/report/__main__.py", "_hydra_main"), ("evaluate/track.py", "_hydra_main"),
    ("quantize/cli.py", "_hydra_main"), ("quantize/cli.py", "_quantize"),
    ("quantize/sensitivity/__main__.py", "_hydra_main"), ("quantize/sensitivity/__main__.py", "_sensitivity"),
    ("quantize/propose/cli.py", "_hydra_main"), ("quantize/propose/cli.py", "_propose"),
    ("evaluate/search/__main__.py", "_hydra_main"), ("evaluate/search/__main__.py", "_trial"),
    ("evaluate/search/sweeper.py", "from_cfg"), ("evaluate/search/sweeper.py", "setup"),
    ("quantize/common/jobs.py", "run_job"),
}


def functions_taking_a_config(root: Path) -> set[tuple[str, str]]:
    found = set()
    for pkg in ("evaluate", "quantize"):
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                    if any(a.arg == "cfg" or (a.annotation is not None and "DictConfig" in ast.unparse(a.annotation))
                           for a in params):
                        found.add((path.relative_to(root).as_posix(), node.name))
    return found


def test_no_function_below_the_entry_points_takes_the_composed_config():
    below = functions_taking_a_config(ROOT) - ENTRY_FUNCTIONS
    assert not below, f"take a DictConfig below the entry points: {sorted(below)}"


def test_the_checker_sees_a_config_passed_down(tmp_path):
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "quantize").mkdir()
    (tmp_path / "evaluate" / "deep.py").write_text(
        "from omegaconf import DictConfig\ndef plan(settings: DictConfig): ...\ndef run(cfg): ...\n")
    assert functions_taking_a_config(tmp_path) == {("evaluate/deep.py", "plan"), ("evaluate/deep.py", "run")}
