"""Shared fixtures for the quantize-stage tests.

Every test drives the real thing: `python -m quantize ...` in a subprocess
(real Hydra CLI, real llm-compressor), run from a temp dir so Hydra's logs/
land there, on a tiny random Llama built once per session."""
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

# The suite runs 3 workers on 2 cores, each starting processes with torch's
# OpenMP threads: threads that spin while they wait for a core held by another
# process wasted ~45 % of the CPU (3 quantize sweeps side by side: 115 s of CPU,
# 61 s wall; passive: 63 s, 35 s). Set before torch loads, here and in every
# process the tests start; it changes no result, only how threads wait.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from quantize.common import atomic, recipe_choices
from quantize.common.tiny_model import build_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
RECIPES_DIR = ROOT / "recipes"
TINY_NAME = "tiny-llama"  # dir name of the tiny model = `model.name` (basename)
# Small calibration keeps each quantize run ~10 s on the tiny model.
NUM_SAMPLES, MAX_SEQ_LEN = 8, 64
SMALL_CALIB = (f"calibration.num_samples={NUM_SAMPLES}", f"calibration.max_seq_len={MAX_SEQ_LEN}")
QUANTIZE_TIMEOUT_S = 900  # generous: the machine is shared; this is a hang guard, not a speed check


@pytest.fixture(autouse=True)
def fresh_machine_facts():
    """machine.detect() is cached for the process; a test that patches what it
    reads (a fake GPU, no NUMA files) must not leave its answer to the next."""
    yield
    machine = sys.modules.get("quantize.common.machine")
    if machine is not None:
        machine.detect.cache_clear()


def w4_rtn_recipe(group_size: int) -> str:
    """An llm-compressor recipe a user might write: int4 weight-only RTN."""
    return f"""\
# A user recipe: int4 weight-only RTN, symmetric, group size {group_size}.
quant_stage:
  quant_modifiers:
    QuantizationModifier:
      ignore: [lm_head]
      config_groups:
        group_0:
          targets: [Linear]
          weights: {{num_bits: 4, type: int, symmetric: true, strategy: group, group_size: {group_size}}}
"""


def shipped_recipes() -> list[str]:
    """Every `recipe=<name>` option, as the CLI finds them (presets in
    conf/recipe/ and YAML files in recipes/), in name order."""
    return [choice.name for choice in recipe_choices.available()]


def recipe_source(name: str) -> Path:
    """The llm-compressor recipe file the option `recipe=<name>` applies."""
    return Path(recipe_choices.find(name).path)


def sparse_recipes() -> list[str]:
    return [r for r in shipped_recipes() if "sparse" in r]


# On PYTHONPATH, a folder of tests/hosts/ makes processes see another kind of
# machine or fault (see its sitecustomize.py): avx2_host, an AVX2-only CPU;
# avx512_no_bf16_host, AVX-512 + VNNI without AVX512-BF16 or AMX;
# held_oneshot, a quantize that waits inside oneshot for a signal.
HOSTS = Path(__file__).resolve().parent / "hosts"


def quantize_env(extra: dict | None = None, host: str | None = None) -> dict:
    """The environment of a quantize/evaluate process under test, with `extra`
    and, given `host`, that folder of tests/hosts/ first on its PYTHONPATH."""
    env = dict(os.environ)
    # Import the checkout under test even if the editable install points elsewhere.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOSTS / host) if host else None, str(ROOT),
                                                    str(ROOT / "quantize" / "plugins"), env.get("PYTHONPATH")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.update(extra or {})
    return env


def quantize_cmd(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "quantize", *overrides]


def run_quantize(*overrides: str, cwd: Path, timeout: float = QUANTIZE_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run the real CLI; returns the finished process (never raises on failure)."""
    return subprocess.run(quantize_cmd(*overrides), cwd=cwd, env=quantize_env(),
                          capture_output=True, text=True, timeout=timeout)


def run_cli(module: str, *args: str, cwd: Path, timeout: float = 900, avx2_host: bool = False,
            host: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m <module> args` (quantize or evaluate) with a small vLLM KV
    cache, optionally as on another kind of host (`host`: a folder of
    tests/hosts/; `avx2_host=True` is host="avx2_host") and extra `env`; returns the
    finished process (never raises on failure)."""
    env = quantize_env({"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}, host="avx2_host" if avx2_host else host)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def serve_verdict(model_dir: Path, engine: str = "vllm"):
    """What the capability layer says of serving `model_dir` with `engine`
    on this machine: tests that need a kernel ask it, never the CPU's name."""
    from evaluate import engines
    from evaluate.capabilities import decide
    from evaluate.target import from_path
    return decide(engine, from_path(model_dir).format, engines.get(engine).machine())


def tail(proc: subprocess.CompletedProcess, n: int = 25) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-n:])


def check_ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"quantize exited {proc.returncode}:\n{tail(proc)}"
    return proc


def table_cells(markdown: str) -> dict[tuple[str, str], str]:
    """{(format label, engine): cell text} from the capability table
    `python -m evaluate.capabilities` prints (its header, then the rows; the
    |---| line does not start with "| ")."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in markdown.splitlines() if line.startswith("| ")]
    names = rows[0][1:]
    return {(row[0], engine): cell for row in rows[1:] for engine, cell in zip(names, row[1:])}


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def sha256_files_by_hand(paths) -> str:
    """The manifest's weight-hash definition (name + NUL + content of every
    file, in sorted path order), recomputed here independently of quantize."""
    h = hashlib.sha256()
    for p in sorted(Path(p) for p in paths):
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class Artifact:
    recipe: str
    dir: Path
    proc: subprocess.CompletedProcess

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    @property
    def manifest(self) -> dict:
        return json.loads(self.manifest_path.read_text())


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    from quantize.common.assets import SMOLLM2_DIR, ensure_default_model
    if not (SMOLLM2_DIR / "config.json").is_file():
        ensure_default_model()
    return SMOLLM2_DIR


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    """A folder all pytest-xdist workers of this run share (without xdist,
    the session's own temp dir): what one worker builds, the others reuse."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def shared_lock(shared_dir: Path, name: str):
    """One worker at a time builds `name` in the shared folder."""
    with open(shared_dir / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also on kill
        yield


@pytest.fixture
def recipes_dir_lock(shared_dir):
    """Held by a test that adds a file to recipes/ and by one that lists its
    options: tests in other workers run at the same time."""
    with shared_lock(shared_dir, "recipes-dir"):
        yield


@pytest.fixture(scope="session")
def tiny_model(shared_dir, tokenizer_dir) -> Path:
    """A 2-layer random Llama (hidden 128) with SmolLM2's tokenizer, built once."""
    path = shared_dir / "models" / TINY_NAME
    with shared_lock(shared_dir, "tiny-model"):
        if not (path / "config.json").is_file():
            with atomic.staging_dir(path) as tmp:  # a killed build never takes the model's name
                build_tiny_llama(tmp, tokenizer_dir)
    return path


@pytest.fixture(scope="session")
def session_workdir(tmp_path_factory) -> Path:
    """cwd for the shared builds (Hydra writes logs/ there)."""
    return tmp_path_factory.mktemp("quantize-cwd")


@pytest.fixture(scope="session")
def session_artifacts_dir(shared_dir) -> Path:
    return shared_dir / "artifacts"


@pytest.fixture(scope="session")
def build_artifact(tiny_model, session_workdir, session_artifacts_dir, shared_dir):
    """`build_artifact(recipe)` quantizes the tiny model with a shipped recipe
    (small Austen calibration) once per test run and returns the Artifact;
    later calls, from any test or xdist worker, reuse it. The first call
    builds every shipped recipe in one `-m` sweep, as `make run` does (one
    process: the imports are paid once). A failed build is remembered too
    (its output is kept in the shared folder), so it fails every test that
    needs it without being retried."""
    outputs = shared_dir / "artifact-builds"

    def load(recipe: str) -> Artifact | None:
        try:
            saved = json.loads((outputs / f"{recipe}.json").read_text())
        except OSError:
            return None
        return Artifact(recipe, session_artifacts_dir / TINY_NAME / recipe,
                        subprocess.CompletedProcess(**saved))

    def build(recipe: str) -> Artifact:
        with shared_lock(shared_dir, "artifacts"):
            if load(recipe) is None:
                with shared_lock(shared_dir, "recipes-dir"):  # not while a test's own recipe is in recipes/
                    shipped = shipped_recipes()
                batch = [r for r in shipped if load(r) is None] if recipe in shipped else [recipe]
                proc = run_quantize("-m", f"recipe={','.join(batch)}", f"model={tiny_model}", *SMALL_CALIB,
                                    f"artifacts_dir={session_artifacts_dir}", cwd=session_workdir)
                for name in batch:
                    # the sweep goes on past a failed job: each artifact's own manifest says whether it was built
                    built = (session_artifacts_dir / TINY_NAME / name / "manifest.json").is_file()
                    saved = {"args": proc.args, "returncode": 0 if built else (proc.returncode or 1),
                             "stdout": proc.stdout, "stderr": proc.stderr}
                    atomic.write_json(outputs / f"{name}.json", saved)
        art = load(recipe)
        check_ok(art.proc)
        return art

    return build


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A fresh cwd for one quantize run."""
    d = tmp_path / "cwd"
    d.mkdir()
    return d


@functools.cache
def vllm_missing() -> str | None:
    """Why this machine cannot import vLLM, or None where it can (a spec
    lookup: importing vLLM takes seconds). A CUDA machine with only torch and
    transformers has none; tests/hosts/no_vllm_host emulates one."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed here (bash scripts/setup.sh installs the engine of this machine's target)"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_vllm: imports or starts vLLM; skipped, saying why, where vLLM "
                                       "is not installed")


def recorded_run() -> dict:
    """The last recorded full run (scripts/suite_budget.py record): each
    test file's time, and the tests that took long enough to count as slow."""
    try:
        return json.loads(Path(os.environ.get("QUANTBENCH_SUITE_TIMINGS") or ROOT / "tests" / "suite_timings.json")
                          .read_text())
    except (OSError, ValueError):
        return {}


# Cases of a parametrized test that drive its path again with other values:
# `make test` runs the test's other cases, `make test-extended` these too
# (the whole-test equivalent is @pytest.mark.extended on the test).
EXTENDED_CASES = {
    "tests/evaluate/serving/test_run.py::test_bad_input_is_one_line_and_writes_nothing[args1-pass engine.allow_remote=true]",
    "tests/evaluate/serving/test_run.py::test_bad_input_is_one_line_and_writes_nothing[args2-pass engine.base_url=]",
    "tests/evaluate/serving/test_run.py::test_bad_input_is_one_line_and_writes_nothing"
    "[args3-load=synchronous needs a server engine: pass engine=vllm_server]",
    "tests/evaluate/engines/test_lifeline.py::test_kill_9_of_evaluate_leaves_no_engine_process[spawn]",
    "tests/evaluate/test_bad_inputs.py::test_unknown_engine_arg_fails_before_the_engine"
    "[args1-engine.args.no_such_knob is not an argument of engine=vllm]",
    "tests/evaluate/test_bad_inputs.py::test_unknown_engine_arg_fails_before_the_engine"
    "[args2-it takes device, dtype, max_model_len]",
    "tests/evaluate/test_bad_inputs.py::test_evaluate_rejects_a_corrupt_manifest[[]-not a quantbench manifest]",
    "tests/evaluate/test_sweeps.py::test_plugin_launchers_run_the_sweep[local_submitit]",
    "tests/quantize/test_integrity.py::test_refused_in_one_line_with_nothing_written[ignore_covers_every_linear]",
    "tests/quantize/test_integrity.py::test_refused_in_one_line_with_nothing_written[targets_match_no_module]",
    "tests/quantize/test_integrity.py::test_refused_in_one_line_with_nothing_written[untied_base_checkpoint_lacks_lm_head]",
    "tests/evaluate/test_bounds.py::test_a_scenario_too_long_names_a_fix_within_the_models_positions[past_max_model_len]",
    "tests/evaluate/test_bounds.py::test_work_past_a_bound_is_one_line_naming_the_override[batch_tokens]",
    "tests/quantize/test_smoothquant_check.py::test_the_cli_refuses_an_unregistered_family_in_one_line_before_calibration"
    "[olmoe-OlmoeForCausalLM]",
    "tests/quantize/test_errors.py::test_bad_input_fails_with_one_line[calibration_too_small]",
    "tests/quantize/test_errors.py::test_bad_input_fails_with_one_line[bad_modifier_argument]",
    "tests/evaluate/test_lmeval.py::test_bad_lm_eval_config_fails_before_anything_runs[args1-lm_eval.tasks is empty]",
    "tests/evaluate/test_lmeval.py::test_bad_lm_eval_config_fails_before_anything_runs[args2-is not a folder]",
}


def pytest_collection_modifyitems(config, items):
    """Tests marked needs_vllm skip, saying why, where vLLM is not installed.
    A test that took long in the last recorded run, or that needs the
    session's artifacts (their build takes minutes), is marked slow, so
    `make test-fast` stays fast. Files start longest first, by their time in
    the last recorded run; a file not recorded yet starts before them if it
    has slow tests, after them if not. Each file's tests keep their order.
    Under xdist (`--dist loadfile --no-loadscope-reorder`, see the Makefile) a
    worker takes a whole file at a time in this order, so the minutes-long
    files start early and the many short ones fill the end, instead of one
    long file ending the run on one worker while the others idle."""
    reason = vllm_missing()
    if reason:
        for item in items:
            if item.get_closest_marker("needs_vllm"):
                item.add_marker(pytest.mark.skip(reason=reason))
    recorded = recorded_run()
    took_long = set(recorded.get("slow_tests", ()))
    for item in items:
        # a test of the session's artifacts waits for their build (every shipped recipe: minutes)
        needs_build = "build_artifact" in getattr(item, "fixturenames", ())
        if (item.nodeid in took_long or needs_build) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if item.nodeid in EXTENDED_CASES:
            item.add_marker(pytest.mark.extended)
    has_slow = {item.path for item in items if item.get_closest_marker("slow")}
    seconds = recorded.get("files", {})

    def start_order(item) -> tuple:
        took = seconds.get(Path(os.path.relpath(item.path, ROOT)).as_posix())
        if took is None:
            return (0 if item.path in has_slow else 2, 0.0)
        return (1, -took)
    items.sort(key=start_order)  # stable: a file's tests keep their order
