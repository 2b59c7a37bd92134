"""The engine interface (evaluate.engines.base.Engine): registration by
config, the engine environment scoped to an engine's lifetime, and a new
engine as one module + one YAML (tests/evaluate/engines/: a fake-clock engine) run
through the real `python -m evaluate`."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import quantize_env, tail
from evaluate import engines, results
from evaluate.engines import Engine
from evaluate.hardware import detected
from quantize.common.errors import UserError
from quantize.common.paths import PROJECT_ROOT
from quantize.common.provenance import hardware, versions

DUMMY_DIR = Path(__file__).resolve().parent
DUMMY_YAML = DUMMY_DIR / "dummy.yaml"


@pytest.fixture
def dummy(monkeypatch):
    """The dummy engine module, imported as `_target_: dummy_engine.DummyEngine` would."""
    monkeypatch.syspath_prepend(str(DUMMY_DIR))
    import dummy_engine
    return dummy_engine


@pytest.fixture
def clean_env(monkeypatch):
    """No test variable, and none of vLLM's, set before the test."""
    for key in ("QUANTBENCH_DUMMY_MODE", "QUANTBENCH_DUMMY_EXTRA", "QB_TEST_NEW", "QB_TEST_NONE",
                "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
                "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_RPC_BASE_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("QB_TEST_KEEP", "old")


@pytest.fixture
def cpu_host(monkeypatch):
    """This host's facts without its GPUs, if any: vLLM-CPU's rules (its KV
    cache size is quantbench's to set) on any machine."""
    from dataclasses import replace

    from quantize.common import machine
    facts = replace(machine.detect(), cuda=(), gpu_names=())
    monkeypatch.setattr(machine, "detect", lambda: facts)


@pytest.fixture
def cuda_host(monkeypatch):
    """A simulated CUDA machine (one sm90 GPU)."""
    from quantize.common import machine
    facts = machine.Machine(arch="x86_64", cuda=((9, 0),), gpu_names=("NVIDIA H200",))
    monkeypatch.setattr(machine, "detect", lambda: facts)


def start(cls, env, **args):
    return cls(None, {"dtype": "bfloat16", **args}, env, max_model_len=64)


# ---------------------------------------------------------------- environment

def test_engine_environment_lasts_its_lifetime_and_is_restored_on_close(dummy, clean_env):
    before = dict(os.environ)
    engine = start(dummy.DummyEngine, {"QUANTBENCH_DUMMY_MODE": "a", "QB_TEST_KEEP": "new", "QB_TEST_NEW": 1,
                                       "QB_TEST_NONE": None})
    assert os.environ["QB_TEST_KEEP"] == "new" and os.environ["QB_TEST_NEW"] == "1"
    assert "QB_TEST_NONE" not in os.environ  # None: left as it was
    assert engine.env_at_start["QUANTBENCH_DUMMY_MODE"] == "a"
    # the engine's speed variables and every variable the config sets, as set
    assert engine.describe()["engine_env"] == {"QUANTBENCH_DUMMY_MODE": "a", "QB_TEST_KEEP": "new", "QB_TEST_NEW": "1"}
    engine.close()
    assert dict(os.environ) == before
    engine.close()  # a second close changes nothing
    assert dict(os.environ) == before


def test_two_engines_in_one_process_do_not_inherit_each_others_environment(dummy, clean_env):
    """As in a Hydra `-m` sweep with the basic launcher: jobs share a process."""
    with start(dummy.DummyEngine, {"QUANTBENCH_DUMMY_MODE": "a", "QUANTBENCH_DUMMY_EXTRA": "1"}) as first:
        assert first.describe()["engine_env"] == {"QUANTBENCH_DUMMY_MODE": "a", "QUANTBENCH_DUMMY_EXTRA": "1"}
    with start(dummy.DummyEngine, {"QUANTBENCH_DUMMY_MODE": "b"}) as second:
        assert second.describe()["engine_env"] == {"QUANTBENCH_DUMMY_MODE": "b"}
    assert "QUANTBENCH_DUMMY_MODE" not in os.environ


def test_rows_record_what_the_engine_set_while_starting(dummy, clean_env, monkeypatch):
    """As vLLM-CPU sets LD_PRELOAD for its processes during start-up: the first
    engine of a process records it too, not only the later ones that find it set."""
    class SetsItsOwn(dummy.DummyEngine):
        def start(self, *args):
            super().start(*args)
            os.environ["QUANTBENCH_DUMMY_EXTRA"] = "set-by-engine"

    monkeypatch.setenv("QUANTBENCH_DUMMY_EXTRA", "")
    monkeypatch.delenv("QUANTBENCH_DUMMY_EXTRA")  # absent now, and again after the test
    with start(SetsItsOwn, {"QUANTBENCH_DUMMY_MODE": "a"}) as first:
        assert first.env_at_start["QUANTBENCH_DUMMY_EXTRA"] is None
        assert first.describe()["engine_env"] == {"QUANTBENCH_DUMMY_MODE": "a", "QUANTBENCH_DUMMY_EXTRA": "set-by-engine"}
    with start(SetsItsOwn, {"QUANTBENCH_DUMMY_MODE": "a"}) as second:
        assert second.describe()["engine_env"] == first.describe()["engine_env"]



def test_a_speed_variable_the_engine_set_while_running_ends_with_it(dummy, clean_env):
    """vLLM-CPU sets LD_PRELOAD in os.environ as it builds its config: it leaked
    into every later engine and subprocess of the process."""
    class SetsItsOwn(dummy.DummyEngine):
        def start(self, *args):
            super().start(*args)
            os.environ["QUANTBENCH_DUMMY_EXTRA"] = "set-by-engine"

    with start(SetsItsOwn, {"QUANTBENCH_DUMMY_MODE": "a"}) as engine:
        assert engine.describe()["engine_env"]["QUANTBENCH_DUMMY_EXTRA"] == "set-by-engine"
    assert "QUANTBENCH_DUMMY_EXTRA" not in os.environ

def test_a_failed_start_restores_the_environment(dummy, clean_env):
    class Broken(dummy.DummyEngine):
        def start(self, *args):
            raise RuntimeError("no model here")

    before = dict(os.environ)
    with pytest.raises(RuntimeError, match="no model here"):
        start(Broken, {"QUANTBENCH_DUMMY_MODE": "a", "QB_TEST_KEEP": "new"})
    assert dict(os.environ) == before


def test_vllm_environment_is_scoped_and_records_its_speed_variables(clean_env, cpu_host):
    """vLLM's environment (and its cache folders) without starting vLLM: what
    engines and the lm-eval subprocess run in."""
    from evaluate.engines.vllm import VllmEngine
    conf = engines.config("vllm")
    before = dict(os.environ)
    with VllmEngine.environment(conf["env"]) as recorded:
        assert os.environ["VLLM_CACHE_ROOT"] and os.environ["TORCHINDUCTOR_CACHE_DIR"]
        # `auto` not sized to a job (lm-eval, the serving load profiles): vLLM-CPU's usual 4 GiB
        assert conf["env"]["VLLM_CPU_KVCACHE_SPACE"] == "auto" and recorded["VLLM_CPU_KVCACHE_SPACE"] == "4"
        reserved = "0" if (os.cpu_count() or 1) <= 4 else None
        assert recorded.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == reserved
        assert "VLLM_CACHE_ROOT" not in recorded  # a location, not a speed setting
        rpc = Path(os.environ["VLLM_RPC_BASE_PATH"])  # a private folder for vLLM's socket files
        assert rpc.is_dir() and "VLLM_RPC_BASE_PATH" not in recorded
        (rpc / "left-behind").write_text("")  # what a stopped vLLM leaves there
    assert dict(os.environ) == before
    assert not rpc.exists()


def test_vllm_socket_folder_is_the_users_if_set(clean_env, monkeypatch, tmp_path):
    from evaluate.engines import base
    from evaluate.engines.vllm import VllmEngine
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))
    monkeypatch.setattr(base, "LAUNCH_ENV", base.LAUNCH_ENV | {"VLLM_RPC_BASE_PATH"})
    with VllmEngine.environment({}):
        assert os.environ["VLLM_RPC_BASE_PATH"] == str(tmp_path)
    assert tmp_path.is_dir()


def test_vllm_socket_folder_is_left_to_vllm_where_the_temp_dir_is_too_long(clean_env, monkeypatch, tmp_path):
    """A socket's path holds 107 bytes: under a deep temp dir vLLM keeps its own default."""
    from evaluate.engines.vllm import VllmEngine
    deep = tmp_path / ("d" * 80)
    deep.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(deep))
    with VllmEngine.environment({}):
        assert "VLLM_RPC_BASE_PATH" not in os.environ


def test_compile_cache_goes_to_the_project_cache_unless_the_user_chose_one(clean_env, monkeypatch):
    """Inductor writes its /tmp default into os.environ the first time anything
    asks for its cache folder (importing vLLM does): that is not the user's
    choice, so the project's cache still serves the engine. A folder set when
    the process started is the user's and wins."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from evaluate.engines import base
    from evaluate.engines.vllm import VllmEngine
    from quantize.common.paths import CACHE_DIR
    monkeypatch.setattr(base, "LAUNCH_ENV", base.LAUNCH_ENV - {"TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT"})
    library_default = cache_dir()  # as during vLLM's import: sets os.environ itself
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == library_default != str(CACHE_DIR / "torchinductor")
    env = VllmEngine.prepare_env({})
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(CACHE_DIR / "torchinductor")
    assert env["VLLM_CACHE_ROOT"] == str(CACHE_DIR / "vllm")
    # one chosen in the engine config (engine.env.X=...) is the user's too
    assert VllmEngine.prepare_env({"TORCHINDUCTOR_CACHE_DIR": "/scratch/c"})["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/c"
    monkeypatch.setattr(base, "LAUNCH_ENV", base.LAUNCH_ENV | {"TORCHINDUCTOR_CACHE_DIR"})
    assert "TORCHINDUCTOR_CACHE_DIR" not in VllmEngine.prepare_env({})  # left as the user set it


# ---------------------------------------------------------------- registration

def test_every_shipped_engine_config_names_its_implementation():
    assert engines.known() == ["hf", "vllm"]
    for name in engines.known():
        cls = engines.get(name)
        assert issubclass(cls, Engine) and cls.name == name
        assert engines.get(engines.config(name)) is cls


def test_engine_is_found_from_a_config_outside_conf(dummy):
    cfg = yaml.safe_load(DUMMY_YAML.read_text())
    assert engines.get(cfg) is dummy.DummyEngine
    assert "_target_" not in engines.identity(cfg) and engines.identity(cfg)["name"] == "dummy"
    typed = engines.build(cfg)
    assert typed.engine is dummy.DummyEngine and typed.args["token_latency_ms"] == 8
    assert engines.identity(typed) == engines.identity(cfg)  # the same setup id, typed or not


def test_engine_config_is_typed_with_the_engines_own_keys_as_settings():
    typed = engines.build(engines.config("openai"))
    assert typed.name == "openai" and typed.engine is engines.get("openai")
    assert typed.settings == {"base_url": None, "model": None, "allow_remote": False, "stall_timeout_s": 30,
                              "retries": 2, "retry_backoff_s": 1}
    assert engines.build(engines.config("vllm_server")).settings["host"] == "127.0.0.1"


def test_a_config_that_still_says_impl_works_with_one_warning_naming_target(caplog):
    legacy = {k: v for k, v in engines.config("hf").items() if k != "_target_"}
    legacy.update(name="hf_legacy", impl="evaluate.engines.hf.HfEngine")
    with caplog.at_level("WARNING", logger="quantbench.evaluate"):
        assert engines.get(legacy) is engines.get("hf")
        assert engines.build(legacy).engine is engines.get("hf")
    warnings = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert warnings == ["conf/engine/hf_legacy.yaml: `impl:` is deprecated and stops working in the next release; "
                        "rename it to `_target_:`"]
    # the setup id of a legacy config is the one it had: neither key enters it
    current = {**legacy, "name": "hf"}
    current["_target_"] = current.pop("impl")
    assert engines.identity({**legacy, "name": "hf"}) == engines.identity(current)


def test_speed_variables_exported_in_the_shell_enter_the_setup_identity(clean_env, monkeypatch):
    """A rerun with OMP_NUM_THREADS (or an ISA cap) exported differently is
    another setup: its rows must not be skipped as done or averaged with the
    old ones. Variables set later (by libraries or engines) do not count, nor
    a scheduler's GPU assignment."""
    from evaluate.engines import base
    from evaluate.engines.vllm import VllmEngine
    cfg = engines.config("vllm")
    # a shell that exported none of them (the suite's own may have: device_check.sh runs it with OMP_NUM_THREADS=2)
    monkeypatch.setattr(base, "LAUNCH_ENV", base.LAUNCH_ENV - {"OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY",
                                                               "CUDA_VISIBLE_DEVICES", "QB_TEST_NEW"})
    plain = engines.identity(cfg, VllmEngine)
    assert "shell_env" not in plain  # ids of setups without such variables stay what they were
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("QB_TEST_NEW", "x")  # not a speed variable of vLLM's
    assert engines.identity(cfg, VllmEngine) == plain  # set after launch: a library's, not the user's
    monkeypatch.setattr(base, "LAUNCH_ENV", base.LAUNCH_ENV | {"OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY",
                                                               "CUDA_VISIBLE_DEVICES", "QB_TEST_NEW"})
    shell = engines.identity(cfg, VllmEngine)
    assert shell["shell_env"] == {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2"}
    # fixed machine facts: hardware() here would be the first CUDA query of this process, made
    # with CUDA_VISIBLE_DEVICES=3, and torch would see no GPU for the rest of it (measured on an H200)
    where = {"versions": {"torch": "2.11.0"}, "hardware": {"accelerators": ["NVIDIA H200"]}}
    assert results.setup_id(shell, **where) != results.setup_id(plain, **where)
    # one the engine config sets is already in its `env`: not counted twice
    configured = {**cfg, "env": {**cfg["env"], "OMP_NUM_THREADS": "2"}}
    assert engines.identity(configured, VllmEngine)["shell_env"] == {"ATEN_CPU_CAPABILITY": "avx2"}


def identity_without_and_with(engine_class, name: str, exported: dict, monkeypatch) -> tuple[dict, dict]:
    """engine `name`'s setup identity from a shell that exported none of
    `exported`, then from one that exported them all at launch."""
    from evaluate.engines import base
    cfg = engines.config(name)
    monkeypatch.setattr(base, "LAUNCH_ENV", base.LAUNCH_ENV - set(exported))
    plain = engines.identity(cfg, engine_class)
    for key, value in exported.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(base, "LAUNCH_ENV", base.LAUNCH_ENV | set(exported))
    return plain, engines.identity(cfg, engine_class)


def test_threads_exported_in_the_shell_enter_the_setup_identity_of_engine_hf(clean_env, monkeypatch):
    """transformers' speed follows OMP_NUM_THREADS (and MKL_NUM_THREADS) as vLLM's
    does: a 1-thread rerun was skipped as done and averaged with 2-thread rows."""
    from evaluate.engines.hf import HfEngine
    threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    plain, exported = identity_without_and_with(HfEngine, "hf", threads, monkeypatch)
    assert exported["shell_env"] == threads != plain.get("shell_env")
    assert results.setup_id(exported, {}, {}) != results.setup_id(plain, {}, {})
    assert threads.items() <= HfEngine.recorded_env({}).items()  # and its rows say so


def test_a_shell_value_the_engine_leaves_standing_enters_the_setup_identity(clean_env, monkeypatch):
    """VLLM_CPU_KVCACHE_SPACE: auto yields to a value exported at launch, so that
    value is what runs: it was left out of the id because the config names the
    key, and a rerun with another export was skipped as done."""
    from evaluate.engines import base
    from evaluate.engines.vllm import KV_SPACE, VllmEngine
    cfg = engines.config("vllm")
    assert cfg["env"][KV_SPACE] == "auto"
    monkeypatch.setattr(base, "LAUNCH_ENV", base.LAUNCH_ENV | {KV_SPACE})
    ids = {}
    for exported in ("4", "40"):
        monkeypatch.setenv(KV_SPACE, exported)
        assert engines.identity(cfg, VllmEngine)["shell_env"] == {KV_SPACE: exported}
        ids[exported] = results.setup_id(engines.identity(cfg, VllmEngine), {}, {})
    assert ids["4"] != ids["40"]
    pinned = {**cfg, "env": {**cfg["env"], KV_SPACE: 8}}   # a value the config sets wins: the shell's is not run
    assert "shell_env" not in engines.identity(pinned, VllmEngine)


def test_cudas_sampler_and_gemm_switches_exported_in_the_shell_are_recorded(clean_env, monkeypatch):
    """scripts/device_check.sh exports VLLM_USE_FLASHINFER_SAMPLER=0 and VLLM_USE_DEEP_GEMM=0 (the
    bundle carries neither library): rows measured so must say it, and be another setup."""
    from evaluate.engines.vllm import VllmEngine
    switches = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_USE_DEEP_GEMM": "0"}
    plain, exported = identity_without_and_with(VllmEngine, "vllm", switches, monkeypatch)
    assert exported["shell_env"] == switches != plain.get("shell_env")
    assert switches.items() <= VllmEngine.recorded_env({}).items()


@pytest.mark.parametrize("cfg, expect", [
    ("no_such_engine", "unknown engine 'no_such_engine'; choose one of ['hf', 'openai', 'vllm', 'vllm_server'] (conf/engine/)"),
    ({"name": "x"}, "conf/engine/x.yaml names no implementation; add `_target_: <module>.<Class>`"),
    ({"name": "x", "_target_": "no_such_module.Engine"}, "cannot import module 'no_such_module'"),
    ({"name": "x", "_target_": "evaluate.engines.vllm.NoSuchEngine"}, "evaluate.engines.vllm.NoSuchEngine does not exist"),
    ({"name": "x", "_target_": "evaluate.engines.vllm.SPEED_ENV"}, "is not a subclass of evaluate.engines.base.Engine"),
])
def test_a_bad_engine_config_is_one_line_naming_conf_engine(cfg, expect):
    with pytest.raises(UserError) as e:
        engines.get(cfg)
    assert expect in str(e.value) and "\n" not in str(e.value)
    assert "conf/engine/" in str(e.value)


@pytest.mark.needs_vllm
def test_engine_specific_settings_come_from_the_engine():
    from evaluate.engines.hf import HfEngine
    from evaluate.engines.vllm import VllmEngine
    assert VllmEngine.logprob_args(50) == {"max_logprobs": 50} and VllmEngine.logprob_args(20) == {}
    assert HfEngine.logprob_args(50) == {} and HfEngine.lm_eval_model({}) is None
    model = VllmEngine.lm_eval_model({"dtype": "bfloat16", "max_model_len": None, "seed": 0})
    assert model.name == "vllm"
    assert model.args == {"dtype": "bfloat16", "seed": 0, "trust_remote_code": False}
    assert VllmEngine.has_prompt_logprobs and HfEngine.has_prompt_logprobs


@pytest.mark.parametrize("path", ["evaluate/pipeline.py", "evaluate/lmeval.py", "evaluate/probe.py",
                                  "scripts/bench_harness_overhead.py"])
def test_callers_talk_to_engines_only_through_the_interface(path):
    source = (PROJECT_ROOT / path).read_text()
    assert not re.search(r"evaluate\.engines\.(vllm|hf)\b|import (vllm|transformers)\b", source)
    assert not re.search(r"""==\s*["'](vllm|hf)["']""", source)


# ---------------------------------------------------------------- one module + one YAML

def evaluate_with_dummy(*args, cwd: Path, host: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m evaluate engine=dummy ...` with the dummy's YAML on Hydra's
    search path (never in the checkout's conf/) and its module on PYTHONPATH;
    `host`: a folder whose sitecustomize emulates another machine (tests/hosts/cuda_host)."""
    search = cwd / "searchpath"
    (search / "engine").mkdir(parents=True, exist_ok=True)
    shutil.copy(DUMMY_YAML, search / "engine" / "dummy.yaml")
    env = quantize_env()
    env["PYTHONPATH"] = os.pathsep.join([*([str(host)] if host else []), str(DUMMY_DIR), env["PYTHONPATH"]])
    env.pop("QUANTBENCH_DUMMY_EXTRA", None)
    return subprocess.run([sys.executable, "-m", "evaluate", *args, "engine=dummy",
                           f"hydra.searchpath=[file://{search}]"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_new_engine_is_one_module_and_one_yaml(tiny_model, tmp_path):
    sys.path.insert(0, str(DUMMY_DIR))
    try:
        from dummy_engine import VERSION
    finally:
        sys.path.remove(str(DUMMY_DIR))
    res = tmp_path / "res"
    args = (f"model={tiny_model}", "accuracy=none", "scenario=interactive", "runs=2", f"results_dir={res}")
    out = evaluate_with_dummy(*args, cwd=tmp_path)
    assert out.returncode == 0, tail(out)
    rows = results.read(res)
    assert [(r.kind, r.status, r.run_index) for r in rows] == [("speed", "ok", 0), ("speed", "ok", 1)]
    conf = yaml.safe_load(DUMMY_YAML.read_text())
    for r in rows:
        assert r.engine == "dummy" and r.engine_version == VERSION and r.engine_startup_s == 0
        assert r.engine_env == {"QUANTBENCH_DUMMY_MODE": "fake-clock"}
        assert r.engine_args["token_latency_ms"] == 8 and r.engine_args["max_model_len"] == 128 + 64
        m = r.metrics  # the fake clock: 20 ms prefill, then 8 ms per token
        assert m["output_tokens"] == 64 and m["tpot_ms_mean"] == pytest.approx(8)
        assert m["ttft_ms_mean"] == pytest.approx(28) and m["latency_s"] == pytest.approx(0.02 + 64 * 0.008)
    # the setup id: the engine config (dtype chosen; `_target_` left out), and the versions and
    # hardware the rows record: the evaluate process's, which this one's need not equal (on a
    # GPU host a CUDA query made here with other variables set sees no GPU)
    (setup,) = {r.setup_id for r in rows}
    configured = {k: v for k, v in conf.items() if k != "_target_"}
    configured["args"] = {**conf["args"], "dtype": rows[0].engine_args["dtype"]}
    assert setup == results.setup_id(configured, rows[0].versions, rows[0].hardware)
    assert rows[0].hardware["cpu_count"] == hardware()["cpu_count"] and rows[0].versions == versions() | {
        "quantbench": rows[0].versions["quantbench"]}  # this machine's, from the same libraries
    # the defaults this machine gets (conf/hardware/), in every row and in the report's header
    assert {r.hardware_defaults for r in rows} == {detected()}
    from evaluate.report.markdown import render_method
    assert f"- Defaults: `hardware={detected()}`" in render_method(rows)

    again = evaluate_with_dummy(*args, cwd=tmp_path)
    assert again.returncode == 0, tail(again)
    assert "nothing to do" in again.stdout + again.stderr
    assert len(results.read(res)) == 2


def test_an_engine_without_prompt_logprobs_cannot_measure_accuracy(tiny_model, tmp_path):
    out = evaluate_with_dummy(f"model={tiny_model}", "scenario=interactive", f"results_dir={tmp_path / 'res'}",
                              cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == ("error: engine=dummy gives no prompt logprobs, so it cannot "
                                                   "measure accuracy; pass accuracy=none")


@pytest.mark.extended
def test_a_sweep_in_one_process_records_each_jobs_own_environment(tiny_model, tmp_path):
    """Two jobs of a `-m` sweep share one process (Hydra's basic launcher):
    the second must not run in, nor record, what the first one set."""
    res = tmp_path / "res"
    out = evaluate_with_dummy("-m", f"model={tiny_model}", "accuracy=none", "scenario=interactive", "runs=1",
                              "+engine.env.QUANTBENCH_DUMMY_EXTRA=on,null", f"results_dir={res}", cwd=tmp_path)
    assert out.returncode == 0, tail(out)
    envs = sorted((r.engine_env for r in results.read(res)), key=len)
    assert envs == [{"QUANTBENCH_DUMMY_MODE": "fake-clock"},
                    {"QUANTBENCH_DUMMY_MODE": "fake-clock", "QUANTBENCH_DUMMY_EXTRA": "on"}]



def test_a_sweep_over_any_engine_variable_is_recorded_and_labelled(tiny_model, tmp_path):
    """A variable the engine does not list as speed-relevant (LD_PRELOAD-like):
    set through the config, it is in the rows, and the report tells the two
    setups apart by it."""
    from evaluate.analysis.groups import aggregate
    from evaluate.report.labels import labels
    res = tmp_path / "res"
    out = evaluate_with_dummy("-m", f"model={tiny_model}", "accuracy=none", "scenario=interactive", "runs=1",
                              "+engine.env.QB_TEST_SWEPT=a,b", f"results_dir={res}", cwd=tmp_path)
    assert out.returncode == 0, tail(out)
    rows = results.read(res)
    assert sorted(r.engine_env.get("QB_TEST_SWEPT") for r in rows) == ["a", "b"]
    assert sorted(labels(aggregate(rows)).values()) == ["original (QB_TEST_SWEPT=a)", "original (QB_TEST_SWEPT=b)"]


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_instruction_set_caps_set_in_the_shell_are_recorded(engine, monkeypatch):
    """scripts/as_avx2_host.sh caps ATen, MKL and oneDNN at AVX2: rows measured
    so must say it, though no config of the engine set them."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    recorded = engines.get(engine).recorded_env({})
    assert {k: recorded.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")} == {
        "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": None}


# VLLM_CPU_KVCACHE_SPACE=auto: the KV cache sized to what the job's scenarios hold at once.

SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
LLAMA2_7B = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096}


def kv_target(config: dict, kv_scheme: str | None = None):
    from types import SimpleNamespace
    fmt = SimpleNamespace(kv_cache=kv_scheme, method="compressed-tensors" if kv_scheme else None)
    return SimpleNamespace(config=config, format=fmt)


def sized(target, tokens, env=None, **args):
    from evaluate.engines.vllm import VllmEngine
    return VllmEngine.sized_env(env or {"VLLM_CPU_KVCACHE_SPACE": "auto", "OTHER": 1}, target,
                                {"dtype": "bfloat16", **args}, tokens)


@pytest.mark.parametrize("config, tokens, args, gib", [
    (SMOLLM2, 64 * 384, {}, 1),                        # 0.53 GiB of bf16 KV: the 1 GiB floor
    (LLAMA2_7B, 8 * 2048, {}, 12),                     # 8 GiB, with headroom 12
    (LLAMA2_7B, 8 * 2048, {"tensor_parallel_size": 2}, 6),   # per rank: half the heads
    (LLAMA2_7B, 8 * 2048, {"dtype": "float32"}, 24),
    (LLAMA2_7B, 8 * 2048, {"kv_cache_dtype": "fp8"}, 6),
])
def test_auto_kv_cache_holds_the_job_with_headroom(clean_env, cpu_host, config, tokens, args, gib):
    env = sized(kv_target(config), tokens, **args)
    assert env == {"VLLM_CPU_KVCACHE_SPACE": gib, "OTHER": 1}


def test_auto_kv_cache_follows_the_checkpoints_fp8_kv_scheme(clean_env, cpu_host):
    assert sized(kv_target(LLAMA2_7B, kv_scheme="fp8"), 8 * 2048)["VLLM_CPU_KVCACHE_SPACE"] == 6


def test_auto_kv_cache_falls_back_where_the_demand_or_the_layout_is_unknown(clean_env, cpu_host):
    from evaluate.engines.vllm import VllmEngine
    for env in (sized(kv_target(SMOLLM2), None), sized(kv_target({"model_type": "mamba"}), 1000)):
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "auto"
        with VllmEngine.environment(env) as recorded:
            assert recorded["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_a_number_or_the_users_own_value_is_left_as_is(clean_env, cpu_host, monkeypatch):
    from evaluate.engines import base
    assert sized(kv_target(SMOLLM2), 64 * 384, env={"VLLM_CPU_KVCACHE_SPACE": 3}) == {"VLLM_CPU_KVCACHE_SPACE": 3}
    monkeypatch.setattr(base, "LAUNCH_ENV", base.LAUNCH_ENV | {"VLLM_CPU_KVCACHE_SPACE"})
    assert sized(kv_target(SMOLLM2), 64 * 384)["VLLM_CPU_KVCACHE_SPACE"] is None  # exported at launch: it stands


def test_on_cuda_the_kv_cache_is_vllms_own(clean_env, cuda_host, caplog):
    """VLLM_CPU_KVCACHE_SPACE is read by vLLM-CPU only (on CUDA vLLM sizes its KV
    cache from gpu_memory_utilization): auto leaves it unset, logs no size, and
    rows record none; a number the config sets is still passed on. So does
    VLLM_CPU_OMP_THREADS_BIND's auto, and a binding the config names stays."""
    import logging

    from evaluate.engines.vllm import VllmEngine
    with caplog.at_level(logging.INFO, logger="quantbench.evaluate"):
        env = sized(kv_target(LLAMA2_7B), 8 * 2048)
    assert env == {"VLLM_CPU_KVCACHE_SPACE": None, "OTHER": 1}
    assert "KV cache" not in caplog.text
    for configured in (env, engines.config("vllm")["env"]):  # sized, or not sized to a job (load profiles)
        with VllmEngine.environment(configured) as recorded:
            assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ and "VLLM_CPU_KVCACHE_SPACE" not in recorded
    with VllmEngine.environment(engines.config("vllm")["env"]) as recorded:   # nor its CPU thread binding
        assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ and "VLLM_CPU_OMP_THREADS_BIND" not in recorded
    with VllmEngine.environment({"VLLM_CPU_OMP_THREADS_BIND": "0-3"}) as recorded:   # one the user set stays
        assert recorded["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    assert sized(kv_target(SMOLLM2), 64 * 384, env={"VLLM_CPU_KVCACHE_SPACE": 3}) == {"VLLM_CPU_KVCACHE_SPACE": 3}
