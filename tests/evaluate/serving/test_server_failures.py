"""A server that fails a batch run, against `python -m evaluate engine=openai`
(the fake server of fake_server.py in its own process): an HTTP 500 is tried
again (engine.retries, with a growing pause) and measured; one it keeps
failing, or a stream it cuts off, fails that run only, and the next runs. The
job then ends in one line and exit 4, with a failed row per failed run, which
the same command measures again and nothing else. A server that dies ends
the job: exit 3, a failed row per run still owed."""
import pytest

from quantize.common.errors import ExitCode
from tests.conftest import tail
from tests.evaluate.serving.test_run import evaluate, rows

SHAPE = ("scenario.input_len=16", "scenario.output_len=4", "runs=3", "warmup_runs=1")


def on_openai(server) -> tuple[str, ...]:
    return ("engine=openai", f"engine.base_url={server.base_url}", "engine.retry_backoff_s=0.1", *SHAPE)


def statuses(tmp_path) -> list[tuple[int, str]]:
    return sorted((r["run_index"], r["status"]) for r in rows(tmp_path))


def one_error_line(proc) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    return line


def test_an_http_500_is_tried_again_and_the_run_measured(tmp_path, tiny_model, fake_server):
    """Request 0 is the warm-up; request 1, run 0's first try, gets HTTP 500."""
    server = fake_server("--fixed-ms", "2", "--fail-from", "1", "--fail-to", "1")
    proc = evaluate(tmp_path, tiny_model, *on_openai(server))
    assert proc.returncode == 0, tail(proc)
    assert statuses(tmp_path) == [(0, "ok"), (1, "ok"), (2, "ok")]
    assert "HTTP 500: " in proc.stdout and "running it again in 0.1 s (engine.retries=2)" in proc.stdout
    assert server.stats()["requests"] == 5


def test_a_run_the_server_keeps_failing_fails_after_its_retries_and_the_next_runs(tmp_path, tiny_model,
                                                                                   fake_server):
    """Requests 1-3 (run 0 and its two retries) get HTTP 500."""
    server = fake_server("--fixed-ms", "2", "--fail-from", "1", "--fail-to", "3")
    proc = evaluate(tmp_path, tiny_model, *on_openai(server))
    assert proc.returncode == ExitCode.RUNS_FAILED, tail(proc)
    assert statuses(tmp_path) == [(0, "failed"), (1, "ok"), (2, "ok")]
    failed = next(r for r in rows(tmp_path) if r["status"] == "failed")
    assert failed["reason"] == (f"request to {server.base_url} failed: HTTP 500: "
                                '{"error": {"message": "injected failure"}} (3 tries, engine.retries=2); '
                                "the server's log says why")
    assert one_error_line(proc) == (f"error: 1 run(s) failed while the others were measured (the first: "
                                    f"{failed['reason']}); they are recorded failed in "
                                    f"{tmp_path / 'results' / 'results.jsonl'}: once the cause is fixed, the same "
                                    "command measures only them")


def test_a_stream_cut_off_fails_its_run_and_the_same_command_measures_only_it(tmp_path, tiny_model, fake_server):
    """Request 2 (run 1) gets one token, then the server drops the connection."""
    server = fake_server("--fixed-ms", "2", "--break-from", "2", "--break-to", "2")
    proc = evaluate(tmp_path, tiny_model, *on_openai(server), "engine.retries=0")
    assert proc.returncode == ExitCode.RUNS_FAILED, tail(proc)
    assert statuses(tmp_path) == [(0, "ok"), (1, "failed"), (2, "ok")]
    failed = next(r for r in rows(tmp_path) if r["status"] == "failed")
    assert failed["reason"].startswith(f"request to {server.base_url} failed: the server closed the stream after "
                                       "1 token(s) (")
    assert failed["reason"].endswith("(engine.retries=0: raise it to run such a run again)")
    assert one_error_line(proc).startswith("error: 1 run(s) failed while the others were measured")
    again = evaluate(tmp_path, tiny_model, *on_openai(server), "engine.retries=0")
    assert again.returncode == 0, tail(again)
    assert [(r["run_index"], r["status"]) for r in rows(tmp_path)[3:]] == [(1, "ok")]
    assert server.stats()["requests"] == 4 + 2   # the first job's, then a warm-up and run 1


@pytest.mark.needs_vllm
def test_a_server_without_prompt_logprobs_fails_the_accuracy_pass_in_one_line(tmp_path, tiny_model, fake_server):
    """A server other than vLLM's ignores `prompt_logprobs`: the pass ended in a bare KeyError."""
    server = fake_server("--fixed-ms", "2", "--no-prompt-logprobs")
    proc = evaluate(tmp_path, tiny_model, *on_openai(server), "accuracy=austen", "accuracy.num_windows=1",
                    "accuracy.window_len=64", "accuracy.lastword.num_items=2")
    assert proc.returncode == ExitCode.RUNS_FAILED, tail(proc)
    accuracy = next(r for r in rows(tmp_path) if r["kind"] == "accuracy")
    assert accuracy["status"] == "failed"
    assert accuracy["reason"].endswith("the server gives no prompt_logprobs (vLLM's OpenAI server does); "
                                       "pass accuracy=none")
    assert accuracy["reason"] in one_error_line(proc)
    assert {r["status"] for r in rows(tmp_path) if r["kind"] == "speed"} == {"ok"}  # the speed runs are measured


def test_a_server_that_dies_mid_scenario_records_a_failed_row_per_owed_run(tmp_path, tiny_model):
    """The server evaluate started exits when request 3 (run 1) arrives: 0 is its start-up warm-up."""
    proc = evaluate(tmp_path, tiny_model, "engine=fake_server", *SHAPE, "runs=4",
                    fake_flags=["--fixed-ms", "2", "--die-after", "3"])
    assert proc.returncode == ExitCode.ENGINE_DIED, tail(proc)
    assert statuses(tmp_path) == [(0, "ok"), (1, "failed"), (2, "failed"), (3, "failed")]
    line = one_error_line(proc)
    assert line.startswith("error: server died: the vLLM server exited with code 3: ")
    assert line.endswith("; what it owed is recorded failed, and once it serves again the same command measures that")
    assert all(r["reason"] == line.removeprefix("error: ") for r in rows(tmp_path) if r["status"] == "failed")
