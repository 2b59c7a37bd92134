"""What every server engine shares, whoever started the server: HTTP GET on
loopback, and the batch scenarios and prompt logprobs over the
OpenAI-compatible /v1/completions (evaluate.serving.client).

`VllmServerEngine` (a server evaluate starts) and `OpenAIEngine` (one that
is already running) both mix `HttpEngine` in; neither knows the other."""
import asyncio
import json
import time
import urllib.error
import urllib.request

from evaluate.engines.base import RunFailed
from evaluate.memory import PeakMemory
from evaluate.metrics import RequestTiming
from evaluate.serving import client

# Seconds a streamed request may go without a token (engine.stall_timeout_s in
# conf/engine/openai.yaml and vllm_server.yaml; this one where a config lacks it).
# A decode step, or a prefill chunk, takes seconds here even on 2 CPU cores.
STALL_TIMEOUT_S = 30.0


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answers. No proxy: loopback."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except (OSError, urllib.error.URLError):
        return 0, b""


class HttpEngine:
    """What a server engine adds to the Engine interface (mixed in): where it
    answers, and the batch scenarios and prompt logprobs over HTTP."""
    serves_http = True
    base_url: str = ""
    model: str = ""
    server_pid: int | None = None    # the server process (its tree's memory is measured); None: remote

    def alive(self) -> str | None:
        """None while the server can serve, else why not (one line)."""
        return None

    @property
    def stall_timeout_s(self) -> float:
        """Seconds without a streamed token before a request fails as stalled."""
        return float(self.settings.get("stall_timeout_s") or STALL_TIMEOUT_S)

    @classmethod
    def import_libraries(cls, target) -> None:
        """Nothing: the server is a process of its own."""

    def peak_memory(self) -> PeakMemory:
        """The server's process tree, whole; nothing for a remote server."""
        return PeakMemory(pid=self.server_pid, remote=self.server_pid is None)

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True):
        """All prompts at once, streamed (the batch scenarios). A stalled
        stream fails this run only (RunFailed): the next may be served."""
        start = time.perf_counter()
        results = asyncio.run(client.complete_all(self.base_url, self.model, prompts, output_len,
                                                  self.stall_timeout_s))
        failed = next((r for r in results if not r.success), None)
        if failed is not None:
            error = RunFailed if failed.stalled else RuntimeError
            raise error(f"request to {self.base_url} failed: {failed.error or 'no tokens'}")
        return start, [as_timing(r) for r in results]

    def prompt_logprobs(self, prompts: list[list[int]], k: int):
        """/v1/completions with vLLM's `prompt_logprobs` extra parameter."""
        return asyncio.run(client.prompt_logprobs_all(self.base_url, self.model, prompts, k))

    def server_versions(self) -> dict[str, str]:
        """The server's own version, where it says (vLLM's /version)."""
        status, body = http_get(self.base_url.rstrip("/").removesuffix("/v1") + "/version")
        if status == 200:
            try:
                return {"vllm": str(json.loads(body)["version"])}
            except (ValueError, KeyError, TypeError):
                pass
        return {}


def as_timing(r) -> RequestTiming:
    """A streamed request as the batch metrics read it: one token per chunk,
    any difference from the server's usage count put on the last chunk."""
    chunks = [(t, 1) for t in r.chunk_times]
    extra = r.generated_tokens - len(chunks)
    if chunks and extra:
        chunks[-1] = (chunks[-1][0], max(1, 1 + extra))
    return RequestTiming(start=r.sent, prompt_tokens=r.prompt_tokens, chunks=chunks)
