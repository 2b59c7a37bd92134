"""Bad inputs fail before the expensive work: a one-line error that names the
fix, exit code 2, and nothing half-written. Each class of input the issue
lists has a case: corrupt file, unknown key, unwritable output, foreign store
content, impossible length. All but the store tests fail before any engine or
calibration starts, so they take seconds."""
import json
import logging
import re
import shutil

import pytest

from tests.conftest import last_line, run_cli
from evaluate import results
from quantize.common.errors import UserError

SMALL_SCENARIO = ("scenario=interactive", "scenario.input_len=16", "scenario.output_len=4")


@pytest.fixture
def checkpoint(tiny_model, tmp_path):
    """A private copy of the tiny model to damage."""
    return shutil.copytree(tiny_model, tmp_path / "ckpt")


def evaluate(model, res, *args, cwd):
    return run_cli("evaluate", f"model={model}", *SMALL_SCENARIO, f"results_dir={res}", *args, cwd=cwd)


def assert_one_line_error(proc, *expect: str) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = last_line(proc.stderr)
    assert "Traceback" not in proc.stderr
    for text in expect:
        assert text in line, line
    return line


def assert_refused_before_any_work(model, tmp_path, arg: str, expect: str) -> None:
    """`arg` (engine=hf, speed only) is one line naming `expect`, with no results folder made."""
    res = tmp_path / "results"
    proc = evaluate(model, res, "engine=hf", "accuracy=none", *arg.split(), cwd=tmp_path)
    assert_one_line_error(proc, expect)
    assert not res.exists()


def truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


# ---------------------------------------------------------------- corrupt files

@pytest.mark.parametrize("file, content, expect, fix", [
    ("manifest.json", '{"artifact_id": "0123', "not valid JSON", "force=true"),       # truncated
    ("manifest.json", "[]", "not a quantbench manifest", "force=true"),                # valid JSON, not a manifest
    ("manifest.json", '{"artifact_id": "x"}', "missing model, recipe, quantization", "force=true"),
    # a config.json holding a JSON list failed as "unexpected" ('list' object has no attribute 'get')
    ("config.json", '{"model_type": "lla', "is corrupt (not valid JSON", "re-copy or re-create the checkpoint"),
    ("config.json", "[]", "holds a JSON list, not the object of a model config", "re-copy or re-create the checkpoint"),
])
def test_evaluate_rejects_a_corrupt_manifest_or_config(checkpoint, tmp_path, file, content, expect, fix):
    (checkpoint / file).write_text(content)
    res = tmp_path / "res"
    out = evaluate(checkpoint, res, cwd=tmp_path)
    assert_one_line_error(out, file, expect, fix)
    assert not res.exists() or not any(res.iterdir())


def test_evaluate_rejects_a_truncated_safetensors_file(checkpoint, tmp_path):
    truncate(checkpoint / "model.safetensors")
    res = tmp_path / "res"
    out = evaluate(checkpoint, res, cwd=tmp_path)
    assert_one_line_error(out, "model.safetensors is not a complete safetensors file", "re-create")
    assert "starting vLLM" not in out.stdout + out.stderr
    assert not res.exists() or not any(res.iterdir())


def test_safetensors_header_check_reads_only_headers(checkpoint):
    """The check itself: whole files pass; a cut anywhere fails, including
    inside the header and at the last byte."""
    from quantize.common.errors import UserError
    from quantize.common.checkpoint import check_weight_files
    weights = checkpoint / "model.safetensors"
    check_weight_files([weights])
    data = weights.read_bytes()
    for cut in (4, 100, len(data) - 1):
        weights.write_bytes(data[:cut])
        with pytest.raises(UserError, match="not a complete safetensors file"):
            check_weight_files([weights])


def test_quantize_rejects_a_truncated_base_model(checkpoint, tmp_path):
    truncate(checkpoint / "model.safetensors")
    arts = tmp_path / "artifacts"
    out = run_cli("quantize", "recipe=w4a16_rtn", f"model={checkpoint}", f"artifacts_dir={arts}", cwd=tmp_path)
    assert_one_line_error(out, "model.safetensors is not a complete safetensors file")
    assert not arts.exists() or not any(arts.rglob("*.safetensors"))


def test_quantize_into_a_dir_with_a_corrupt_manifest_fails_before_calibration(tiny_model, tmp_path):
    out_dir = tmp_path / "artifact"
    out_dir.mkdir()
    (out_dir / "manifest.json").write_text('{"artifact_id": "01')
    out = run_cli("quantize", "recipe=w4a16_rtn", f"model={tiny_model}", f"artifact_dir={out_dir}", cwd=tmp_path)
    assert_one_line_error(out, "manifest.json is corrupt", "force=true")
    assert "calibration ..." not in out.stdout + out.stderr  # failed before the first phase
    assert (out_dir / "manifest.json").read_text() == '{"artifact_id": "01'  # left as it was
    # The named fix works (the baseline needs no calibration, so this is quick).
    out = run_cli("quantize", "recipe=original", f"model={tiny_model}", f"artifact_dir={out_dir}", "force=true",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((out_dir / "manifest.json").read_text())["recipe"]["name"] == "original"


# ---------------------------------------------------------------- unknown keys

@pytest.mark.parametrize("args, expect", [
    pytest.param(["engine.args.max_num_seq=4"], "did you mean engine.args.max_num_seqs?", marks=pytest.mark.needs_vllm),
    # as far from its key (0.53) as out_dir from results_dir: every "did you mean" has one cutoff
    pytest.param(["+engine.args.gpu_util=0.5"], "did you mean engine.args.gpu_memory_utilization?",
                 marks=pytest.mark.needs_vllm),
    pytest.param(["+engine.args.no_such_knob=1"], "engine.args.no_such_knob is not an argument of engine=vllm",
                 marks=pytest.mark.needs_vllm),
    (["engine=hf", "+engine.args.enforce_eager=true"], "it takes device, dtype, max_model_len"),
])
def test_unknown_engine_arg_fails_before_the_engine(tiny_model, tmp_path, args, expect):
    res = tmp_path / "res"
    out = evaluate(tiny_model, res, *args, cwd=tmp_path)
    assert_one_line_error(out, expect)
    assert "starting vLLM" not in out.stdout + out.stderr
    assert not res.exists() or not any(res.iterdir())


@pytest.mark.needs_vllm
@pytest.mark.parametrize("engine, arg, expect", [
    ("vllm", "engine.args.dtype=foo", "engine.args.dtype='foo' is not a value vLLM takes: Input should be 'auto', "),
    # vLLM derives max_num_batched_tokens from it and names that first: the line names what was set
    ("vllm_server", "engine.args.max_num_seqs=-1", "engine.args.max_num_seqs=-1 is not a value vLLM takes: "
                                                   "Input should be greater than or equal to 1; change it, or "
                                                   "remove it with ~engine.args.max_num_seqs"),
])
def test_a_value_vllm_rejects_is_one_line_and_records_nothing(tiny_model, tmp_path, engine, arg, expect):
    """vLLM validates engine.args as it builds its config, before a weight loads:
    bad input, not a failed start with a row per scenario."""
    res = tmp_path / "res"
    out = evaluate(tiny_model, res, f"engine={engine}", "accuracy=none", arg, cwd=tmp_path)
    assert_one_line_error(out, expect)
    assert not res.exists() or not any(res.iterdir())


@pytest.mark.needs_vllm
def test_the_rejected_value_is_read_from_vllms_own_errors():
    """The texts vLLM's config classes (pydantic) and its server's argparse write."""
    from pydantic import ValidationError
    from vllm.config import SchedulerConfig

    from evaluate.engines.vllm import rejected_arg
    with pytest.raises(ValidationError) as error:
        SchedulerConfig(max_num_seqs=0, max_model_len=64, is_encoder_decoder=False)
    assert rejected_arg(str(error.value), {"max_num_seqs": 0}) == (
        "engine.args.max_num_seqs=0 is not a value vLLM takes: Input should be greater than or equal to 1; "
        "change it, or remove it with ~engine.args.max_num_seqs")
    assert rejected_arg(str(error.value), {"max_model_len": 64}) is None   # not what it rejected
    argparse = "api_server.py: error: argument --kv-cache-dtype: invalid choice: 'fp4' (choose from 'auto', 'fp8')\n"
    assert rejected_arg(argparse, {"kv_cache_dtype": "fp4"}).startswith(
        "engine.args.kv_cache_dtype='fp4' is not a value vLLM takes: invalid choice: 'fp4'")
    # a config field named apart from the argument that sets it (was an unexpected ValidationError)
    from vllm.config import CacheConfig
    with pytest.raises(ValidationError) as error:
        CacheConfig(cache_dtype="zzz")
    assert rejected_arg(str(error.value), {"kv_cache_dtype": "zzz"}).startswith(
        "engine.args.kv_cache_dtype='zzz' is not a value vLLM takes: Input should be 'auto'")


@pytest.mark.parametrize("engine", ["vllm", "vllm_server"])
@pytest.mark.parametrize("env, expect", [
    ({"VLLM_CPU_KVCACHE_SPACE": "zzz"}, "engine.env.VLLM_CPU_KVCACHE_SPACE=zzz: pass auto (sized to the scenarios) "
                                        "or the KV cache's GiB, a number > 0"),
    ({"VLLM_CPU_KVCACHE_SPACE": -1}, "engine.env.VLLM_CPU_KVCACHE_SPACE=-1: pass auto"),
    ({"VLLM_CPU_NUM_OF_RESERVED_CPU": "zzz"}, "engine.env.VLLM_CPU_NUM_OF_RESERVED_CPU=zzz: pass a count of cores"),
    ({"VLLM_CPU_NUM_OF_RESERVED_CPU": 1.5}, "engine.env.VLLM_CPU_NUM_OF_RESERVED_CPU=1.5: pass a count of cores"),
])
def test_the_vllm_cpu_variables_quantbench_reads_are_checked_as_the_config_is_read(engine, env, expect):
    """Text in VLLM_CPU_KVCACHE_SPACE was an unexpected ValidationError in vLLM's config and a
    negative size a traceback from its engine core, each after a failed row."""
    from evaluate.engines.vllm import VllmEngine
    from evaluate.engines.vllm_server import VllmServerEngine
    engine_cls = VllmServerEngine if engine == "vllm_server" else VllmEngine
    with pytest.raises(UserError, match=re.escape(expect)):
        engine_cls.from_config({"name": engine, "env": env}, f"conf/engine/{engine}.yaml")
    for fine in ({"VLLM_CPU_KVCACHE_SPACE": "auto"}, {"VLLM_CPU_KVCACHE_SPACE": 4}, {"VLLM_CPU_KVCACHE_SPACE": "2.5"},
                 {"VLLM_CPU_NUM_OF_RESERVED_CPU": None}, {"VLLM_CPU_NUM_OF_RESERVED_CPU": 0}):
        assert engine_cls.from_config({"name": engine, "env": fine}, "x").env == fine


@pytest.mark.parametrize("arg,expect", [
    # an unexpected RuntimeError as the model moved to the device
    ("engine.args.device=zzz", "engine.args.device=zzz is not a device quantbench runs models on; pass "
                               "engine.args.device=auto"),
    ("engine.args.device=mps", "engine.args.device=mps is not a device quantbench runs models on"),
    # after every speed run: a ValueError, RuntimeError or a device torch cannot parse, in the accuracy pass
    ("accuracy=austen accuracy.num_windows=-1", "accuracy.num_windows=-1: pass an integer >= 1"),
    ("accuracy=austen accuracy.top_k=-1", "accuracy.top_k=-1: pass an integer >= 1"),
    ("accuracy=austen accuracy.lastword.num_items=-1", "accuracy.lastword.num_items=-1: pass an integer >= 1"),
    ("accuracy=austen accuracy.reference_device=zzz", "accuracy.reference_device=zzz is not a device"),
    # an AttributeError ('NoneType' object has no attribute 'num_items')
    ("accuracy=austen accuracy.lastword=null", "accuracy.lastword=null: pass its settings (num_items, min_words, "
                                               "context_tokens), or accuracy=none"),
    # an unexpected ValueError (int('zzz')) for every engine
    ("engine.args.max_model_len=zzz", "engine.args.max_model_len=zzz: pass an integer >= 1, or null for the longest"),
    ("engine.args.max_model_len=-1", "engine.args.max_model_len=-1: pass an integer >= 1"),
    # numpy's "expected non-negative integer" as the prompts were drawn
    ("seed=-1", "seed=-1: pass an integer >= 0, e.g. seed=0"),
])
def test_a_value_that_failed_deep_in_the_job_is_one_line_before_it(tiny_model, tmp_path, arg, expect):
    assert_refused_before_any_work(tiny_model, tmp_path, arg, expect)


def test_a_quantized_checkpoint_without_a_manifest_is_not_its_own_accuracy_reference(checkpoint, tmp_path):
    """It was scored against itself: recovery 100 %, KL 0, whatever the quantization did."""
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                     "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                         "num_bits": 4, "type": "int", "strategy": "group", "group_size": 64,
                                         "symmetric": True}}}}
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert_refused_before_any_work(checkpoint, tmp_path, "accuracy=austen verify=false",
                                   "is already quantized, so it cannot be its own reference; pass "
                                   "accuracy.reference=<its unquantized checkpoint> or accuracy=none")


def test_cuda_for_engine_hf_on_a_machine_without_it_is_one_line(tiny_model, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = evaluate(tiny_model, tmp_path / "results", "engine=hf", "engine.args.device=cuda", cwd=tmp_path)
    assert_one_line_error(proc, "engine.args.device=cuda: this machine has no CUDA device; pass engine.args.device=auto")


@pytest.mark.parametrize("arg,expect", [
    # each ran, its rows labelled '', '[1]' or 'None'
    ("engine.name=", "engine.name= is not a name: it is the rows' `engine`; pass text"),
    ("engine.name=[1]", "engine.name=[1] is not a name"),
    ("scenario.name=[1]", "scenario: name=[1] is not text; pass text for name"),
    ("accuracy=austen accuracy.name=", "accuracy: name is empty; pass a name, the rows' label, e.g. accuracy.name=mine"),
    # a complaint about integers for a missing name, a KeyError for a missing length
    ("scenario.name=null", "has no name; give it one"),
    ("scenario.batch_size=null", "scenario interactive has no batch_size; give it an integer"),
    ("hardware.name=[1]", "hardware.name=[1] is not a name: it is the conf/hardware/ profile the rows record; "
                          "choose a profile with hardware=cpu or hardware=cuda"),
])
def test_a_name_that_labels_rows_is_text(tiny_model, tmp_path, arg, expect):
    assert_refused_before_any_work(tiny_model, tmp_path, arg, expect)


@pytest.mark.parametrize("arg,expect", [
    # each was read as its default: dtype and device auto, accuracy or lm-eval off
    ("engine.args.dtype=0", "engine.args.dtype=0: unknown dtype; use auto, float32, bfloat16 or float16"),
    ("engine.args.dtype=", "engine.args.dtype=: unknown dtype"),
    ("engine.args.device=0", "engine.args.device=0 is not a device"),   # to torch, 0 is cuda:0
    ("engine.args.device=", "engine.args.device= is not a device"),
    ("accuracy=austen accuracy.enabled=", "accuracy.enabled=: pass accuracy.enabled=true or accuracy.enabled=false"),
    ("lm_eval=austen_lastword lm_eval.enabled=", "lm_eval.enabled=: pass lm_eval.enabled=true"),
])
def test_an_empty_or_zero_value_is_not_read_as_the_default(tiny_model, tmp_path, arg, expect):
    assert_refused_before_any_work(tiny_model, tmp_path, arg, expect)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::"])
def test_a_server_beyond_this_machine_takes_an_explicit_yes(tiny_model, tmp_path, host):
    """vLLM's server has no authentication: engine.host=0.0.0.0 started it on every interface."""
    res = tmp_path / "results"
    proc = evaluate(tiny_model, res, "engine=vllm_server", f"engine.host={host}", cwd=tmp_path)
    assert_one_line_error(proc, f"engine.host={host} would serve the model, without authentication, beyond this "
                                "machine; keep engine.host=127.0.0.1, or pass engine.allow_remote=true")
    assert not res.exists()


def test_the_servers_host_rule():
    from evaluate.engines.vllm_server import VllmServerEngine
    where = "conf/engine/vllm_server.yaml"
    for host, allow in (("127.0.0.1", False), ("localhost", False), ("::1", False), ("0.0.0.0", True)):
        config = VllmServerEngine.from_config({"name": "vllm_server", "host": host, "allow_remote": allow}, where)
        assert config.settings["host"] == host
    with pytest.raises(UserError, match="engine.allow_remote=no: pass engine.allow_remote=true or"):
        VllmServerEngine.from_config({"name": "vllm_server", "host": "0.0.0.0", "allow_remote": "no"}, where)


@pytest.mark.extended
@pytest.mark.needs_vllm
def test_a_tensor_parallel_size_the_heads_cannot_split_fails_before_the_engine(tiny_model, tmp_path):
    res = tmp_path / "res"
    out = evaluate(tiny_model, res, "engine.args.tensor_parallel_size=3", cwd=tmp_path)
    assert_one_line_error(out, "tensor_parallel_size=3 does not divide the model's 4 attention heads; use one of 1, 2, 4")
    assert "starting vLLM" not in out.stdout + out.stderr
    assert not res.exists() or not any(res.iterdir())


@pytest.mark.needs_vllm
def test_every_engine_names_its_arguments():
    from evaluate.engines.hf import HfEngine
    from evaluate.engines.vllm import VllmEngine
    vllm_args = VllmEngine.accepted_args()
    assert {"dtype", "max_model_len", "enforce_eager", "max_num_seqs", "kv_cache_dtype"} <= vllm_args
    assert "model" not in vllm_args  # quantbench passes the model itself
    # What the shipped engine configs set is accepted by their engine.
    from omegaconf import OmegaConf
    from quantize.common.paths import PROJECT_ROOT
    for cls in (VllmEngine, HfEngine):
        conf = OmegaConf.load(PROJECT_ROOT / "conf" / "engine" / f"{cls.name}.yaml")
        assert set(conf.args) <= cls.accepted_args()


# ---------------------------------------------------------------- unwritable output

@pytest.mark.parametrize("make", ["results_dir_is_a_file", "store_is_a_directory"])
def test_unwritable_results_location_fails_before_the_engine(tiny_model, tmp_path, make):
    if make == "results_dir_is_a_file":
        res = tmp_path / "res"
        res.write_text("not a directory\n")
    else:
        res = tmp_path / "res"
        (res / "results.jsonl").mkdir(parents=True)
    out = evaluate(tiny_model, res, cwd=tmp_path)
    assert_one_line_error(out, "cannot write results to", "results_dir=")
    assert "starting vLLM" not in out.stdout + out.stderr


# ---------------------------------------------------------------- foreign store content

FOREIGN = ["[]", '{"foo": 1}', '"a string"', "42", "null", '{"kind": "speed"}']


def write_store(path, good_rows):
    lines = [json.dumps(r) for r in good_rows] + FOREIGN
    path.write_text("\n".join(lines) + "\n")


def test_reader_skips_lines_that_are_not_rows_with_a_counted_warning(tmp_path, caplog):
    good = {"kind": "speed", "status": "ok", "artifact_id": "a", "metrics": {"latency_s": 1.0}, "n": 1}
    write_store(tmp_path / "results.jsonl", [good])
    with caplog.at_level(logging.WARNING, logger="quantbench.results"):
        rows = results.read(tmp_path)
    assert rows == [results.Row(kind="speed", status="ok", artifact_id="a", metrics={"latency_s": 1.0},
                                extra={"n": 1})]
    (warning,) = [r for r in caplog.records if "not result rows" in r.getMessage()]
    assert f"left out {len(FOREIGN)} line(s)" in warning.getMessage()
    assert results.completed_keys(tmp_path) == {rows[0].run_key()}


def test_report_and_rerun_skip_logic_work_on_a_store_with_foreign_lines(tiny_model, tmp_path):
    """A real evaluate (transformers engine, seconds on the tiny model) appends
    to a store that holds foreign lines; the rerun skips what it measured, and
    the report renders."""
    res = tmp_path / "res"
    res.mkdir()
    write_store(res / "results.jsonl", [])
    args = ("engine=hf", "runs=1", "accuracy=none")
    first = evaluate(tiny_model, res, *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "left out 6 line(s) that are not result rows" in first.stdout + first.stderr
    (row,) = results.read(res)
    assert row.status == "ok"
    again = evaluate(tiny_model, res, *args, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to do" in again.stdout + again.stderr
    report = run_cli("evaluate.report", f"results_dir={res}", f"out_dir={tmp_path / 'rep'}", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "interactive" in (tmp_path / "rep" / "report.md").read_text()


# ---------------------------------------------------------------- impossible length

@pytest.mark.parametrize("arg,fix", [
    # a window is its tokens and one more: vLLM refused a window of the whole context after every speed run
    ("accuracy.window_len={positions}", "lower accuracy.window_len to at most {last_window}"),
    # a last-word prompt is its context and the word: engine=hf scored it past the model's positions
    ("accuracy.lastword.context_tokens={positions}", "lower accuracy.lastword.context_tokens to at most {last_context}"),
    ("engine.args.max_model_len=300 accuracy.window_len=256 accuracy.lastword.context_tokens=300",
     "raise it to at least 316, or lower accuracy.lastword.context_tokens to at most 284"),
])
def test_accuracy_requests_longer_than_the_context_fail_before_the_speed_runs(tiny_model, tmp_path, arg, fix):
    positions = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
    sizes = dict(positions=positions, last_window=positions - 1, last_context=positions - 16)
    assert_refused_before_any_work(tiny_model, tmp_path, "accuracy=austen " + arg.format(**sizes),
                                   fix.format(**sizes) + ", or pass accuracy=none")


@pytest.mark.parametrize("arg,expect", [
    # each failed in the accuracy pass, after every speed run
    ("accuracy.books=[]", "accuracy.books is empty; name at least one held-out book"),
    ("accuracy.num_windows=100000", "lower accuracy.num_windows (100000) or accuracy.window_len"),
    ("accuracy.lastword.num_items=5000", "paragraphs qualify for the last-word task; lower "
                                         "accuracy.lastword.num_items (5000) or accuracy.lastword.min_words"),
    ("accuracy.lastword.min_words=1000", "paragraphs qualify for the last-word task"),
])
def test_a_held_out_text_too_short_for_the_accuracy_pass_fails_before_the_speed_runs(tiny_model, tmp_path, arg,
                                                                                       expect):
    assert_refused_before_any_work(tiny_model, tmp_path, "accuracy=austen " + arg, expect)


def test_max_model_len_below_the_accuracy_windows_fails_before_the_speed_runs(tiny_model, tmp_path):
    res = tmp_path / "res"
    out = evaluate(tiny_model, res, "engine.args.max_model_len=256", cwd=tmp_path)
    assert_one_line_error(out, "accuracy requests need 513 tokens", "max_model_len is 256", "at least 513")
    assert "starting vLLM" not in out.stdout + out.stderr
    assert not res.exists() or not any(res.iterdir())


def test_a_missing_scenario_file_is_refused_before_the_model_is_opened(tmp_path):
    """The model is not there either: the scenario, a check of the command line
    alone, is said first (it came after reading and verifying the weights)."""
    nope = tmp_path / "nope.yaml"
    proc = run_cli("evaluate", f"model={tmp_path / 'no_model'}", f"scenario={nope}",
                   f"results_dir={tmp_path / 'res'}", cwd=tmp_path)
    assert_one_line_error(proc, f"scenario file {nope} does not exist")
    assert not (tmp_path / "res").exists()
