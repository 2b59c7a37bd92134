"""The dependency picture the README draws holds in the code: quantize.common
imports no stage, quantize never imports evaluate, and evaluate imports only
quantize.common of quantize (lazy imports inside functions count too)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def project_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n.split(".")[0] in ("quantize", "evaluate")}


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def allowed(name: str, rule: str) -> bool:
    common = name == "quantize.common" or name.startswith("quantize.common.")
    return {"common": common, "quantize": not name.startswith("evaluate"),
            "evaluate": common or name.startswith("evaluate")}[rule]


@pytest.mark.parametrize("folder,rule", [("quantize/common", "common"), ("quantize", "quantize"),
                                         ("evaluate", "evaluate")])
def test_imports_follow_the_layering(folder, rule):
    wrong = {f"{p.relative_to(ROOT)}: {n}" for p in modules(folder) for n in project_imports(p)
             if not allowed(n, rule)}
    assert not wrong, sorted(wrong)


def test_the_checker_sees_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from quantize.pipeline import run\n")
    assert not all(allowed(n, "evaluate") for n in project_imports(bad))
