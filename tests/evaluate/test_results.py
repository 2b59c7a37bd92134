"""evaluate/results.py: the Row type, run identity, setup identity, and rows
as written before Row existed."""
import json

import pytest

from evaluate import results
from evaluate.results import Row

ENGINE = {"name": "vllm", "args": {"dtype": "bfloat16", "max_num_seqs": 8}, "env": {"OMP_NUM_THREADS": "2"}}
VERSIONS = {"vllm": "0.11.0", "torch": "2.8.0", "transformers": "4.57.0", "compressed-tensors": "0.12.2",
            "python": "3.11.9", "quantbench": "0123456789ab"}
HARDWARE = {"hostname": "node-1", "machine": "x86_64", "cpu": "AMD EPYC", "cpu_count": 2, "cpu_affinity": 2,
            "memory_gib": 23.5, "accelerators": [], "cpu_isa": ["avx2", "avx512f"]}

# A speed row as the evaluate stage wrote it before rows were typed (trimmed
# from a real results.jsonl): every key is one Row knows.
OLD_ROW = {
    "schema": 1, "kind": "speed", "status": "ok", "timestamp": "2026-11-23T11:10:02+00:00",
    "artifact_id": "f92145a64346b1dd", "artifact_path": "/tmp/art-w8a8", "model_name": "tiny-qwen3-moe",
    "recipe": "w8a8_smooth_gptq", "quant_format": "int-quantized", "model_bytes": 13094448,
    "manifest": {"artifact_id": "f92145a64346b1dd", "seed": 0, "recipe": {"name": "w8a8_smooth_gptq"}},
    "engine": "hf", "engine_args": {"device": "cpu", "dtype": "bfloat16", "max_model_len": 513},
    "engine_env": {"torch_num_threads": 2}, "engine_version": "5.17.0", "engine_startup_s": 6.91,
    "machine": {"arch": "x86_64", "cpu_native_half": True, "vllm_library": None},
    "setup_id": "0a1b2c3d4e5f", "versions": VERSIONS, "hardware": HARDWARE,
    "scenario": "interactive", "batch_size": 1, "input_len": 16, "output_len": 4, "run_index": 0,
    "metrics": {"output_throughput": 0.666, "latency_s": 6.006, "output_tokens": 4},
}


def full_row(**changes) -> Row:
    return Row.from_dict(OLD_ROW).but(**changes)


# --- run identity -------------------------------------------------------------

def test_run_key_ignores_what_a_run_measured():
    a = full_row()
    b = a.but(status="failed", reason="boom", metrics={}, timestamp="2027-01-01T00:00:00+00:00",
              engine_startup_s=1.0, hardware={**HARDWARE, "hostname": "node-2"})
    assert a.run_key() == b.run_key()


@pytest.mark.parametrize("field, value", [
    ("kind", "accuracy"), ("artifact_id", "ffffffffffffffff"), ("engine", "vllm"), ("setup_id", "other"),
    ("scenario", "decode_bound"), ("batch_size", 2), ("input_len", 32), ("output_len", 8), ("run_index", 1),
    ("recipe", "w4a16_rtn"),  # rows of recipes not quantized share artifact_id None
])
def test_run_key_tells_runs_apart(field, value):
    assert full_row().run_key() != full_row(**{field: value}).run_key()


@pytest.mark.parametrize("field, value", [
    ("kind", "accuracy"), ("artifact_id", "ffffffffffffffff"), ("setup_id", "other"), ("scenario", "decode_bound"),
    ("batch_size", 2), ("load", {"profile": "concurrency", "level": 4}),
])
def test_measurement_key_groups_the_runs_of_one_scenario(field, value):
    """runs=auto continues from the stored runs with this key, whatever their index."""
    assert full_row(run_index=0).measurement_key() == full_row(run_index=7).measurement_key()
    assert full_row().measurement_key() != full_row(**{field: value}).measurement_key()


ACCURACY = {"name": "austen", "text": "austen", "books": ["emma"], "num_windows": 8, "window_len": 256, "top_k": 20,
            "lastword": {"num_items": 64}, "reference": None, "reference_device": "cpu", "enabled": True}
LM_EVAL = {"name": "hub", "tasks": ["arc_easy"], "venv": None, "num_fewshot": 5, "limit": 200, "batch_size": "auto",
           "apply_chat_template": False, "include_path": [], "model_args": {}, "enabled": True}
SLO = {"name": "interactive_cpu", "ttft_ms": 2000.0, "tpot_ms": None, "e2el_ms": None, "percentile": 90.0,
       "min_recovery_pct": None}


def kinds_row(kind: str, **changes) -> Row:
    """A row of `kind` holding what configures it (accuracy, lm-eval config or SLO) and the seed."""
    configs = {"accuracy": {"accuracy_config": ACCURACY}, "serving": {"slo": SLO},
               "lm_eval": {"lm_eval_config": LM_EVAL, "lm_eval_versions": {"lm_eval": "0.4.9", "vllm": "0.11.0"}}}
    return full_row(kind=kind, seed=0, **configs[kind]).but(**changes)


@pytest.mark.parametrize("kind, changes", [
    # each was taken as complete: the rerun reused rows measured another way
    ("accuracy", {"accuracy_config": ACCURACY | {"num_windows": 64}}),
    ("accuracy", {"accuracy_config": ACCURACY | {"reference": "/models/other"}}),
    ("accuracy", {"seed": 1}),                       # the last-word passages it draws
    ("lm_eval", {"lm_eval_config": LM_EVAL | {"apply_chat_template": True}}),
    ("lm_eval", {"lm_eval_config": LM_EVAL | {"model_args": {"max_gen_toks": 16}}}),
    ("lm_eval", {"lm_eval_versions": {"lm_eval": "0.4.10", "vllm": "0.11.0"}}),
    ("lm_eval", {"seed": 1}),
    ("serving", {"slo": SLO | {"ttft_ms": 500.0}}),  # goodput and attainment are computed against it
    ("serving", {"slo": SLO | {"percentile": 95.0}}),
    ("serving", {"slo": None}),
])
def test_what_configures_a_measurement_is_in_its_key(kind, changes):
    assert kinds_row(kind).run_key() != kinds_row(kind, **changes).run_key()


@pytest.mark.parametrize("kind, changes", [
    ("accuracy", {"accuracy_config": ACCURACY | {"name": "mine"}}),      # a label
    ("lm_eval", {"lm_eval_config": LM_EVAL | {"tasks": ["arc_easy", "gsm8k"]}}),   # another task is its own row
    ("lm_eval", {"lm_eval_config": LM_EVAL | {"batch_size": 8, "venv": "/opt/lm"}}),
    ("serving", {"slo": SLO | {"name": "renamed", "min_recovery_pct": 95.0}}),  # the report applies the floor
    ("serving", {"slo": {k: v for k, v in SLO.items() if v is not None}}),  # as an older writer left out nulls
    ("speed", {"seed": 1}),   # other random token ids of the same shape
])
def test_what_only_names_or_selects_is_not(kind, changes):
    row = full_row(seed=0) if kind == "speed" else kinds_row(kind)
    assert row.run_key() == row.but(**changes).run_key()


def test_completed_keys_are_the_ok_rows(tmp_path):
    ok, failed = full_row(), full_row(run_index=1, status="failed", reason="x")
    for row in (ok, failed):
        results.append(tmp_path / results.RESULTS_FILE, row)
    assert results.completed_keys(tmp_path) == {ok.run_key()}
    assert results.completed_keys(tmp_path, statuses=("ok", "failed")) == {ok.run_key(), failed.run_key()}


# --- setup identity -----------------------------------------------------------

def setup_id(engine=ENGINE, versions=VERSIONS, hardware=HARDWARE) -> str:
    return results.setup_id(engine, versions, hardware)


def test_setup_id_is_stable_for_equal_inputs():
    reordered = {"env": dict(ENGINE["env"]), "args": dict(reversed(list(ENGINE["args"].items()))), "name": "vllm"}
    assert setup_id() == setup_id(engine=reordered, versions=dict(VERSIONS), hardware=dict(HARDWARE))
    assert len(setup_id()) == 12


@pytest.mark.parametrize("what, changed", [
    ("an engine arg", {"engine": {**ENGINE, "args": {**ENGINE["args"], "max_num_seqs": 16}}}),
    ("an engine env var", {"engine": {**ENGINE, "env": {"OMP_NUM_THREADS": "1"}}}),
    ("the engine", {"engine": {**ENGINE, "name": "hf"}}),
    ("the vLLM version", {"versions": {**VERSIONS, "vllm": "0.11.1"}}),
    ("the torch version", {"versions": {**VERSIONS, "torch": "2.9.0"}}),
    ("the CPU", {"hardware": {**HARDWARE, "cpu": "Intel Xeon"}}),
    ("the usable cores", {"hardware": {**HARDWARE, "cpu_affinity": 1}}),
    ("the ISA", {"hardware": {**HARDWARE, "cpu_isa": ["avx2"]}}),
])
def test_setup_id_changes_with_what_can_change_a_measurement(what, changed):
    assert setup_id(**changed) != setup_id(), what


@pytest.mark.parametrize("what, changed", [
    ("the hostname (a twin node resumes a job)", {"hardware": {**HARDWARE, "hostname": "node-7"}}),
    ("quantbench's commit", {"versions": {**VERSIONS, "quantbench": "fedcba987654-dirty"}}),
])
def test_setup_id_ignores_what_cannot(what, changed):
    assert setup_id(**changed) == setup_id(), what


# --- the row type and the rows on disk ---------------------------------------

def test_round_trip():
    for row in (full_row(), Row(kind="accuracy"), full_row(status="failed", reason="engine start-up failed: x",
                                                           extra={"future_key": [1, 2]})):
        assert Row.from_dict(row.to_dict()) == row
        assert Row.from_dict(json.loads(json.dumps(row.to_dict()))) == row


def test_an_old_row_reads_as_a_typed_row():
    row = Row.from_dict(OLD_ROW)
    assert row.kind == "speed" and row.status == "ok" and row.ok
    assert row.metrics["output_throughput"] == 0.666 and row.engine_args["max_model_len"] == 513
    assert row.versions["vllm"] == "0.11.0" and row.hardware["hostname"] == "node-1"
    assert row.extra == {}
    assert row.to_dict() == OLD_ROW  # written back unchanged


def test_nulls_of_older_writers_become_empty_dicts():
    row = Row.from_dict({"schema": 1, "kind": "speed", "status": "ok", "engine_args": None, "engine_env": None,
                         "versions": None, "hardware": None, "metrics": None})
    assert row.engine_args == {} and row.engine_env == {} and row.metrics == {}
    assert row.versions == {} and row.hardware == {}
    assert row.engine_args.get("dtype") is None  # readers may index them


def test_unknown_keys_are_kept_and_written_back(tmp_path):
    data = {**OLD_ROW, "worker": 3, "notes": {"by": "a newer writer"}}
    row = Row.from_dict(data)
    assert row.extra == {"worker": 3, "notes": {"by": "a newer writer"}}
    assert row.to_dict() == data
    store = tmp_path / results.RESULTS_FILE
    results.append(store, row)
    (again,) = results.read(tmp_path)
    assert again == row and again.extra["worker"] == 3
    assert json.loads(store.read_text()) == data


def test_read_merges_shards_and_skips_what_is_not_a_row(tmp_path):
    (tmp_path / "results.jsonl").write_text(
        json.dumps(OLD_ROW) + "\n" + "[1, 2]\n" + json.dumps({"kind": "speed"}) + "\n" + '{"kind": "spe')
    results.append(results.shard_path(tmp_path, shard=True), full_row(run_index=1))
    rows = results.read(tmp_path)
    assert sorted(r.run_index for r in rows) == [0, 1]
    assert all(isinstance(r, Row) for r in rows)


def test_always_written_keys_are_there_even_when_none():
    d = Row(kind="lm_eval").to_dict()
    for key in ("kind", "status", "artifact_id", "engine", "setup_id", "scenario", "batch_size", "run_index"):
        assert key in d
    assert "reason" not in d and "lm_eval" not in d


def test_numpy_scalars_are_written_as_numbers(tmp_path):
    import numpy as np
    row = full_row(metrics={"kl_divergence": np.float32(0.25), "hits": np.int64(3), "plain": 1.5})
    results.append(results.shard_path(tmp_path), row)
    (back,) = results.read(tmp_path)
    assert back.metrics == {"kl_divergence": 0.25, "hits": 3, "plain": 1.5}
    assert isinstance(back.metrics["kl_divergence"], float) and isinstance(back.metrics["hits"], int)
