"""What the client measured: the contract between the load generator
(load.py, client.py) and the metrics (metrics.py, slo.py).

Times are time.perf_counter() seconds of the client process."""
from dataclasses import dataclass, field


@dataclass
class RequestResult:
    """One request of a load level."""
    sent: float                         # when the client sent it
    scheduled: float | None = None      # open loop: when the arrival schedule said to send it
    prompt_tokens: int = 0              # from the server's `usage`
    output_tokens: int = 0              # from the server's `usage` (0 when it failed or sent none)
    chunk_times: list[float] = field(default_factory=list)  # arrival of every streamed chunk with tokens
    end: float | None = None            # when the response completed
    error: str | None = None            # None: success
    connection_lost: bool = False       # refused, reset or cut off: the server may have died
    stalled: bool = False               # no token to any request for the engine's stall_timeout_s: the server hangs
    status: int | None = None           # the HTTP status of a response that was not 200
    broken: bool = False                # the stream ended before [DONE]: cut off mid-response

    @property
    def success(self) -> bool:
        return self.error is None and self.end is not None and bool(self.chunk_times)

    @property
    def retryable(self) -> bool:
        """A failure the same request may not meet again: the server's own
        error (5xx), its "too many requests" (429), a connection cut mid-way.
        Not a stall (it already waited), nor a request it refuses (4xx)."""
        return (self.status is not None and (self.status >= 500 or self.status == 429)) or self.broken \
            or self.connection_lost

    @property
    def generated_tokens(self) -> int:
        """The server's count; one token per chunk from a server that sends no `usage`."""
        return self.output_tokens or len(self.chunk_times)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def last_token(self) -> float | None:
        """When the last token chunk arrived: where vllm bench's client ends a
        request's latency (the usage chunk and [DONE] come after)."""
        return self.chunk_times[-1] if self.success else None

    @property
    def tpot_s(self) -> float | None:
        """vLLM's rule: (e2el - ttft) / (output tokens - 1); None below 2 tokens."""
        if not self.success or self.generated_tokens < 2:
            return None
        return (self.last_token - self.chunk_times[0]) / (self.generated_tokens - 1)

    @property
    def itl_s(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def e2el_s(self) -> float | None:
        return self.last_token - self.sent if self.success else None

    @property
    def send_lag_s(self) -> float | None:
        """Open loop: how late the client sent it against the schedule (its own queueing)."""
        return None if self.scheduled is None else max(0.0, self.sent - self.scheduled)


@dataclass
class LevelRun:
    """One load level as run: its requests and what the client saw around them."""
    mode: str                           # "synchronous" | "concurrency" | "rate"
    level: float | None                 # in-flight requests (concurrency), req/s (rate), None (synchronous)
    start: float
    end: float
    results: list[RequestResult] = field(default_factory=list)
    burstiness: float | None = None     # rate: gamma shape (1.0 = Poisson)
    output_len: int | None = None       # the tokens each request asked for (max_tokens = min_tokens, ignore_eos)
    client_cpu_s: float | None = None   # CPU seconds the client process used during the level
    server_peak_memory_bytes: int | None = None
    stopped_by: str | None = None       # "max_requests" | "max_seconds" | "server died" ...

    @property
    def duration_s(self) -> float:
        return self.end - self.start
