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
