"""The streaming client: one `/v1/completions` request per prompt, timed per
streamed chunk, as `vllm bench serve` times its requests (openai-completions
backend). Prompts are token ids, so the server's tokenizer cannot change their
length; counts come from the server's `usage`. A request that fails becomes
`RequestResult.error`, never an exception: one bad request must not end a
load level."""
import asyncio
import json
import time

import aiohttp

from evaluate.serving.requests import RequestResult

# Generous per-request cap: a request queued behind a saturated CPU server can
# take minutes. A server silent to every request fails them after the engine's
# stall_timeout_s (_StallWatch); one stream stuck while others get tokens ends
# with the level (max_seconds + drain) or, in a batch, stall_timeout_s after
# the others' last token, and this cap bounds it in any case.
REQUEST_TIMEOUT_S = 3600


# Every sampling setting, neutral, as engine=vllm samples: a field left out
# takes the server's default, which vLLM's server reads from the model's
# generation_config.json (e.g. top_k 20, repetition_penalty 1.05).
# top_k -1: "all tokens" to vLLM and to SGLang alike.
NEUTRAL_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                    "presence_penalty": 0.0, "frequency_penalty": 0.0}


def payload(model: str, prompt: list[int], output_len: int, stream: bool = True) -> dict:
    """Exactly `output_len` tokens, sampled as `vllm bench` does (temperature
    1, top-p 1, no top-k, min-p or penalties, EOS ignored)."""
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "min_tokens": output_len,
            "ignore_eos": True, **NEUTRAL_SAMPLING, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def stalled(stall_timeout_s: float) -> str:
    """A stalled stream's failure, naming the setting that bounds it."""
    return (f"stalled: no token for {stall_timeout_s:g} s; raise engine.stall_timeout_s if the server is only "
            "slow (a long prefill on a CPU)")


def broken(result: RequestResult, how: str) -> str:
    """A stream cut off before its end, in one line."""
    return f"the server closed the stream after {len(result.chunk_times)} token(s) ({how})"[:300]


class _StallWatch:
    """Cancels a request's exchange, marked stalled, once the server has been
    silent to every request of the client for its stall_timeout_s: since the
    request was sent or since the last token of any request, whichever is
    later. One clock for all: a request queued for its first token, or
    preempted back into the queue after some (vLLM under KV-cache pressure),
    waits while the others stream, as `vllm bench serve` waits for it.
    Checked when due and put off while tokens come: no work per token."""

    def __init__(self, client: "Client", result: RequestResult, exchange: asyncio.Task):
        self.client, self.result, self.exchange = client, result, exchange
        self.loop = asyncio.get_running_loop()
        self.handle = self.loop.call_later(client.stall_timeout_s, self.check)

    def check(self) -> None:
        since = max(self.result.sent, self.client.last_token)
        left = since + self.client.stall_timeout_s - time.perf_counter()
        if left > 0:
            self.handle = self.loop.call_later(left, self.check)
        elif not self.exchange.done():
            self.result.stalled = True
            self.exchange.cancel()

    def stop(self) -> None:
        self.handle.cancel()


class Client:
    """An aiohttp session against one OpenAI-compatible server. Use as
    `async with Client(base_url, model) as c: await c.complete(...)`.
    `stall_timeout_s`: a streamed completion fails as stalled once no request
    of this client got a token for that long (the server is silent to all);
    while others get tokens it may be queued or preempted at the server, and
    waits as `vllm bench serve` does. None: no bound but the total."""

    def __init__(self, base_url: str, model: str, timeout_s: float = REQUEST_TIMEOUT_S,
                 stall_timeout_s: float | None = None):
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.stall_timeout_s = stall_timeout_s
        self.session: aiohttp.ClientSession | None = None
        self.last_token = 0.0  # when any request of this client last got a token (perf_counter)

    async def __aenter__(self) -> "Client":
        # limit=0: no connection pool cap, so the client never queues requests
        # the load profile meant to have in flight at once.
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=self.timeout,
                                             trust_env=False)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()

    async def complete(self, prompt: list[int], output_len: int, scheduled: float | None = None) -> RequestResult:
        result = RequestResult(sent=time.perf_counter(), scheduled=scheduled, prompt_tokens=len(prompt))
        # the exchange is a task of its own: a stall cancels it, never this caller
        exchange = asyncio.ensure_future(self._exchange(prompt, output_len, result))
        watch = None if self.stall_timeout_s is None else _StallWatch(self, result, exchange)
        try:
            await exchange
        except asyncio.CancelledError:
            if result.stalled:  # cancelled by its _StallWatch
                result.error = stalled(self.stall_timeout_s)
            else:  # the level's drain time ran out: the result still counts, as failed
                result.error = "cancelled: still running when the level's time was up"
        except aiohttp.ClientPayloadError as e:  # the connection was cut mid-response: the server may have died
            result.error, result.broken = broken(result, f"{type(e).__name__}: {e}"), True
            result.connection_lost = True
        except Exception as e:  # connection refused or reset, timeout, bad JSON: a failed request
            result.error = f"{type(e).__name__}: {e}"[:300] or type(e).__name__
            result.connection_lost = isinstance(e, aiohttp.ClientConnectionError)
        finally:
            if watch:
                watch.stop()
            if result.error is None and result.end is None:
                result.error, result.broken = broken(result, "no [DONE]"), True
        return result

    async def _exchange(self, prompt: list[int], output_len: int, result: RequestResult) -> None:
        """One request and its stream, into `result`; a failure raises."""
        async with self.session.post(self.url, json=payload(self.model, prompt, output_len)) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300].replace("\n", " ")
                result.error, result.status = f"HTTP {resp.status}: {text}", resp.status
                return
            await self._read_stream(resp, result)

    async def _read_stream(self, resp, result: RequestResult) -> None:
        """Server-sent events: a `data: {...}` line per chunk, then `data: [DONE]`.
        A chunk with a choice is one streamed token step (its text may be empty
        for a partial character); the usage chunk has no choice."""
        async for raw in resp.content:
            now = time.perf_counter()
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                result.end = now
                if not result.chunk_times:  # a 200 and [DONE] with nothing generated is no completed request
                    result.error = "the server streamed no token"
                break
            chunk = json.loads(data)
            if chunk.get("error"):
                result.error = str(chunk["error"].get("message", chunk["error"]))[:300]
                return
            if chunk.get("choices"):
                result.chunk_times.append(now)
                self.last_token = now
            usage = chunk.get("usage")
            if usage:
                result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
                result.output_tokens = usage.get("completion_tokens", result.output_tokens)


async def complete_all(base_url: str, model: str, prompts: list[list[int]], output_len: int,
                       stall_timeout_s: float | None = None) -> list[RequestResult]:
    """Every prompt at once (a batch scenario over HTTP)."""
    async with Client(base_url, model, stall_timeout_s=stall_timeout_s) as client:
        return list(await asyncio.gather(*(client.complete(p, output_len) for p in prompts)))


async def prompt_logprobs_all(base_url: str, model: str, prompts: list[list[int]], k: int) -> list[list[dict | None]]:
    """Per prompt, per position: {token id: (logprob, rank)} for the top-k and
    the actual token (None at position 0), from vLLM's `prompt_logprobs`
    extra parameter of /v1/completions."""
    async with Client(base_url, model) as client:
        async def one(prompt):
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k}
            async with client.session.post(client.url, json=body) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"prompt logprobs: HTTP {resp.status} from {client.url}: "
                                       f"{(await resp.text())[:300]}")
                positions = given_prompt_logprobs(await resp.json())
            return [None if pos is None else {int(t): (v["logprob"], v["rank"]) for t, v in pos.items()}
                    for pos in positions]

        return list(await asyncio.gather(*(one(p) for p in prompts)))


class NoPromptLogprobs(RuntimeError):
    """The server answered without prompt logprobs: it is not vLLM's."""


def given_prompt_logprobs(reply) -> list:
    """The reply's `prompt_logprobs`: a server other than vLLM's ignores the
    parameter, and its reply holds none."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    positions = choices[0].get("prompt_logprobs") if choices and isinstance(choices[0], dict) else None
    if not isinstance(positions, list):
        raise NoPromptLogprobs("the server gives no prompt_logprobs (vLLM's OpenAI server does); pass accuracy=none")
    return positions
