"""vLLM, in-process through AsyncLLM so every output token is timestamped as
it streams (TTFT, TPOT and ITL, like `vllm bench serve`, without HTTP).
Sampling matches `vllm bench latency/throughput`: temperature 1.0, top_p 1.0,
EOS ignored so every request generates exactly `output_len` tokens."""
import asyncio
import logging
import os
import time
import uuid

from evaluate.metrics import RequestTiming
from quantize.errors import UserError
from quantize.paths import CACHE_DIR

log = logging.getLogger("quantbench.evaluate")

# Environment that changes vLLM's speed; recorded in every result row.
SPEED_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
             "VLLM_CPU_INT4_W4A8", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def apply_env(env: dict) -> dict:
    """Set the engine environment (before the engine process starts)."""
    env = dict(env)
    if "VLLM_CPU_NUM_OF_RESERVED_CPU" in env and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] is None:
        # On small machines the reserved front-end core costs more than it saves.
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = 0 if (os.cpu_count() or 1) <= 4 else None
    for key, value in env.items():
        if value is not None:
            os.environ[key] = str(value)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(CACHE_DIR / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(CACHE_DIR / "torchinductor"))
    return {k: os.environ[k] for k in SPEED_ENV if k in os.environ}


def on_cpu() -> bool:
    from vllm.platforms import current_platform
    return current_platform.is_cpu()


class VllmEngine:
    name = "vllm"

    def __init__(self, target, args: dict, env: dict, max_model_len: int, trust_remote_code=False):
        if target.is_int8_weight_only and on_cpu():
            raise UserError(f"vLLM-CPU has no kernel for int8 weight-only (W8A16) checkpoints "
                            f"({target.path.name}); use engine=hf here, or vLLM on a CUDA machine")
        self.env = apply_env(env)
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.args = {k: v for k, v in args.items() if v is not None}
        self.args["max_model_len"] = max_model_len
        if on_cpu():
            self.args.pop("gpu_memory_utilization", None)
        engine_args = AsyncEngineArgs(model=str(target.path), trust_remote_code=trust_remote_code,
                                      **self.args)
        self.loop = asyncio.new_event_loop()
        log.info("starting vLLM for %s (args %s, env %s)", target.path, self.args, self.env)
        t0 = time.perf_counter()

        async def start():
            return AsyncLLM.from_engine_args(engine_args)
        self.engine = self.loop.run_until_complete(start())
        self.startup_s = time.perf_counter() - t0
        log.info("vLLM ready in %.1f s", self.startup_s)

    def describe(self) -> dict:
        import vllm
        return {"engine_args": self.args, "engine_env": self.env,
                "engine_version": vllm.__version__, "engine_startup_s": round(self.startup_s, 2)}

    def run(self, prompts: list[list[int]], output_len: int):
        return self.loop.run_until_complete(self._run(prompts, output_len))

    async def _run(self, prompts, output_len):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=output_len,
                                min_tokens=output_len, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        batch = uuid.uuid4().hex[:8]
        start = time.perf_counter()
        timings = [RequestTiming(start=start, prompt_tokens=len(p)) for p in prompts]

        async def one(i: int, prompt: list[int]):
            stream = self.engine.generate(TokensPrompt(prompt_token_ids=prompt), params,
                                          request_id=f"{batch}-{i}")
            async for out in stream:
                n = len(out.outputs[0].token_ids)
                if n:
                    timings[i].chunks.append((time.perf_counter(), n))

        await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        return start, timings

    def prompt_logprobs(self, prompts: list[list[int]], k: int):
        """Per prompt, per position: {token id: (logprob, rank)} for the top-k
        and the actual token (None at position 0)."""
        return self.loop.run_until_complete(self._prompt_logprobs(prompts, k))

    async def _prompt_logprobs(self, prompts, k):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k,
                                detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        batch = uuid.uuid4().hex[:8]

        async def one(i, prompt):
            final = None
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt), params,
                                                  request_id=f"lp-{batch}-{i}"):
                final = out
            return [None if pos is None else {t: (lp.logprob, lp.rank) for t, lp in pos.items()}
                    for pos in final.prompt_logprobs]

        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    def close(self) -> None:
        import gc
        engine, self.engine = self.engine, None

        async def shutdown():
            # Inside the loop, AsyncLLM closes its zmq sockets at once; from
            # outside it only schedules that, and a later GC of the context
            # then blocks forever (seen when a multirun starts the next engine).
            engine.shutdown()
            await asyncio.sleep(0)

        self.loop.run_until_complete(shutdown())
        del engine
        gc.collect()  # AsyncLLM.__del__ at interpreter exit fails noisily
        self.loop.close()
