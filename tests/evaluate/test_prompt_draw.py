"""Every scenario of a job draws prompts of its own, in batch runs and load
levels alike: one engine serves them all, and vLLM's prefix cache (on by
default) would serve a scenario whose prompts an earlier one sent without
prefill (its TTFT too low, its throughput too high). A server that outlives
the job (engine=openai) gets a salt as well, recorded in the row."""
import time
from contextlib import contextmanager
from types import SimpleNamespace

from evaluate import batch
from evaluate.metrics import RequestTiming
from evaluate.precision import RunPlan
from evaluate.results import Row
from evaluate.scenarios import Scenario
from evaluate.serving import run as serving
from evaluate.serving.profiles import Concurrency
from evaluate.serving.requests import LevelRun, RequestResult

# the same batch size and input length, as interactive and a length grid's or ladder's scenarios have
SCENARIOS = [Scenario("interactive", 1, 128, 64), Scenario("ctx128", 1, 128, 16), Scenario("my_long_out", 1, 128, 512)]


class CachingEngine:
    """Remembers every prompt it served, as a prefix cache does."""
    remote = False

    def __init__(self):
        self.seen: set[tuple] = set()
        self.cached: list[tuple] = []   # (scenario output_len, prompt) served from what an earlier run sent

    def run(self, prompts, output_len, stream=True):
        start = time.perf_counter()
        timings = []
        for p in prompts:
            if tuple(p) in self.seen:
                self.cached.append((output_len, tuple(p)))
            self.seen.add(tuple(p))
            timings.append(RequestTiming(start, len(p), [(start + 0.01 * (k + 1), 1) for k in range(output_len)]))
        return start, timings

    @contextmanager
    def peak_memory(self):
        yield SimpleNamespace(as_metrics=lambda: {})


class Job:
    def __init__(self, load=None):
        self.plan = RunPlan(runs=2, min_runs=2, max_runs=2, target_ci_pct=5, warmup_runs=1,
                            warmup_tolerance_pct=5, max_warmup_runs=3)
        self.seed, self.load, self.slo = 0, load, None
        self.target = SimpleNamespace(config={"vocab_size": 49152}, model_bytes=1000)
        self.base = Row(kind="speed", artifact_id="a", engine="fake", setup_id="s")
        self.rows: list[Row] = []

    def speed_row(self, s, i):
        return self.base.but(**s.as_row(), run_index=i)

    def record(self, row, status, **fields):
        self.rows.append(row.but(status=status, **fields))


def test_batch_scenarios_of_one_shape_draw_their_own_prompts():
    job, engine = Job(), CachingEngine()
    for s in SCENARIOS:
        batch.pending_runs(job, s, []).measure(job, engine, s)
    assert [r.status for r in job.rows] == ["ok"] * 6
    assert engine.cached == []   # no warm-up or timed run sent a prompt an earlier one had
    assert {str(r.prompts) for r in job.rows} == {"{'per': 'scenario'}"}   # tells these rows from older ones


def test_a_server_that_outlives_the_job_gets_prompts_no_earlier_job_sent():
    """Two invocations against one long-running server: the second's prompts
    are new to it, and each row records the salt they were drawn with."""
    from evaluate.scenarios import PromptDraw
    engine = CachingEngine()
    engine.remote = True
    jobs = [Job(), Job()]
    for job in jobs:
        batch.pending_runs(job, SCENARIOS[0], []).measure(job, engine, SCENARIOS[0])
    assert engine.cached == []
    salts = [r.prompts["salt"] for job in jobs for r in job.rows]
    assert len(set(salts[:2])) == 1 and salts[0] != salts[2]   # one per measurement
    again = batch.prompts(SCENARIOS[0], 0, 0, 49152, PromptDraw(salts[0]))
    assert tuple(again[0]) in engine.seen   # the row's salt draws its prompts again


def test_load_levels_of_scenarios_of_one_input_length_draw_their_own_prompts(monkeypatch):
    sent: list[tuple] = []

    def run_level(base_url, model, level, prompts, output_len, *args, **kwargs):
        sent.extend((output_len, tuple(p)) for p in prompts)
        results = [RequestResult(sent=0.0, prompt_tokens=len(p), output_tokens=output_len,
                                 chunk_times=[0.1 + 0.01 * k for k in range(output_len)], end=1.0) for p in prompts]
        return LevelRun(mode=level.mode, level=level.level, start=0.0, end=1.0, results=results)

    monkeypatch.setattr(serving, "run_level", run_level)
    job = Job(Concurrency(name="concurrency", levels=[1, 2], max_requests=4, max_seconds=30))
    engine = SimpleNamespace(base_url="", model="m", alive=lambda: None, server_pid=None, stall_timeout_s=None,
                             remote=False)
    for s in SCENARIOS:
        serving.LoadPending(job, s, []).measure(job, engine, s)
    assert [r.status for r in job.rows] == ["ok"] * 6
    assert len({p for _, p in sent}) == len(sent) == 24   # no prompt sent twice, in any level or scenario
    assert all(r.prompts == {"per": "scenario"} for r in job.rows)
