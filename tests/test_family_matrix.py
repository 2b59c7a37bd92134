"""The family matrix: tiny random models of every family in
quantize/common/tiny_model.py FAMILIES, through every recipe of
tests/family_matrix.yaml, with transformers and vLLM; reality must equal the
expectations there (which README's table is rendered from: scripts/family_table.py).

Each stage is one real sweep, not a run per cell: one `python -m quantize -m`
over all families x recipes (verify=reload: every artifact reloads in
transformers with finite logits), one `python -m evaluate -m engine=hf` over
every artifact built, one `engine=vllm` sweep over the artifacts the
capability layer refuses (`unsupported` rows, no engine starts; one of them
alone: a one-line answer, exit 2), and one over those it can serve.
The sweeps run with QUANTBENCH_FAMILY_MATRIX set: `sample` starts vLLM on a
fixed sample of cells that cover distinct code (about 8 min on 2 cores),
`full` (`make family-matrix`) on every cell it may serve (about 26 min).
`make test` runs the fast checks of the matrix file and README's table only:
the sweeps would take a quarter of the suite's 30-min budget, and each
feature they cross has its own end-to-end test in the suite.
Every failure message ends in the whole observed matrix."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quantize.common.tiny_model import FAMILIES
from tests.conftest import ROOT, SMALL_CALIB, quantize_env, run_cli, serve_verdict, shipped_recipes, tail


def _family_table():
    """scripts/family_table.py (not a package): the matrix loader and the README renderer."""
    spec = importlib.util.spec_from_file_location("family_table", ROOT / "scripts" / "family_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


family_table = _family_table()
MATRIX = family_table.load()
WORKS, REFUSED, CAPABILITY, SUSPECT, QUANTIZE = (family_table.WORKS, family_table.REFUSED, family_table.CAPABILITY,
                                                 family_table.SUSPECT, family_table.QUANTIZE)
MODE = os.environ.get("QUANTBENCH_FAMILY_MATRIX", "")  # "", "sample" or "full"
FULL = MODE == "full"
sweeps = pytest.mark.skipif(MODE not in ("sample", "full"), reason="the family matrix's sweeps run with "
                            "QUANTBENCH_FAMILY_MATRIX=sample|full (make family-matrix)")
# vLLM starts in `make test` (20-80 s each on a CPU): cells whose serving code
# differs - a sliding-window family quantized to W4A16, a fused-qkv family to
# W8A8, a mixture of experts unquantized (vLLM's fused-MoE path).
SAMPLE = (("mistral", "w4a16_gptq"), ("phi3", "w8a8_smooth_gptq"), ("mixtral", "original"))
SCENARIO = "name: test_family\nbatch_size: 1\ninput_len: 16\noutput_len: 4\n"
EVALUATE = ("runs=1", "warmup_runs=1", "accuracy=none")
# Quantize's sanity gate, W4 floor lowered from 0.55: a tiny random model's
# next-token distributions are near flat (KL to its W4A16 copy 0.001-0.002
# nats), so top-1 agreement there is a coin toss between near-equal tokens
# (0.48-0.51 measured for gemma2, gemma3_text, olmo2), not a defect. A broken
# artifact still falls far below (Gemma's SmoothQuant: 0.000-0.004).
SANITY = ("sanity.floors.w4=0.3",)
SWEEP_TIMEOUT_S = 3600  # a hang guard for a whole sweep on 2 shared cores, not a speed check
# Wall time of each sweep, printed with the matrix (seconds).
WALL_S: dict[str, float] = {}


@dataclass
class Cell:
    """What one family x recipe did: quantize, then each engine on its artifact."""
    family: str
    recipe: str
    quantize: str = "missing"  # works | refused | failed | missing (no job found)
    exit_code: int | None = None
    error: str = ""
    artifact: Path | None = None
    engines: dict = field(default_factory=dict)  # engine -> observed text

    def text(self, stage: str) -> str:
        if stage == QUANTIZE and self.artifact:  # shown, not judged here: quantize's sanity gate marks it
            suspect = json.loads((self.artifact / "manifest.json").read_text()).get("suspect")
            return f"{WORKS} (suspect: {_short(suspect['reason'], 60)})" if suspect else WORKS
        if stage == QUANTIZE:
            return self.quantize if self.quantize == "missing" else \
                f"{self.quantize} (exit {self.exit_code}): {_short(self.error)}"
        return self.engines.get(stage, "·" if self.artifact else "—")


OBSERVED: dict[tuple[str, str], Cell] = {}


def _short(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def observed_table() -> str:
    """The matrix as run so far (· not run yet), for every failure message and `pytest -s`."""
    stages = (QUANTIZE, *MATRIX.engines)
    lines = ["| family | recipe | " + " | ".join(stages) + " |", "|---|---|" + "---|" * len(stages)]
    for (family, recipe), cell in OBSERVED.items():
        lines.append(f"| {family} | {recipe} | " + " | ".join(cell.text(s) for s in stages) + " |")
    times = ", ".join(f"{name} {s:.0f} s" for name, s in WALL_S.items())
    return "\n".join(lines) + (f"\nwall time: {times}" if times else "")


def _fail_with_matrix(problems: list[str]) -> None:
    if problems:
        pytest.fail("\n".join(problems) + "\n\nThe family matrix as observed:\n" + observed_table(), pytrace=False)


def _sweep(module: str, args: list[str], cwd: Path, name: str) -> subprocess.CompletedProcess:
    """One `python -m <module> -m ...` sweep; its wall time lands in WALL_S[name]."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", module, "-m", *args], cwd=cwd,
                          env=quantize_env({"VLLM_CPU_KVCACHE_SPACE": "1"}), capture_output=True, text=True,
                          timeout=SWEEP_TIMEOUT_S)
    WALL_S[name] = time.monotonic() - start
    return proc


def _failures(sweep_dir: Path) -> dict[tuple[Path, str | None], dict]:
    """{(the job's model.path, its recipe or None): its FAILED.json} of a sweep's jobs that failed."""
    found = {}
    for path in sweep_dir.glob("*/FAILED.json"):
        failure = json.loads(path.read_text())
        overrides = dict(o.partition("=")[::2] for o in failure["overrides"])
        found[Path(overrides["model.path"]).resolve(), overrides.get("recipe")] = failure
    return found


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> dict:
    """The 16 tiny models, and one quantize sweep over every family x recipe:
    {"root": the module's folder, "cells": {(family, recipe): Cell}}."""
    from quantize.common.assets import ensure_default_model
    from quantize.common.tiny_model import build_tiny
    root = tmp_path_factory.mktemp("family_matrix")
    tokenizer = ensure_default_model()
    start = time.monotonic()
    # a seed per family: identical weights would give two families one artifact id
    models = [build_tiny(family, root / "models" / family, tokenizer, seed=seed)
              for seed, family in enumerate(MATRIX.families)]
    WALL_S["build 16 models"] = time.monotonic() - start
    artifacts, sweep = root / "artifacts", root / "quantize-sweep"
    _sweep("quantize", [f"model={','.join(map(str, models))}", f"recipe={','.join(MATRIX.recipes)}", *SMALL_CALIB,
                        *SANITY, "verify=reload", f"artifacts_dir={artifacts}", f"hydra.sweep.dir={sweep}"],
           root, "quantize sweep")
    failed = _failures(sweep)
    jobs = {p.name.partition("_")[2] for p in sweep.iterdir() if p.is_dir()}  # <num>_<family>_<recipe>
    for family, model in zip(MATRIX.families, models):
        for recipe in MATRIX.recipes:
            cell = OBSERVED[family, recipe] = Cell(family, recipe)
            failure = failed.get((model.resolve(), recipe))
            if failure:
                cell.quantize = REFUSED if failure["exit_code"] == 2 else "failed"
                cell.exit_code, cell.error = failure["exit_code"], failure["error"]
            elif (artifacts / family / recipe / "manifest.json").exists():
                cell.quantize, cell.exit_code, cell.artifact = WORKS, 0, artifacts / family / recipe
            elif f"{family}_{recipe}" in jobs:
                cell.error = "the job left neither an artifact nor FAILED.json"
    return {"root": root, "cells": OBSERVED}


def built(quantized) -> list[Cell]:
    return [cell for cell in quantized["cells"].values() if cell.artifact]


def _scenario(root: Path) -> Path:
    path = root / "test_family.yaml"
    path.write_text(SCENARIO)
    return path


def _evaluate_sweep(quantized, cells: list[Cell], engine: str, name: str, *extra: str) -> dict:
    """One evaluate sweep over `cells`' artifacts: {artifact path: (rows, FAILED.json or None)}."""
    from evaluate import results
    root = quantized["root"]
    if not cells:
        return {}
    out, sweep = root / f"results-{name}", root / f"sweep-{name}"
    _sweep("evaluate", [f"model={','.join(str(c.artifact) for c in cells)}", f"engine={engine}",
                        f"scenario={_scenario(root)}", *EVALUATE, *extra, f"results_dir={out}",
                        f"hydra.sweep.dir={sweep}"], root, name)
    rows = results.read(out) if out.exists() else []
    failed = _failures(sweep) if sweep.exists() else {}
    return {c.artifact: ([r for r in rows if Path(r.artifact_path).resolve() == c.artifact.resolve()],
                         failed.get((c.artifact.resolve(), None))) for c in cells}


def _engine_text(rows, failure) -> str:
    if failure:
        return f"exit {failure['exit_code']}: {_short(failure['error'])}"
    bad = [r for r in rows if r.status != "ok"]
    if not rows:
        return "no rows"
    if all(r.status == "unsupported" for r in rows):
        return f"unsupported: {_short(rows[0].reason or '')}"
    return f"{len(bad)}/{len(rows)} rows {bad[0].status}: {_short(bad[0].reason or '')}" if bad else WORKS


@pytest.fixture(scope="module")
def hf_served(quantized) -> dict:
    """Every built artifact on transformers, in one sweep."""
    served = _evaluate_sweep(quantized, built(quantized), "hf", "hf")
    for cell in built(quantized):
        cell.engines["hf"] = _engine_text(*served[cell.artifact])
    return served


@pytest.fixture(scope="module")
def vllm_verdicts(quantized) -> dict:
    """What the capability layer says of serving each built artifact with vLLM here."""
    return {cell.artifact: serve_verdict(cell.artifact, "vllm")[0] for cell in built(quantized)}


@pytest.fixture(scope="module")
def vllm_refused(quantized, vllm_verdicts) -> dict:
    """The artifacts the capability layer refuses, through evaluate engine=vllm in one sweep: `unsupported` rows."""
    cells = [c for c in built(quantized) if not vllm_verdicts[c.artifact]]
    answered = _evaluate_sweep(quantized, cells, "vllm", "vllm-refused")
    for cell in cells:
        cell.engines["vllm"] = _engine_text(*answered[cell.artifact])
    return answered


def vllm_cells() -> list[tuple[str, str]]:
    """The cells vLLM starts on: every one with an artifact (full; the capability
    layer then leaves out what it refuses), or SAMPLE."""
    if not FULL:
        return list(SAMPLE)
    return [(name, recipe) for name, family in MATRIX.families.items() for recipe in MATRIX.recipes
            if family.expect(recipe, "vllm") is not None]


@pytest.fixture(scope="module")
def vllm_served(quantized, vllm_verdicts) -> dict:
    """vllm_cells() the capability layer lets vLLM serve here, in one sweep (eager: no compile)."""
    cells = [c for key in vllm_cells() if (c := quantized["cells"][key]).artifact and vllm_verdicts[c.artifact]]
    served = _evaluate_sweep(quantized, cells, "vllm", "vllm-served", "engine.args.enforce_eager=true")
    for cell in cells:
        cell.engines["vllm"] = _engine_text(*served[cell.artifact])
    return served


@pytest.fixture(scope="module", autouse=True)
def print_matrix():
    """With `pytest -s`, the whole matrix as observed, after the module's tests."""
    yield
    if OBSERVED:
        print("\n\nThe family matrix as observed:\n" + observed_table())


# --- fast: the matrix file and the README table ---

def test_the_matrix_names_every_family_and_shipped_recipes():
    assert list(MATRIX.families) == list(FAMILIES)
    assert set(MATRIX.recipes) <= set(shipped_recipes())
    assert MATRIX.engines == ("hf", "vllm")


def test_readme_table_is_the_matrix_rendered():
    """README.md's family table is scripts/family_table.py's rendering of tests/family_matrix.yaml."""
    text = (ROOT / "README.md").read_text()
    try:
        start, end = family_table.readme_block(text)
    except family_table.MatrixError as e:
        pytest.fail(str(e), pytrace=False)
    assert text[start:end] == family_table.render(MATRIX), \
        "README.md's family table is stale: run .venv/bin/python scripts/family_table.py --write"


def _table_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "family_table.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_the_table_script_writes_between_the_markers_and_checks(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{family_table.BEGIN}\nold table\n{family_table.END}\nafter\n")
    assert _table_script("--readme", str(readme), "--check", cwd=tmp_path).returncode == 1
    assert _table_script("--readme", str(readme), "--write", cwd=tmp_path).returncode == 0
    text = readme.read_text()
    assert text == (f"# Title\n\nbefore\n{family_table.BEGIN}\n{family_table.render(MATRIX)}"
                    f"{family_table.END}\nafter\n")
    assert _table_script("--readme", str(readme), "--check", cwd=tmp_path).returncode == 0
    assert list(tmp_path.iterdir()) == [readme]  # no temp file left


def test_the_table_script_without_markers_is_one_line_and_writes_nothing(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n")
    proc = _table_script("--readme", str(readme), "--write", cwd=tmp_path)
    assert proc.returncode == 2 and readme.read_text() == "# Title\n"
    assert proc.stderr.count("\n") == 1 and family_table.BEGIN in proc.stderr, proc.stderr


@pytest.mark.parametrize("cell, why", [
    ({"quantize": "works", "hf": "works"}, "it needs ['hf', 'vllm']"),
    ({"quantize": {"refused": "no_smoothquant_mappings"}, "hf": "works"}, "it needs []"),
    ({"quantize": {"capability": "moe_kernels_need_amx"}}, "for engines, not quantize"),
    ({"quantize": {"suspect": "gemma_smoothquant_mappings"}}, "it needs ['hf', 'vllm']"),
    ({"quantize": "works", "hf": {"suspect": "gemma_smoothquant_mappings"}, "vllm": "works"},
     "is for quantize, not ['hf']"),
    ({"quantize": {"refused": "no_such_reason"}}, "is not `works`"),
    ({"quantize": "fine"}, "is not `works`"),
])
def test_a_malformed_cell_is_named(tmp_path, cell, why):
    import yaml
    raw = yaml.safe_load(family_table.MATRIX_FILE.read_text())
    raw["families"]["llama"]["cells"]["original"] = cell
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(family_table.MatrixError, match=re.escape(why)) as e:
        family_table.load(path)
    assert "llama/original" in str(e.value)


# --- slow: the real matrix, one test per family ---

FAMILY_NAMES = list(MATRIX.families)


@pytest.mark.extended
@pytest.mark.slow
@sweeps
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_quantize_outcome_is_the_expected_one(quantized, family):
    """Works (reloaded in transformers, finite logits; suspect only where the
    matrix says so, for its reason) or a one-line answer with exit 2
    containing the expected phrase; never a failure (exit 1)."""
    expected = MATRIX.families[family]
    problems = []
    for recipe in MATRIX.recipes:
        cell, expect = quantized["cells"][family, recipe], expected.expect(recipe, QUANTIZE)
        if expect.kind in (WORKS, SUSPECT):
            problems += _works_problems(cell, expected.architecture) \
                or _suspect_problems(cell, expect, expected.architecture)
        elif cell.quantize != REFUSED or expect.phrase(expected.architecture) not in cell.error \
                or "\n" in cell.error.strip():
            problems.append(f"{family}/{recipe}: expected a one-line answer (exit 2) containing "
                            f"{expect.phrase(expected.architecture)!r}; got {cell.text(QUANTIZE)}")
    _fail_with_matrix(problems)


def _suspect_problems(cell: Cell, expect: family_table.Expect, architecture: str) -> list[str]:
    """A `works` artifact is not marked suspect; a `suspect` one is, for the expected reason."""
    where = f"{cell.family}/{cell.recipe}"
    suspect = json.loads((cell.artifact / "manifest.json").read_text()).get("suspect")
    if expect.kind == WORKS:
        return [f"{where}: expected to work; quantize's sanity gate marked it suspect: {suspect['reason']}"] \
            if suspect else []
    phrase = expect.phrase(architecture)
    if not suspect or phrase not in suspect["reason"]:
        return [f"{where}: expected manifest.json's `suspect` saying {phrase!r}; got {suspect}"]
    return []


def _works_problems(cell: Cell, architecture: str) -> list[str]:
    where = f"{cell.family}/{cell.recipe}"
    if cell.quantize != WORKS:
        return [f"{where}: expected to work; got {cell.text(QUANTIZE)}"]
    manifest = json.loads((cell.artifact / "manifest.json").read_text())
    checks = manifest.get("checks") or {}
    wanted = {"verified_by": "reload", "reloads_in_transformers": True, "logits_finite": True}
    problems = [f"{where}: manifest checks {checks} lack {wanted}"] \
        if any(checks.get(key) != value for key, value in wanted.items()) else []
    if manifest["model"]["architecture"] != architecture:
        problems.append(f"{where}: architecture {manifest['model']['architecture']}, the matrix says {architecture}")
    return problems


@pytest.mark.extended
@pytest.mark.slow
@sweeps
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_transformers_serves_every_artifact(quantized, hf_served, family):
    problems = [f"{family}/{cell.recipe} on hf: {cell.engines['hf']}" for cell in built(quantized)
                if cell.family == family and cell.engines["hf"] != WORKS]
    _fail_with_matrix(problems)


@pytest.mark.slow
@sweeps
@pytest.mark.needs_vllm
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_vllm_is_refused_where_the_capability_layer_says_so(quantized, vllm_verdicts, vllm_refused, family):
    """The capability layer's verdict agrees with the matrix; where it
    refuses, an evaluate sweep records `unsupported` rows with its reason and
    starts no engine (alone, the same answer is one line: the test below)."""
    expected, problems = MATRIX.families[family], []
    for cell in (c for c in built(quantized) if c.family == family):
        verdict, expect = vllm_verdicts[cell.artifact], expected.expect(cell.recipe, "vllm")
        where = f"{family}/{cell.recipe} on vllm"
        if expect is None or (expect.kind == WORKS and not verdict):
            problems.append(f"{where}: the capability layer refuses ({verdict.reason}); the matrix expects "
                            f"{expect.kind if expect else 'no artifact'}")
        elif not verdict and expect.kind != WORKS and expect.phrase(expected.architecture) not in verdict.reason:
            problems.append(f"{where}: refused ({verdict.reason}) without {expect.phrase(expected.architecture)!r}")
        if not verdict:
            rows, failure = vllm_refused[cell.artifact]
            if failure or not rows or any(r.status != "unsupported" or r.reason != verdict.reason for r in rows) \
                    or any(r.engine_startup_s for r in rows):
                problems.append(f"{where}: expected `unsupported` rows saying {verdict.reason!r}; "
                                f"got {cell.engines['vllm']}")
    _fail_with_matrix(problems)


@pytest.mark.extended
@pytest.mark.slow
@sweeps
@pytest.mark.needs_vllm
def test_vllm_refusal_alone_is_one_line(quantized, vllm_verdicts, vllm_refused):
    """`python -m evaluate engine=vllm` on one artifact the capability layer
    refuses: one line with its reason, exit 2, no engine started."""
    refused = [c for c in built(quantized) if not vllm_verdicts[c.artifact]]
    if not refused:
        pytest.skip("the capability layer refuses no artifact of the matrix on this machine")
    cell = refused[0]
    root = quantized["root"]
    proc = run_cli("evaluate", f"model={cell.artifact}", "engine=vllm", f"scenario={_scenario(root)}", *EVALUATE,
                   f"results_dir={root / 'results-vllm-alone'}", cwd=root)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines and lines[-1].startswith("error: "), tail(proc)
    assert vllm_verdicts[cell.artifact].reason in lines[-1] and "Traceback" not in proc.stderr, tail(proc)


@pytest.mark.slow
@sweeps
@pytest.mark.needs_vllm
@pytest.mark.parametrize("family, recipe", vllm_cells(), ids=[f"{f}-{r}" for f, r in vllm_cells()])
def test_vllm_serves_where_the_capability_layer_allows(quantized, vllm_verdicts, vllm_served, family, recipe):
    cell = quantized["cells"][family, recipe]
    if not cell.artifact:
        _fail_with_matrix([f"{family}/{recipe}: quantize built no artifact to serve ({cell.text(QUANTIZE)})"])
    if not vllm_verdicts[cell.artifact]:
        pytest.skip(f"the capability layer refuses vLLM here: {vllm_verdicts[cell.artifact].reason}")
    expect = MATRIX.families[family].expect(recipe, "vllm")
    if expect.kind == REFUSED:  # the capability layer lets it start; vLLM itself cannot
        _fail_with_matrix(_failed_start_problems(cell, expect.phrase(MATRIX.families[family].architecture),
                                                 *vllm_served[cell.artifact]))
    elif cell.engines["vllm"] != WORKS:
        _fail_with_matrix([f"{family}/{recipe} on vllm: {cell.engines['vllm']}"])


def _failed_start_problems(cell: Cell, phrase: str, rows, failure) -> list[str]:
    """A refusal by a failed start: the job's one-line answer (exit 2) and every
    row `failed`, both containing the phrase."""
    answer = (failure or {}).get("error", "")
    if failure and failure["exit_code"] == 2 and phrase in answer and "\n" not in answer.strip() and rows \
            and all(r.status == "failed" and phrase in (r.reason or "") for r in rows):
        return []
    return [f"{cell.family}/{cell.recipe} on vllm: expected a failed start in one line (exit 2) and `failed` "
            f"rows containing {phrase!r}; got {cell.engines['vllm']}"]
