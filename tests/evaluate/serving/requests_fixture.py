"""Synthetic load levels with timings chosen so the metrics can be computed by hand."""
from evaluate.serving.requests import LevelRun, RequestResult


def request(sent: float, ttft: float, gaps: list[float], prompt: int = 8, tokens: int | None = None,
            scheduled: float | None = None, error: str | None = None, done_after: float = 0.0) -> RequestResult:
    """A request sent at `sent`, first chunk `ttft` s later, then one chunk per gap; its [DONE] arrives
    `done_after` s after its last chunk."""
    if error:
        return RequestResult(sent=sent, scheduled=scheduled, prompt_tokens=prompt, error=error)
    times = [sent + ttft]
    for g in gaps:
        times.append(times[-1] + g)
    return RequestResult(sent=sent, scheduled=scheduled, prompt_tokens=prompt,
                         output_tokens=len(times) if tokens is None else tokens, chunk_times=times, end=times[-1] + done_after)


def three_requests() -> LevelRun:
    """Two completed requests and one failed, over 4 s.

    r1: sent 0.0, ttft 0.5, 3 gaps of 0.1 -> 4 tokens, e2el 0.8, tpot 0.1
    r2: sent 1.0, ttft 1.0, 1 gap of 0.4  -> 2 tokens, e2el 1.4, tpot 0.4
    r3: sent 2.0, failed
    """
    return LevelRun(mode="concurrency", level=2, start=0.0, end=4.0, client_cpu_s=0.4,
                    server_peak_memory_bytes=123_000_000,
                    results=[request(0.0, 0.5, [0.1, 0.1, 0.1], prompt=10),
                             request(1.0, 1.0, [0.4], prompt=20),
                             request(2.0, 0.0, [], error="HTTP 500")])
