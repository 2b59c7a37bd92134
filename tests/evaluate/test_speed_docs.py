"""What docs/evaluate.md and docs/benchmarks.md say about comparing batch
rows with vLLM's own benchmarks holds: the comparison with `vllm bench
latency` turns prefix caching off on both sides, as the script that measured
the parity figure does."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "evaluate.md", ROOT / "docs" / "benchmarks.md"]


def claims(page: Path) -> list[str]:
    """Its paragraphs and table rows that compare with `vllm bench latency`."""
    units = [u for p in re.split(r"\n\s*\n", page.read_text())
             for u in (p.splitlines() if p.lstrip().startswith("|") else [p])]
    return [" ".join(u.split()) for u in units
            if "`vllm bench latency`" in u and re.search(r"against|compare|\bvs\b", u, re.I)]


def test_every_comparison_with_vllm_bench_latency_turns_prefix_caching_off_on_both_sides():
    """That tool sends its prompts every iteration: with the cache on its timed
    prefills are cache hits, and engine=vllm keeps vLLM's default, on."""
    found = [c for page in DOCS for c in claims(page)]
    assert len(found) >= 3   # the parity figure, the script's row, evaluate.md's metrics
    for c in found:
        assert re.search(r"prefix cach(e|ing) off on both sides", c), c[:200]
    for c in (c for c in found if "0.95" in c or "Metrics" in c or "To compare" in c):
        assert "--no-enable-prefix-caching" in c and "engine.args.enable_prefix_caching=false" in c, c[:200]
    script = (ROOT / "scripts" / "bench_evaluate.py").read_text()
    assert '"--no-enable-prefix-caching"' in script and '"engine.args.enable_prefix_caching=false"' in script


def test_the_batch_metric_names_and_their_vllm_counterparts_are_the_ones_rows_hold():
    """Batch rows name a statistic after the quantity (ttft_ms_p50), vllm bench
    serve and the serving rows before it (median_ttft_ms): the docs give the
    correspondence, each side a key its rows really hold."""
    from evaluate.metrics import RequestTiming, summarize
    from evaluate.serving.metrics import level_metrics
    from evaluate.serving.requests import LevelRun, RequestResult
    batch = summarize([RequestTiming(0.0, 4, [(0.1 * (k + 1), 1) for k in range(4)])], 0.0, 1000)
    done = RequestResult(sent=0.0, prompt_tokens=4, output_tokens=4, chunk_times=[0.1, 0.2, 0.3, 0.4], end=0.5)
    serving = level_metrics(LevelRun(mode="synchronous", level=None, start=0.0, end=1.0, results=[done]))
    section = " ".join((ROOT / "docs" / "evaluate.md").read_text().split("## Metrics per run")[1]
                       .split("\n## ")[0].split())
    assert "names as in `vllm bench`" not in section
    pairs = re.findall(r"`(\w+)` (?:is )?its `(\w+)`", section)
    assert {b.split("_ms")[0] for b, _ in pairs} == {"ttft", "tpot", "itl"}
    for ours, theirs in pairs:
        assert ours in batch and theirs in serving, (ours, theirs)
        assert ours.split("_")[0] == theirs.split("_")[1]   # the same quantity
