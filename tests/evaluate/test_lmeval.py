"""The optional lm-eval path: its own environment, its vLLM backend, rows in
the results store keyed by artifact id."""
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import re
import subprocess
import time
from types import SimpleNamespace

import pytest
import yaml

from tests.conftest import run_cli
from tests.evaluate.report.rows import base_row
from evaluate import lmeval, results
from quantize.common.errors import UserError
from quantize.common.paths import PROJECT_ROOT

LMEVAL_PYTHON = PROJECT_ROOT / ".venv-lmeval" / "bin" / "python"
needs_lmeval_venv = pytest.mark.skipif(not LMEVAL_PYTHON.is_file(),
                                       reason="no .venv-lmeval: run `bash scripts/setup_lmeval.sh` (make test does)")


def run_evaluate(*args, cwd):
    return run_cli("evaluate", *args, cwd=cwd, timeout=1200)


def test_main_environment_has_no_huggingface_evaluate():
    """The name clash lm-eval would cause: `evaluate` here is this project's."""
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("evaluate")
    assert importlib.util.find_spec("evaluate").origin.startswith(str(PROJECT_ROOT))


@needs_lmeval_venv
def test_lmeval_environment_has_lm_eval_and_its_evaluate(tmp_path):
    probe = "import evaluate, lm_eval, vllm; print(evaluate.__file__)"
    out = subprocess.run([str(LMEVAL_PYTHON), "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "site-packages" in out.stdout and str(PROJECT_ROOT / "evaluate") not in out.stdout


@pytest.mark.parametrize("key, name", [("acc,none", "acc"), ("acc_stderr,none", "acc_stderr"),
                                       ("exact_match,strict-match", "exact_match[strict-match]")])
def test_metric_names(key, name):
    assert lmeval._metric_name(key) == name


@pytest.mark.needs_vllm  # the default engine's argument check comes first
@pytest.mark.parametrize("args, expect", [
    (["lm_eval=hub", "lm_eval.venv=/nonexistent/venv"], "scripts/setup_lmeval.sh"),
    (["lm_eval=hub", "lm_eval.tasks=[]"], "lm_eval.tasks is empty"),
    (["lm_eval=hub", "lm_eval.include_path=[/nonexistent/tasks]"], "is not a folder"),
])
def test_bad_lm_eval_config_fails_before_anything_runs(tiny_model, tmp_path, args, expect):
    out = run_evaluate(f"model={tiny_model}", "scenario=none", "accuracy=none",
                       f"results_dir={tmp_path}", *args, cwd=tmp_path)
    assert out.returncode == 2
    assert expect in out.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.extended
@pytest.mark.slow
@needs_lmeval_venv
def test_bundled_task_on_vllm_matches_transformers(build_artifact, tmp_path):
    """lm-eval (vLLM backend, own venv) scores the offline last-word task; its
    last-word perplexity agrees with a direct transformers computation, the row
    is linked to the artifact, and a rerun skips it."""
    art = build_artifact("original")
    n = 16
    args = [f"model={art.dir}", "scenario=none", "accuracy=none", "lm_eval=austen_lastword",
            f"lm_eval.austen_lastword.num_items={n}", "engine.args.enforce_eager=true",
            f"lm_eval.include_path=[{_user_task(tmp_path / 'my_tasks')}]",
            "lm_eval.tasks=[austen_lastword,my_capitals]", f"results_dir={tmp_path / 'res'}"]
    out = run_evaluate(*args, cwd=tmp_path)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    rows = {r.dataset: r for r in results.read(tmp_path / "res")}
    assert sorted(rows) == ["austen_lastword", "my_capitals"]
    assert rows["my_capitals"].lm_eval["n_samples"]["effective"] == 2
    row = rows["austen_lastword"]
    assert row.kind == "lm_eval" and row.status == "ok"
    assert row.scenario == "austen_lastword (0-shot)"
    assert row.artifact_id == art.manifest["artifact_id"]
    assert row.lm_eval["n_samples"]["effective"] == n
    assert row.lm_eval_versions["lm_eval"] and row.engine_version
    assert 0 <= row.metrics["acc"] <= 1
    expected = _last_word_log_perplexity(art.dir, n)
    assert math.log(row.metrics["perplexity"]) == pytest.approx(expected, abs=0.1)

    again = run_evaluate(*args, cwd=tmp_path)
    assert again.returncode == 0
    assert "nothing to do" in again.stdout + again.stderr
    assert len(results.read(tmp_path / "res")) == 2


def _user_task(folder):
    """A user's own lm-eval task folder (YAML + data), as lm_eval.include_path takes."""
    folder.mkdir()
    data = folder / "capitals.jsonl"
    data.write_text('{"q": "The capital of France is", "a": "Paris"}\n'
                    '{"q": "The capital of Italy is", "a": "Rome"}\n')
    (folder / "my_capitals.yaml").write_text(
        f"task: my_capitals\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: loglikelihood\ndoc_to_text: '{{q}}'\ndoc_to_target: ' {{a}}'\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    return folder


def _last_word_log_perplexity(model_dir, n: int) -> float:
    """-mean over items of log P(" word" | paragraph), in transformers, fp32."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evaluate import accuracy
    from quantize.common.heldout import held_out_text
    bundled = yaml.safe_load((PROJECT_ROOT / "conf" / "lm_eval" / "austen_lastword.yaml").read_text())
    preset = lmeval.BundledTaskConfig.from_config(bundled["austen_lastword"], "lm_eval.austen_lastword")
    passages = accuracy.lastword_passages(held_out_text(preset.text, preset.books), n, int(preset.min_words), seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total = 0.0
    for context, word in passages:
        ctx = tok(context)["input_ids"]
        whole = tok(context + " " + word)["input_ids"]
        with torch.inference_mode():
            logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
        total += sum(float(logp[i - 1, whole[i]]) for i in range(len(ctx), len(whole)))
    return -total / n


def fake_lm_eval(tmp_path, then: str, stall_timeout_s: float | None = None, on_cpu: bool = True,
                 tasks: tuple = ("t",), extra: dict | None = None):
    """An lm-eval environment whose `python -m lm_eval` writes (or not) a
    results file for task `t` alone (and the `extra` entries), then ends with
    the shell command `then`; its engine on the CPU or on a GPU. `tasks`:
    those asked for (the run's `.cfg` lists them)."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    results = {"results": {"t": {"alias": "t", "acc,none": 0.5, "sample_len": 4}} | (extra or {}),
               "n-samples": {"t": {"effective": 4}}}
    python.write_text(f"""#!/bin/bash
echo "$@" > {tmp_path}/argv
while [ "$1" != --output_path ]; do shift; done
{then}
""".replace("WRITE", f"mkdir -p $2/m && echo '{json.dumps(results)}' > $2/m/results_1.json"))
    python.chmod(0o755)
    cfg = lmeval.LmEvalConfig.from_group({"name": "fake", "venv": str(python.parents[1]), "tasks": list(tasks),
                                          "batch_size": 1, "num_fewshot": None, "limit": None,
                                          "apply_chat_template": False, "include_path": [], "enabled": True,
                                          "stall_timeout_s": stall_timeout_s})
    run = lambda args={}, seed=0: lmeval.run(cfg, SimpleNamespace(path=str(tmp_path)), "vllm", args, list(tasks),
                                             seed, on_cpu=on_cpu)[0]
    run.cfg = cfg
    return run


def test_an_lm_eval_that_prints_nothing_for_the_stall_limit_is_stopped_with_its_processes(tmp_path):
    """A hung lm-eval (a wedged vLLM inside it) held the job until Slurm
    killed it. Its process group is stopped, its vLLM with it."""
    import psutil
    run = fake_lm_eval(tmp_path, f"echo loading; sleep 300 & echo $! > {tmp_path}/child; wait", stall_timeout_s=1)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^lm-eval printed nothing and used no CPU for 1 s and was stopped as hung \(its last "
                                           r"line: loading\); raise lm_eval.stall_timeout_s if it needs longer, "
                                           r"or set it to null for no limit$"):
        run()
    assert time.monotonic() - start < 30
    child = int((tmp_path / "child").read_text())   # the sleep lm-eval waited on, in its process group
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_process_lm_eval_left_holding_its_output_is_stopped_and_the_results_kept(tmp_path, caplog):
    """lm-eval exited after writing its results; a process it started (an
    engine core stuck in shutdown) kept the output open and the job waiting."""
    import psutil
    run = fake_lm_eval(tmp_path, f"WRITE; sleep 300 & echo $! > {tmp_path}/child; exit 0", stall_timeout_s=1)
    assert run()["t"]["metrics"] == {"acc": 0.5}
    assert "lm-eval exited, but processes it started printed nothing for 1 s: stopped" in caplog.text
    child = int((tmp_path / "child").read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("holder, unkillable", [("setsid sleep 20 &", False), ("", True)])
def test_a_stopped_lm_eval_does_not_hold_the_job_while_something_keeps_its_output_open(
        tmp_path, monkeypatch, caplog, holder, unkillable):
    """The stop closed lm-eval's output, which waited for the read in flight,
    so the job waited for every holder of that pipe: a process in a session
    of its own (holder), or one SIGKILL does not end (a GPU process stuck in
    the driver, played by a killpg that does nothing)."""
    import os
    monkeypatch.setattr(lmeval, "STOP_GRACE_S", 0.5)
    killpg = os.killpg
    if unkillable:
        monkeypatch.setattr(lmeval.os, "killpg", lambda pid, sig: None)
    run = fake_lm_eval(tmp_path, f"echo $$ > {tmp_path}/lm_eval; {holder} echo $! > {tmp_path}/child; "
                                 "echo loading; sleep 20", stall_timeout_s=1)
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="stopped as hung"):
            run()
        assert time.monotonic() - start < 10
        assert ("outlived SIGKILL" if unkillable else "outside lm-eval's process group") in caplog.text
    finally:   # what the test left running
        _kill(killpg, tmp_path / "lm_eval")
        if holder:
            _kill(os.kill, tmp_path / "child")


def _kill(kill, pid_file):
    import signal
    try:
        kill(int(pid_file.read_text()), signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_an_lm_eval_that_keeps_printing_runs_past_the_stall_limit(tmp_path):
    """The limit is on silence, not on the whole run."""
    run = fake_lm_eval(tmp_path, "for i in 1 2 3 4 5 6; do echo step $i; sleep 0.5; done; WRITE", stall_timeout_s=2)
    assert run()["t"]["metrics"] == {"acc": 0.5}


def test_an_lm_eval_that_computes_without_printing_runs_past_the_stall_limit(tmp_path):
    """vLLM's generation on a CPU host can go long without moving a progress
    bar: a silent process group that keeps using CPU is not hung."""
    busy = "end=$((SECONDS+5)); while [ $SECONDS -lt $end ]; do :; done"
    run = fake_lm_eval(tmp_path, f"echo loading; {busy}; WRITE", stall_timeout_s=2)
    assert run()["t"]["metrics"] == {"acc": 0.5}


def test_a_hang_after_output_is_stopped_one_limit_after_the_last_line(tmp_path):
    """The CPU baseline was read only at the end of a silent window, so the
    first window after output counted the CPU used before it as busy: a hang
    right after computing and printing was stopped two limits late."""
    # the time is taken before each line: taken after it, a `date` slow to start read as less silence
    compute = ("end=$((SECONDS+4)); while [ $SECONDS -lt $end ]; do for i in $(seq 5000); do :; done; "
               f"date +%s.%N > {tmp_path}/last; echo step; done")
    run = fake_lm_eval(tmp_path, f"{compute}; sleep 60", stall_timeout_s=3)
    with pytest.raises(RuntimeError, match="stopped as hung"):
        run()
    silent = time.time() - float((tmp_path / "last").read_text())
    assert 3 <= silent < 4.5   # one limit (and the stop), not two


BUSY = "end=$((SECONDS+{})); while [ $SECONDS -lt $end ]; do :; done"


def test_a_silent_lm_eval_on_a_gpu_is_stopped_though_it_uses_cpu(tmp_path):
    """A wedged GPU keeps the CPU busy (a hung kernel's synchronize spins, so
    do NCCL waits): counting CPU time as life kept such an lm-eval running."""
    run = fake_lm_eval(tmp_path, f"echo loading; {BUSY.format(15)}; WRITE", stall_timeout_s=1, on_cpu=False)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=re.escape(
            "lm-eval printed nothing for 1 s (its engine is on a GPU, where a hang keeps using CPU, so silence "
            "alone counts) and was stopped as hung (its last line: loading); raise lm_eval.stall_timeout_s")):
        run()
    assert time.monotonic() - start < 8


def test_a_silent_lm_eval_on_a_cpu_that_keeps_using_cpu_is_stopped_after_4_limits(tmp_path):
    """A hang can spin on a CPU host too (vLLM's shared-memory readers loop on
    sched_yield): CPU use alone kept a silent lm-eval running for good."""
    run = fake_lm_eval(tmp_path, f"echo loading; {BUSY.format(20)}; WRITE", stall_timeout_s=1.5)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=re.escape(
            "lm-eval printed nothing for 6 s (4 x lm_eval.stall_timeout_s, the most a CPU-busy lm-eval may stay "
            "silent) and was stopped as hung (its last line: loading); raise lm_eval.stall_timeout_s")):
        run()
    assert 6 <= time.monotonic() - start < 14


def test_the_stall_limit_is_not_part_of_the_rows_key():
    """How long to wait changes nothing measured: rows stored before it existed stay complete."""
    rows = [lmeval.row(results.Row(kind="speed", seed=0), lmeval.LmEvalConfig.from_group(
        {"name": "hub", "tasks": ["gsm8k"], "enabled": True, "stall_timeout_s": s}), "gsm8k", "vllm") for s in (60, None)]
    assert "stall_timeout_s" not in rows[0].lm_eval_config and rows[0].run_key() == rows[1].run_key()


def probing_lm_eval(tmp_path, tasks_probe: str):
    """An lm-eval environment whose versions check answers at once and whose
    task listing runs the shell command `tasks_probe`."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"""#!/bin/bash
case "$2" in
  *TaskManager*) {tasks_probe} ;;
  *) echo '{{"lm_eval": "0.4", "vllm": "0"}}' ;;
esac
""")
    python.chmod(0o755)
    return python.parents[1]


def test_a_startup_check_that_hangs_is_stopped_with_its_processes_naming_the_setting(tmp_path):
    """lm-eval's task listing (a task's loader waiting on an unreachable
    network) held `python -m evaluate lm_eval=...` for ever, printing nothing."""
    import psutil
    venv = probing_lm_eval(tmp_path, f"sleep 300 & echo $! > {tmp_path}/child; wait")
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["gsm8k"], "enabled": True, "venv": str(venv),
                                          "startup_timeout_s": 1})
    start = time.monotonic()
    with pytest.raises(UserError, match=r"^lm-eval's startup check \(listing its tasks for gsm8k\) gave no answer in 1 s "
                                        r"and was stopped: raise lm_eval.startup_timeout_s if its first load is that "
                                        r"slow here \(null: no limit\), else find what it waits on"):
        lmeval.validate(cfg, "vllm")
    assert time.monotonic() - start < 30
    child = int((tmp_path / "child").read_text())   # what the check started, in its process group
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


@pytest.mark.needs_vllm  # the default engine's argument check comes first
def test_a_hung_startup_check_ends_the_job_with_one_line_and_exit_2(tiny_model, tmp_path):
    venv = probing_lm_eval(tmp_path, "sleep 300")
    out = run_evaluate(f"model={tiny_model}", "scenario=none", "accuracy=none", f"results_dir={tmp_path}",
                       "lm_eval=hub", f"lm_eval.venv={venv}", "lm_eval.startup_timeout_s=1", cwd=tmp_path)
    assert out.returncode == 2
    assert "gave no answer in 1 s and was stopped: raise lm_eval.startup_timeout_s" in out.stderr.strip().splitlines()[-1]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.parametrize("limit", [30, None])
def test_a_slow_startup_check_within_the_limit_or_without_one_passes(tmp_path, limit):
    venv = probing_lm_eval(tmp_path, """sleep 2; echo '{"gsm8k": ["gsm8k"]}'""")
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["gsm8k"], "enabled": True, "venv": str(venv),
                                          "startup_timeout_s": limit})
    assert lmeval.validate(cfg, "vllm") == {"lm_eval": "0.4", "vllm": "0"}


def test_the_startup_limit_is_a_setting_of_the_presets_and_not_part_of_the_rows_key():
    hub = yaml.safe_load((PROJECT_ROOT / "conf/lm_eval/hub.yaml").read_text())
    assert hub["startup_timeout_s"] >= 300   # a first load from a cold disk takes minutes
    rows = [lmeval.row(results.Row(kind="speed", seed=0), lmeval.LmEvalConfig.from_group(
        {"name": "hub", "tasks": ["gsm8k"], "enabled": True, "startup_timeout_s": s}), "gsm8k", "vllm") for s in (60, None)]
    assert "startup_timeout_s" not in rows[0].lm_eval_config and rows[0].run_key() == rows[1].run_key()


def test_a_crash_in_shutdown_after_the_results_keeps_them(tmp_path, caplog):
    """lm-eval's vLLM can abort while shutting down at exit (force-killed engine
    core on a busy host): the results it wrote before are complete."""
    run = fake_lm_eval(tmp_path, "WRITE; kill -ABRT $$")
    assert run()["t"]["metrics"] == {"acc": 0.5}   # sample_len is a count, not a score
    assert "stopped by SIGABRT after writing its results" in caplog.text


@pytest.mark.parametrize("then, status", [("kill -ABRT $$", -6), ("WRITE; exit 1", 1)])
def test_a_failed_lm_eval_run_is_an_error(tmp_path, then, status):
    with pytest.raises(RuntimeError, match=f"lm-eval exited with status {status}"):
        fake_lm_eval(tmp_path, then)()


def lm_eval_job(tmp_path, lm_eval_cfg):
    """A pipeline Job that runs only lm-eval (the fake one) into tmp_path/res."""
    from evaluate import pipeline
    return pipeline.Job(config=SimpleNamespace(tracker=None), seed=0, plan=None,
                        target=SimpleNamespace(path=str(tmp_path)), store=tmp_path / "res" / "results.jsonl",
                        engine=SimpleNamespace(environment=lambda env, args: contextlib.nullcontext({})),
                        engine_cfg=SimpleNamespace(env={}), limit=None, fit=[],
                        base=base_row("original", seed=0), accuracy_cfg=None,
                        lm_eval_cfg=lm_eval_cfg, lm_eval_model=SimpleNamespace(name="vllm", args={}),
                        lm_eval_versions={"vllm": "0"})


def test_a_task_lm_eval_returned_no_result_for_fails_alone_and_the_others_keep_their_scores(tmp_path):
    """A name lm-eval reports under other names (a tag, a pattern) failed the
    whole run after it: the finished task's scores were discarded with it."""
    from evaluate import pipeline
    run = fake_lm_eval(tmp_path, "WRITE", tasks=("t", "lambada"))
    job = lm_eval_job(tmp_path, run.cfg)
    pipeline._run_lm_eval(job, ["t", "lambada"])
    rows = {r.dataset: r for r in results.read(tmp_path / "res")}
    assert rows["t"].status == "ok" and rows["t"].metrics == {"acc": 0.5}
    assert rows["lambada"].status == "failed"
    assert job.failed == ["lm-eval returned no result for task 'lambada'"]


def test_a_group_without_an_aggregate_score_fails_alone_naming_the_fix(tmp_path, caplog):
    """lm-eval reports a group with no aggregate_metric_list by its alias
    alone: its row was recorded ok with no metrics, a score of nothing."""
    from evaluate import pipeline
    run = fake_lm_eval(tmp_path, "WRITE", tasks=("t", "my_group"), extra={"my_group": {"alias": "my_group",
                                                                                        "name": "my_group"}})
    job = lm_eval_job(tmp_path, run.cfg)
    pipeline._run_lm_eval(job, ["t", "my_group"])
    rows = {r.dataset: r for r in results.read(tmp_path / "res")}
    assert rows["t"].status == "ok" and rows["t"].metrics == {"acc": 0.5}
    why = ("lm-eval returned no score for 'my_group' (a group without aggregate_metric_list scores only its "
           "tasks): name its tasks in lm_eval.tasks, or give the group an aggregate_metric_list")
    assert rows["my_group"].status == "failed" and rows["my_group"].reason == why   # the stored row says why
    assert why in caplog.text


def _tagged_tasks(folder):
    """Two local tasks under one tag, as lm-eval's own tags (lambada) are."""
    folder.mkdir()
    (folder / "d.jsonl").write_text('{"q": "a", "a": "b"}\n')
    for name in ("my_a", "my_b"):
        (folder / f"{name}.yaml").write_text(
            f"tag: [my_tag]\ntask: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {folder / 'd.jsonl'}\ntest_split: test\noutput_type: loglikelihood\n"
            "doc_to_text: '{{q}}'\ndoc_to_target: ' {{a}}'\n")
    return folder


@needs_lmeval_venv
def test_a_tag_is_refused_before_anything_runs_naming_its_tasks(tmp_path):
    """lm-eval reports a tag's tasks under their own names, so a row keyed by
    the tag never completed and its run discarded gsm8k's scores."""
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["gsm8k", "my_tag"], "enabled": True,
                                          "include_path": [str(_tagged_tasks(tmp_path / "tasks"))]})
    with pytest.raises(UserError, match=r"^lm_eval.tasks: my_tag is a tag lm-eval runs as my_a, my_b, whose scores "
                                        r"are each a row of its own; name them: lm_eval.tasks=\[gsm8k,my_a,my_b\]$"):
        lmeval.validate(cfg, "vllm")


@needs_lmeval_venv
def test_lm_evals_task_manager_says_what_each_name_runs(tmp_path):
    names = ["gsm8k", "mmlu", "lambada", "my_*", "my_c"]
    runs = lmeval.task_runs(LMEVAL_PYTHON, names, [_tagged_tasks(tmp_path / "t")])
    assert runs == {"gsm8k": ["gsm8k"], "mmlu": ["mmlu"],   # a group's score comes back under its name
                    "lambada": ["lambada_openai", "lambada_standard"], "my_*": ["my_a", "my_b"], "my_c": []}


@pytest.mark.parametrize("tasks, runs, message", [
    (["my_*", "austen_lastword"], {"my_*": ["my_a", "my_b"]},
     r"^lm_eval.tasks: my_\* is a pattern lm-eval runs as my_a, my_b, .* lm_eval.tasks=\[my_a,my_b,austen_lastword\]$"),
    (["gsm8k", "my_c"], {"gsm8k": ["gsm8k"], "my_c": []}, r"^lm_eval.tasks: lm-eval has no task named my_c; check"),
])
def test_a_pattern_or_an_unknown_task_name_is_one_line(tasks, runs, message):
    with pytest.raises(UserError, match=message):
        lmeval.check_runs(tasks, runs)


def test_task_and_group_names_pass():
    lmeval.check_runs(["gsm8k", "mmlu", "austen_lastword"], {"gsm8k": ["gsm8k"], "mmlu": ["mmlu"]})


def test_lm_eval_is_given_its_model_args_as_json_and_its_own_default_seeds(tmp_path):
    """k=v,k=v broke on a dict value and a comma in the path; `--seed 0` set the
    few-shot sampler's seed to 0 where lm-eval's own default is 1234."""
    fake_lm_eval(tmp_path, "WRITE")(args={"compilation_config": {"level": 0}, "max_num_seqs": 8})
    argv = (tmp_path / "argv").read_text().split()
    model_args = json.loads(" ".join(argv[argv.index("--model_args") + 1:argv.index("--tasks")]))
    assert model_args == {"compilation_config": {"level": 0}, "max_num_seqs": 8, "pretrained": str(tmp_path)}
    assert argv[argv.index("--seed") + 1] == "0,1234,1234,1234"
    assert lmeval.seeds(3) == "3,1237,1237,1237"


def test_a_row_records_the_seeds_so_another_seed_is_measured_anew():
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["gsm8k"], "enabled": True})
    rows = [lmeval.row(results.Row(kind="speed", seed=seed), cfg, "gsm8k", "vllm") for seed in (0, 1)]
    assert rows[0].lm_eval_config["seeds"] == "0,1234,1234,1234"
    assert rows[0].measured_with() != rows[1].measured_with()


@pytest.mark.parametrize("values, message", [
    ({"tasks": "gsm8k"}, r"^lm_eval.tasks=gsm8k is one name, not a list; pass lm_eval.tasks=\[gsm8k\]$"),
    ({"include_path": "tasks"}, r"^lm_eval.include_path=tasks is one name, not a list"),
])
def test_one_name_where_a_list_belongs_is_one_line(values, message):
    with pytest.raises(UserError, match=message):   # list("gsm8k") ran five one-letter tasks
        lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["gsm8k"], "enabled": True} | values)


@pytest.mark.parametrize("values, message", [
    ({"tasks": ["gsm8k", "austen_lastword"]}, re.escape("pass lm_eval=austen_lastword lm_eval.tasks=[gsm8k,austen_lastword]")),
    ({"limit": 0}, r"^lm_eval.limit=0: pass the documents per task, an integer >= 1, or null"),
    ({"limit": -5}, r"^lm_eval.limit=-5: "),
    ({"num_fewshot": -1}, r"^lm_eval.num_fewshot=-1: pass an integer >= 0"),
    ({"batch_size": "abc"}, r"^lm_eval.batch_size=abc: pass an integer >= 1, auto or auto:N$"),
    ({"batch_size": 0}, r"^lm_eval.batch_size=0: "),
    ({"stall_timeout_s": 0}, r"^lm_eval.stall_timeout_s=0: pass seconds > 0, or null for no limit$"),
    ({"startup_timeout_s": -1}, r"^lm_eval.startup_timeout_s=-1: pass seconds > 0, or null for no limit$"),
    ({"model_args": {"pretrained": "/other"}}, r"^lm_eval.model_args.pretrained: lm-eval is given the artifact"),
])
def test_settings_lm_eval_would_fail_on_after_the_speed_runs_are_refused_first(values, message):
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["gsm8k"], "enabled": True} | values)
    with pytest.raises(UserError, match=message):
        lmeval.validate(cfg, "vllm")


@pytest.mark.parametrize("bundled, message", [
    ({"books": []}, r"^lm_eval.austen_lastword.books is empty; name at least one held-out book"),
    ({"books": None}, r"^lm_eval.austen_lastword.books is empty"),
    ({"books": ["emmma"]}, r"^unknown Austen book\(s\) \['emmma'\]"),
    ({"num_items": -1}, r"^lm_eval.austen_lastword.num_items=-1: pass an integer >= 1$"),
    ({"min_words": 0}, r"^lm_eval.austen_lastword.min_words=0: pass an integer >= 1$"),
    ({"num_items": 10 ** 6}, r"lower lm_eval.austen_lastword.num_items \(1000000\) or lm_eval.austen_lastword.min_words$"),
])
def test_the_bundled_tasks_text_is_refused_before_the_speed_runs_not_when_its_task_is_written(bundled, message):
    cfg = lmeval.LmEvalConfig.from_group({
        "name": "austen_lastword", "tasks": ["austen_lastword"], "enabled": True, "venv": "/nonexistent",
        "austen_lastword": {"text": "austen", "books": ["persuasion"], "num_items": 4, "min_words": 30} | bundled})
    with pytest.raises(UserError, match=message):
        lmeval.validate(cfg, "vllm")


@pytest.mark.parametrize("size", [1, "auto", "auto:4"])
def test_the_batch_sizes_lm_eval_takes_pass(size):
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["gsm8k"], "enabled": True, "batch_size": size,
                                          "venv": "/nonexistent"})
    with pytest.raises(UserError, match="no lm-eval environment"):   # the next check: the counts passed
        lmeval.validate(cfg, "vllm")


def test_the_bundled_task_on_an_edited_local_text_is_measured_anew(tmp_path):
    """lm_eval.austen_lastword.text=<file> was keyed by the path: an edited
    file's old scores were taken as complete."""
    text = tmp_path / "paragraphs.txt"
    text.write_text("One paragraph of a text.\n")
    cfg = lmeval.LmEvalConfig.from_group({"name": "austen_lastword", "tasks": ["austen_lastword"], "enabled": True,
                                          "austen_lastword": {"text": str(text), "books": [], "num_items": 2,
                                                              "min_words": 3}})
    key = lambda: lmeval.row(results.Row(kind="speed", seed=0), cfg, "austen_lastword", "vllm").run_key()
    before = key()
    assert key() == before
    text.write_text("Another paragraph of a text.\n")
    assert key() != before


def test_an_edited_include_path_task_is_measured_anew(tmp_path):
    """The key held the include_path folders' paths alone: editing a task's
    YAML (or the Python it names) reused the old task's scores."""
    folder = _user_task(tmp_path / "my_tasks")
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["my_capitals"], "enabled": True,
                                          "include_path": [str(folder)]})
    key = lambda: lmeval.row(results.Row(kind="speed", seed=0), cfg, "my_capitals", "vllm").run_key()
    before = key()
    (folder / "notes.txt").write_text("not a task file")
    assert key() == before
    task = folder / "my_capitals.yaml"
    task.write_text(task.read_text().replace("doc_to_target: ' {{a}}'", "doc_to_target: '{{a}}'"))
    edited = key()
    assert edited != before
    (folder / "utils.py").write_text("def process_docs(dataset):\n    return dataset\n")
    assert key() != edited
    plain = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["gsm8k"], "enabled": True})
    assert "include_path_sha256" not in plain.recorded("gsm8k")   # rows without include_path keep their key


def test_an_include_path_tasks_local_data_and_included_yaml_are_part_of_its_key(tmp_path):
    """Only the folders' .yaml/.py files were hashed: editing the JSONL a task
    reads (or a YAML outside the folder it includes) reused the old scores.
    Files no task names (notes, an editor's backup) still leave the key alone."""
    folder = _user_task(tmp_path / "my_tasks")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "base.yaml").write_text("output_type: loglikelihood\n")
    (shared / "part-1.jsonl").write_text('{"q": "x", "a": "y"}\n')
    (folder / "more.yaml").write_text(f"include: {shared / 'base.yaml'}\ntask: my_more\ndataset_path: json\n"
                                      f"dataset_kwargs:\n  data_files: [{shared / 'part-*.jsonl'}]\n")
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["my_capitals"], "enabled": True,
                                          "include_path": [str(folder)]})
    key = lambda: _key(cfg, "my_capitals")
    before = key()
    (folder / "README.md").write_text("notes")
    (folder / "my_capitals.yaml~").write_text("an editor's backup")
    (shared / "unrelated.jsonl").write_text("{}\n")
    assert key() == before
    for edit in (folder / "capitals.jsonl", shared / "base.yaml", shared / "part-1.jsonl"):
        edit.write_text(edit.read_text() + "\n")
        assert key() != before, edit.name
        before = key()
    (shared / "part-2.jsonl").write_text('{"q": "x", "a": "z"}\n')   # a new file the pattern takes
    assert key() != before


def test_an_extension_less_template_a_task_includes_is_part_of_its_key(tmp_path):
    """lm-eval's usual template beside its tasks (mmlu's _default_template_yaml)
    is no .yaml file of the folder but an included one: docs/accuracy.md says
    rows stored before includes were hashed are measured once more."""
    folder = tmp_path / "my_tasks"
    folder.mkdir()
    template = folder / "_default_template_yaml"
    template.write_text("output_type: loglikelihood\ndataset_path: cais/mmlu\n")
    (folder / "t1.yaml").write_text("include: _default_template_yaml\ntask: my_t1\n")
    assert lmeval.named_files([str(folder)]) == [template]
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["my_t1"], "enabled": True,
                                          "include_path": [str(folder)]})
    before = _key(cfg, "my_t1")
    template.write_text(template.read_text() + "num_fewshot: 5\n")
    assert _key(cfg, "my_t1") != before


def test_a_named_data_file_is_read_once_per_process_and_an_edit_is_still_seen(tmp_path, monkeypatch):
    """Each task's row key hashed its data files anew, several times per job
    and on a rerun with nothing to do: a multi-GB data_dir was read ~12 times.
    The hash is kept per (path, size, mtime_ns): an edited file is read again."""
    import os
    folder = _user_task(tmp_path / "my_tasks")
    data = folder / "capitals.jsonl"
    reads = []
    hash_files = lmeval.sha256_files
    monkeypatch.setattr(lmeval, "sha256_files", lambda paths: reads.extend(paths) or hash_files(paths))
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["my_capitals"], "enabled": True,
                                          "include_path": [str(folder)]})
    before = _key(cfg, "my_capitals")
    assert _key(cfg, "my_capitals") == before and reads == [data]
    stat = data.stat()
    data.write_text(data.read_text().replace("Paris", "Lyon!"))   # same size, a later mtime
    assert data.stat().st_size == stat.st_size
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    edited = _key(cfg, "my_capitals")
    assert edited != before and reads == [data, data]
    data.write_text(data.read_text() + "\n")   # a new size
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))   # the same mtime as the last edit
    assert _key(cfg, "my_capitals") != edited


def _broken_data(folder):
    """The task's data file a symlink to a file that is gone."""
    data = folder / "capitals.jsonl"
    data.unlink()
    data.symlink_to(folder / "moved.jsonl")
    return rf"^lm_eval.include_path: cannot read {data} \(a broken symlink to {folder / 'moved.jsonl'}\), which its " \
           r"tasks read \(hashed into their rows' key\); point the link at the file, or remove it$"


def _broken_in_data_dir(folder):
    """data_dir's folder holding a broken symlink (a glob's match is another)."""
    (folder / "data").mkdir()
    (folder / "data" / "part-1.jsonl").symlink_to(folder / "gone.jsonl")
    (folder / "more.yaml").write_text(f"task: my_more\ndataset_path: json\ndata_dir: {folder / 'data'}\n")
    return rf"^lm_eval.include_path: cannot read {folder / 'data' / 'part-1.jsonl'} \(a broken symlink to "


def _unreadable_data(folder, monkeypatch):
    """What reading a chmod 000 data file answers (root ignores chmod)."""
    data = folder / "capitals.jsonl"

    def denied(paths):
        raise PermissionError(13, "Permission denied", str(paths[0]))
    monkeypatch.setattr(lmeval, "sha256_files", denied)
    return rf"^lm_eval.include_path: cannot read {data} \(permission denied\), .*; make it readable by this user " \
           rf"\(chmod a\+r {data}\)$"


def _included_folder(folder):
    (folder / "shared").mkdir()
    (folder / "more.yaml").write_text("include: shared\ntask: my_more\n")
    return rf"^lm_eval.include_path: {folder / 'more.yaml'} includes {folder / 'shared'}, a folder; name a YAML file"


@pytest.mark.parametrize("make", [_broken_data, _broken_in_data_dir, _unreadable_data, _included_folder])
def test_a_file_an_include_path_task_reads_that_cannot_be_read_is_one_line_before_anything_runs(
        tmp_path, monkeypatch, make):
    """The rows' key hashes the tasks' data: an unreadable file ended the job
    with a traceback (PermissionError), or a broken link was left out of the
    key; lm-eval failed on it after the speed runs."""
    folder = _user_task(tmp_path / "my_tasks")
    message = make(folder, monkeypatch) if make is _unreadable_data else make(folder)
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["my_capitals"], "enabled": True,
                                          "include_path": [str(folder)], "venv": "/nonexistent"})
    with pytest.raises(UserError, match=message):
        _key(cfg, "my_capitals")
    with pytest.raises(UserError, match=message):   # before the environment's checks, or any engine
        lmeval.validate(cfg, "vllm")


@pytest.mark.needs_vllm  # the default engine's argument check comes first
def test_an_include_path_tasks_broken_data_link_ends_the_job_with_one_line_and_exit_2(tiny_model, tmp_path):
    folder = _user_task(tmp_path / "my_tasks")
    _broken_data(folder)
    venv = probing_lm_eval(tmp_path, """echo '{"my_capitals": ["my_capitals"]}'""")
    out = run_evaluate(f"model={tiny_model}", "scenario=none", "accuracy=none", f"results_dir={tmp_path / 'res'}",
                       "lm_eval=hub", f"lm_eval.venv={venv}", "lm_eval.tasks=[my_capitals]",
                       f"lm_eval.include_path=[{folder}]", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith(
        f"cannot read {folder / 'capitals.jsonl'} (a broken symlink to {folder / 'moved.jsonl'}), which its tasks read "
        "(hashed into their rows' key); point the link at the file, or remove it")
    assert "Traceback" not in out.stderr and not (tmp_path / "res" / "results.jsonl").exists()


def _key(cfg, task):
    return lmeval.row(results.Row(kind="speed", seed=0), cfg, task, "vllm").run_key()


def test_a_hub_tasks_key_does_not_depend_on_the_bundled_task_being_listed(tmp_path):
    """The bundled task's local text was hashed into every task's key when it
    was listed: adding austen_lastword re-measured gsm8k."""
    text = tmp_path / "paragraphs.txt"
    text.write_text("One paragraph of a text.\n")
    cfg = lambda tasks: lmeval.LmEvalConfig.from_group(
        {"name": "austen_lastword", "tasks": tasks, "enabled": True,
         "austen_lastword": {"text": str(text), "books": [], "num_items": 2, "min_words": 3}})
    assert _key(cfg(["gsm8k"]), "gsm8k") == _key(cfg(["gsm8k", "austen_lastword"]), "gsm8k")
    before = _key(cfg(["gsm8k", "austen_lastword"]), "austen_lastword")
    text.write_text("Another paragraph of a text.\n")
    assert _key(cfg(["gsm8k", "austen_lastword"]), "austen_lastword") != before


def test_editing_an_include_path_task_leaves_the_other_tasks_rows_complete(tmp_path):
    """include_path_sha256 was in every task's key: editing one YAML of
    include_path re-measured the hub tasks (hours on a CPU)."""
    folder = _user_task(tmp_path / "my_tasks")
    (folder / "group.yaml").write_text("group: my_group\ntask:\n  - task: my_nested\n    process_docs: "
                                       "!function utils.process_docs\n  - my_capitals\n")
    cfg = lmeval.LmEvalConfig.from_group({"name": "hub", "tasks": ["gsm8k", "my_capitals", "my_group", "my_nested"],
                                          "enabled": True, "include_path": [str(folder)]})
    before = {task: _key(cfg, task) for task in cfg.tasks}
    task = folder / "my_capitals.yaml"
    task.write_text(task.read_text() + "# edited\n")
    after = {task: _key(cfg, task) for task in cfg.tasks}
    assert after["gsm8k"] == before["gsm8k"]
    assert all(after[t] != before[t] for t in ("my_capitals", "my_group", "my_nested"))
    assert "include_path_sha256" in cfg.recorded("my_capit*")   # a pattern lm-eval expands
    (folder / "broken.yaml").write_text("task: [unclosed\n")   # could define any task: all carry the hash
    assert "include_path_sha256" in cfg.recorded("gsm8k")


# lm_eval_config of a gsm8k row as lm_eval=hub stored it before rows hashed task files (no include_path)
OLD_HUB_GSM8K = {"name": "hub", "tasks": ["gsm8k"], "venv": None, "num_fewshot": 5, "limit": None,
                 "batch_size": "auto", "apply_chat_template": False, "include_path": [], "model_args": {},
                 "enabled": True, "seeds": "0,1234,1234,1234"}


@pytest.mark.parametrize("change", ["none", "include_path", "austen_preset", "austen_num_items"])
def test_a_hub_tasks_stored_row_stays_complete_whatever_include_path_and_the_bundled_task_hold(tmp_path, change):
    """Every task's key held the include_path folders and the bundled task's
    settings: adding a folder of one's own tasks, switching to
    lm_eval=austen_lastword or editing its num_items re-measured gsm8k (hours
    on a CPU). A gsm8k row stored by an older version stays complete too."""
    hub = yaml.safe_load((PROJECT_ROOT / "conf/lm_eval/hub.yaml").read_text())
    austen = yaml.safe_load((PROJECT_ROOT / "conf/lm_eval/austen_lastword.yaml").read_text())
    austen = {k: v for k, v in austen.items() if k != "defaults"} | {"num_fewshot": 5}
    group = {"none": hub,
             "include_path": hub | {"include_path": [str(_user_task(tmp_path / "my_tasks"))],
                                    "tasks": ["gsm8k", "my_capitals"]},
             "austen_preset": hub | austen | {"tasks": ["gsm8k", "austen_lastword"]},
             "austen_num_items": hub | austen | {"austen_lastword": austen["austen_lastword"] | {"num_items": 8}},
             }[change]
    base = results.Row(kind="speed", seed=0, artifact_id="a1", recipe="w4a16", engine="vllm", setup_id="s1",
                       lm_eval_versions={"lm_eval": "0.4.9"})
    new = lmeval.row(base, lmeval.LmEvalConfig.from_group(group), "gsm8k", "vllm")
    old = lmeval.row(base, lmeval.LmEvalConfig.from_group(hub), "gsm8k", "vllm").but(
        lm_eval_config=OLD_HUB_GSM8K, status="ok", metrics={"exact_match": 0.4})
    results.append(tmp_path / "results.jsonl", old)
    assert [r.run_key() for r in results.read(tmp_path) if r.ok] == [new.run_key()]
    assert "austen_lastword" not in new.lm_eval_config and new.lm_eval_config["include_path"] == []


def test_gsm8k_beside_the_shipped_austen_preset_is_another_measurement():
    """The preset is 0-shot where hub is 5-shot: its gsm8k is not hub's row."""
    hub = yaml.safe_load((PROJECT_ROOT / "conf/lm_eval/hub.yaml").read_text())
    austen = yaml.safe_load((PROJECT_ROOT / "conf/lm_eval/austen_lastword.yaml").read_text())
    austen = {k: v for k, v in austen.items() if k != "defaults"}
    base = results.Row(kind="speed", seed=0, artifact_id="a1", recipe="w4a16", engine="vllm", setup_id="s1",
                       lm_eval_versions={"lm_eval": "0.4.9"})
    of = {name: lmeval.row(base, lmeval.LmEvalConfig.from_group(group), "gsm8k", "vllm")
          for name, group in (("hub", hub), ("austen", hub | austen | {"tasks": ["gsm8k", "austen_lastword"]}))}
    assert of["hub"].run_key() != of["austen"].run_key()
    assert (of["hub"].lm_eval_config["num_fewshot"], of["austen"].lm_eval_config["num_fewshot"]) == (5, 0)


def test_the_bundled_tasks_stored_row_on_austen_stays_complete():
    """austen_lastword's row keeps its settings: the row lm_eval=austen_lastword
    stored before rows hashed task files is still its key."""
    hub = yaml.safe_load((PROJECT_ROOT / "conf/lm_eval/hub.yaml").read_text())
    austen = yaml.safe_load((PROJECT_ROOT / "conf/lm_eval/austen_lastword.yaml").read_text())
    group = hub | {k: v for k, v in austen.items() if k != "defaults"}
    stored = {k: v for k, v in group.items() if k not in ("stall_timeout_s", "startup_timeout_s")} | {"seeds": "0,1234,1234,1234"}
    new = lmeval.row(results.Row(kind="speed", seed=0), lmeval.LmEvalConfig.from_group(group), "austen_lastword", "vllm")
    assert new.measured_with() == new.but(lm_eval_config=stored).measured_with()
    assert stored["austen_lastword"]["num_items"] == 256 and stored["include_path"] == []
