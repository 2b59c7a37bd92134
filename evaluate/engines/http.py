"""What every server engine shares, whoever started the server: HTTP GET on
loopback, and the batch scenarios and prompt logprobs over the
OpenAI-compatible /v1/completions (evaluate.serving.client).

`VllmServerEngine` (a server evaluate starts) and `OpenAIEngine` (one that
is already running) both mix `HttpEngine` in; neither knows the other."""
import asyncio
import ipaddress
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import aiohttp

from evaluate.engines.base import RunFailed
from evaluate.memory import PeakMemory
from evaluate.metrics import RequestTiming
from evaluate.serving import client
from evaluate.serving.load import DEATH_GRACE_S, ServerDied
from quantize.common.errors import RunsFailed, first_line

log = logging.getLogger("quantbench.evaluate")
LOOPBACK_NAMES = ("localhost",)

# Seconds a streamed request may go without a token (engine.stall_timeout_s in
# conf/engine/openai.yaml and vllm_server.yaml; this one where a config lacks it).
# A decode step, or a prefill chunk, takes seconds here even on 2 CPU cores.
STALL_TIMEOUT_S = 30.0
# A run the server fails (HTTP 5xx, a broken stream) runs again this many
# times, after RETRY_BACKOFF_S, then twice that, ... (engine.retries and
# engine.retry_backoff_s; these where a config lacks them).
RETRIES = 2
RETRY_BACKOFF_S = 1.0


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost: this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # any other name may resolve anywhere


@dataclass(frozen=True)
class Retry:
    """How often, and after what pause, a run the server failed runs again."""
    retries: int
    backoff_s: float

    def pause_s(self, attempt: int) -> float:
        return self.backoff_s * 2 ** attempt

    def after(self, attempt: int) -> str:
        """What the failure line adds about the tries made; the fix where none was left."""
        if attempt == 0 and self.retries == 0:
            return " (engine.retries=0: raise it to run such a run again)"
        return f" ({attempt + 1} tries, engine.retries={self.retries}); the server's log says why"


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

    @property
    def retry(self) -> "Retry":
        return Retry(max(0, int(self.settings.get("retries", RETRIES))),
                     float(self.settings.get("retry_backoff_s", RETRY_BACKOFF_S)))

    @classmethod
    def import_libraries(cls, target) -> None:
        """Nothing: the server is a process of its own."""

    def peak_memory(self) -> PeakMemory:
        """The server's process tree, whole; nothing for a remote server."""
        return PeakMemory(pid=self.server_pid, remote=self.server_pid is None)

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True):
        """All prompts at once, streamed (the batch scenarios). A run the
        server fails (an HTTP 5xx, a broken stream) is run again, up to
        engine.retries times after a growing pause; then, or at once for a
        stalled stream or a request the server refuses (4xx), it fails
        (RunFailed) and the next run may be served. A server that died
        ends the job (ServerDied)."""
        retry = self.retry
        for attempt in range(retry.retries + 1):
            start = time.perf_counter()
            results = asyncio.run(client.complete_all(self.base_url, self.model, prompts, output_len,
                                                      self.stall_timeout_s))
            failed = next((r for r in results if not r.success), None)
            if failed is None:
                return start, [as_timing(r) for r in results]
            self._raise_if_dead(failed.connection_lost)
            if not failed.retryable or attempt == retry.retries:
                raise RunFailed(f"request to {self.base_url} failed: {failed.error or 'no tokens'}"
                                f"{retry.after(attempt) if failed.retryable else ''}")
            log.warning("  request to %s failed (%s): running it again in %.1f s (engine.retries=%d)",
                        self.base_url, failed.error, retry.pause_s(attempt), retry.retries)
            time.sleep(retry.pause_s(attempt))

    def _raise_if_dead(self, connection_lost: bool) -> None:
        """ServerDied when the server is gone (a dying server closes its
        sockets a moment before its exit shows)."""
        until = time.monotonic() + (DEATH_GRACE_S if connection_lost else 0.0)
        while (died := self.alive()) is None and time.monotonic() < until:
            time.sleep(0.2)
        if died:
            raise ServerDied(died)

    def prompt_logprobs(self, prompts: list[list[int]], k: int):
        """/v1/completions with vLLM's `prompt_logprobs` extra parameter. A
        server that fails it ends the job in one line (the accuracy pass is
        one measurement: its row is recorded failed)."""
        try:
            return asyncio.run(client.prompt_logprobs_all(self.base_url, self.model, prompts, k))
        except client.NoPromptLogprobs as e:  # no failure to look for in its log
            raise RunsFailed(f"{self.base_url}: {e}") from e
        except (RuntimeError, aiohttp.ClientError, asyncio.TimeoutError) as e:
            self._raise_if_dead(isinstance(e, aiohttp.ClientConnectionError))
            raise RunsFailed(f"the server at {self.base_url} failed the accuracy pass ({first_line(e)}); its log "
                             "says why, and once it serves the same command measures the pass") from e

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
