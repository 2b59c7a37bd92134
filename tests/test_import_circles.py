"""No import circles among the project's modules: each module can be read
before the ones that import it. Imports inside functions count too (a lazy
import that closes a circle only hides it), and importing a submodule counts
as importing its package (Python runs the package's __init__ first)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("quantize", "evaluate")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))
            if "plugins" not in p.parts}  # Hydra's plugin namespace is loaded by Hydra, not imported


def imported_names(name: str, path: Path) -> set[str]:
    """The dotted names a module imports, relative imports made absolute."""
    names = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names |= {module} | {f"{module}.{a.name}" for a in node.names}
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it makes Python run (itself excluded)."""
    modules = project_modules(root)
    graph = {}
    for name, path in modules.items():
        edges = set()
        for imported in imported_names(name, path):
            while imported and imported not in modules:  # `from pkg import function` -> pkg
                imported = imported.rpartition(".")[0]
            parts = imported.split(".")
            edges |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}  # the packages above run first
        graph[name] = {m for m in edges if m in modules and m != name and not name.startswith(m + ".")}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle as a path a -> ... -> a, or None."""
    state: dict[str, str] = {}  # visiting | done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "visiting"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "visiting":
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [])
            if found:
                return found
    return None


def test_no_import_circle():
    circle = find_circle(import_graph(ROOT))
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_checker_sees_a_circle_through_a_lazy_import(tmp_path):
    pkg = tmp_path / "evaluate"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from evaluate.b import thing\n")
    (pkg / "b.py").write_text("def thing():\n    from evaluate import a\n")
    (pkg / "c.py").write_text("from . import a\n")
    circle = find_circle(import_graph(tmp_path))
    assert circle and circle[0] == circle[-1] and {"evaluate.a", "evaluate.b"} <= set(circle)


def test_a_submodule_import_runs_its_package(tmp_path):
    pkg = tmp_path / "evaluate" / "engines"
    pkg.mkdir(parents=True)
    (tmp_path / "evaluate" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from evaluate.engines.base import Engine\n")
    (pkg / "base.py").write_text("from evaluate.table import T\n")
    (tmp_path / "evaluate" / "table.py").write_text("from evaluate.engines.vllm import V\n")
    (pkg / "vllm.py").write_text("V = 1\n")
    circle = find_circle(import_graph(tmp_path))
    assert circle and "evaluate.engines" in circle and "evaluate.table" in circle
