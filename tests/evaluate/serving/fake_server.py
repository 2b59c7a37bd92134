"""A small OpenAI-compatible streaming server whose latency follows a known
law, for the load generator's tests:

    every token step (the first one too) takes  fixed_ms + per_active_ms * A

where A is the number of requests in flight at that moment. In a closed loop
of concurrency c, TTFT and TPOT are therefore fixed + per_active * c, so the
highest concurrency meeting a TPOT bound T is floor((T - fixed) / per_active).

    python tests/evaluate/serving/fake_server.py --port 0 [--fixed-ms 5] [--per-active-ms 2]
        [--die-after N] [--fail-from N --fail-to M] [--stall-from N --stall-to M [--stall-s S]]
        [--break-from N --break-to M] [--max-active N]
        [--spawn-child] [--exit-at-start [--start-log FILE]] [--models-delay S] [--no-prompt-logprobs]

It prints `port <n>` once listening. Endpoints: /health, /version,
/v1/models, /v1/completions (streamed, with usage; or prompt_logprobs without
stream), /stats (peak in-flight count, requests seen, the last request's body
less its prompt), POST /reset.
--die-after N: the process exits (code 3) when request N+1 arrives.
--fail-from/--fail-to: requests with those arrival numbers (0-based,
inclusive) get HTTP 500. --stall-from/--stall-to: those requests stream one
token, then nothing more while the connection stays open (--stall-s S: for S seconds, then the rest, as a
request vLLM preempts under KV-cache pressure is). --break-from/--break-to: those requests stream
one token, then the server drops the connection. --max-active N: at most N requests stream at once, the
others wait, silent after their headers, until one ends (vLLM's max_num_seqs). --start-log FILE: what --exit-at-start
writes to stderr before it exits. --spawn-child: starts a child process in the same
process group (as vLLM's engine core is), whose pid /stats reports. --models-delay S: /v1/models answers
after S seconds (after the first answer: a server busy under load). --no-prompt-logprobs: the parameter is
ignored, as OpenAI-compatible servers other than vLLM's do."""
import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

from aiohttp import web


class Fake:
    def __init__(self, args):
        self.args = args
        self.active = 0
        self.peak = 0
        self.seen = 0
        self.child = None
        self.models_answered = 0
        self.last_request = None  # the last /v1/completions body, less its prompt
        self.slots = asyncio.Semaphore(args.max_active) if args.max_active else contextlib.nullcontext()

    def step_s(self) -> float:
        return (self.args.fixed_ms + self.args.per_active_ms * self.active) / 1000

    async def completions(self, request: web.Request):
        body = await request.json()
        self.last_request = {k: v for k, v in body.items() if k != "prompt"}
        n = self.seen
        self.seen += 1
        if self.args.die_after is not None and n >= self.args.die_after:
            os._exit(3)
        if self.args.fail_from is not None and self.args.fail_from <= n <= self.args.fail_to:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        prompt, out_len = body["prompt"], int(body["max_tokens"])
        if self.args.eos_after is not None:  # a server that ignores ignore_eos and min_tokens: it stops at EOS
            out_len = min(out_len, self.args.eos_after)
        if body.get("prompt_logprobs") is not None and self.args.no_prompt_logprobs:
            return web.json_response({"choices": [{"index": 0, "text": "x", "logprobs": None}]})
        if body.get("prompt_logprobs") is not None:
            return web.json_response({"choices": [{"text": "x", "prompt_logprobs": [None] + [
                {str(t): {"logprob": -1.0, "rank": 1}} for t in prompt[1:]]}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # vLLM's server answers with its headers before the request is scheduled
        async with self.slots:
            return await self.stream(request, resp, n, prompt, out_len)

    async def stream(self, request, resp, n: int, prompt: list[int], out_len: int):
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            for i in range(out_len):
                if i == 1 and self.args.stall_from is not None and self.args.stall_from <= n <= self.args.stall_to:
                    await asyncio.sleep(self.args.stall_s)  # a stalled engine: the stream stays open, silent
                if i == 1 and self.args.break_from is not None and self.args.break_from <= n <= self.args.break_to:
                    request.transport.close()  # a crashed worker, a proxy timeout: cut off mid-response
                    return resp
                await asyncio.sleep(self.step_s())
                chunk = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            usage = {"prompt_tokens": len(prompt), "completion_tokens": out_len,
                     "total_tokens": len(prompt) + out_len}
            await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.active -= 1

    async def models(self, _):
        if self.models_answered:
            await asyncio.sleep(self.args.models_delay)
        self.models_answered += 1
        return web.json_response({"data": [{"id": "fake-model"}]})

    async def stats(self, _):
        return web.json_response({"peak_active": self.peak, "requests": self.seen, "pid": os.getpid(),
                                  "child_pid": self.child.pid if self.child else None,
                                  "last_request": self.last_request})

    async def reset(self, _):
        self.peak, self.seen = 0, 0
        return web.json_response({})


def build(args) -> tuple[web.Application, Fake]:
    fake = Fake(args)
    app = web.Application()
    app.router.add_get("/health", lambda _: web.Response(text=""))
    app.router.add_get("/version", lambda _: web.json_response({"version": "fake-1"}))
    app.router.add_get("/v1/models", fake.models)
    app.router.add_post("/v1/completions", fake.completions)
    app.router.add_get("/stats", fake.stats)
    app.router.add_post("/reset", fake.reset)
    return app, fake


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--fixed-ms", type=float, default=5.0)
    p.add_argument("--per-active-ms", type=float, default=2.0)
    p.add_argument("--die-after", type=int, default=None)
    p.add_argument("--fail-from", type=int, default=None)
    p.add_argument("--fail-to", type=int, default=None)
    p.add_argument("--stall-from", type=int, default=None)
    p.add_argument("--stall-to", type=int, default=None)
    p.add_argument("--stall-s", type=float, default=3600.0)
    p.add_argument("--break-from", type=int, default=None)
    p.add_argument("--break-to", type=int, default=None)
    p.add_argument("--max-active", type=int, default=None)
    p.add_argument("--models-delay", type=float, default=0.0)
    p.add_argument("--spawn-child", action="store_true")
    p.add_argument("--exit-at-start", action="store_true")
    p.add_argument("--start-log", default=None)
    p.add_argument("--no-prompt-logprobs", action="store_true")
    p.add_argument("--eos-after", type=int, default=None)
    # what vLLM's server is also given (VllmServerEngine passes them; ignored here)
    p.add_argument("--model", default=None)
    args, _ = p.parse_known_args(argv)
    return args


async def main(args) -> None:
    if args.exit_at_start:  # a server that cannot start: its log's last error line says why
        text = open(args.start_log).read() if args.start_log else "ValueError: injected start-up failure\n"
        print(text, end="", file=sys.stderr, flush=True)
        sys.exit(1)
    app, fake = build(args)
    if args.spawn_child:  # stands for vLLM's engine core: same process group, sleeps forever
        fake.child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"port {port}", flush=True)
    while True:
        await asyncio.sleep(3600)


if __name__ == "__main__":
    try:
        asyncio.run(main(parse()))
    except KeyboardInterrupt:
        time.sleep(0)
