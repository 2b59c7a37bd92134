"""transformers generate(), same scenarios and metrics as vLLM. Greedy, with
min_new_tokens = max_new_tokens so EOS never ends a request early."""
import logging
import time
from contextlib import contextmanager, suppress
from typing import Iterator

from evaluate.formats import DENSE, YES, Verdict
from evaluate.engines.base import Engine, weights_in_memory
from evaluate.metrics import RequestTiming
import quantize.common.machine
from quantize.common.dtypes import fast_faithful_dtype, requested_dtype
from quantize.common.errors import UserError

log = logging.getLogger("quantbench.evaluate")


class _TimingStreamer:
    """transformers calls put() once with the prompt, then once per step."""

    def __init__(self, timings):
        self.timings = timings
        self.seen_prompt = False

    def put(self, value):
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        now = time.perf_counter()
        for t in self.timings:
            t.chunks.append((now, 1))

    def end(self):
        pass


# The one thread variable engine.env may set: torch.set_num_threads applies it
# (to OpenMP's and MKL's pools both) in the running process.
THREADS = "OMP_NUM_THREADS"


class HfEngine(Engine):
    name = "hf"
    # torch sizes its CPU thread pools from these when it is imported
    speed_env = (THREADS, "MKL_NUM_THREADS", *quantize.common.machine.ISA_CAP_ENV)

    @classmethod
    def check_settings(cls, settings: dict, env: dict) -> None:
        """The engine runs in this process, where torch has started: its other
        speed variables would be recorded but never read."""
        for key in cls.speed_env:
            if key != THREADS and env.get(key) is not None:
                raise UserError(f"engine.env.{key}: engine=hf runs in this process, where torch reads {key} only "
                                f"as it starts; export it in the shell instead ({key}=... python -m evaluate ...)")
        threads = env.get(THREADS)
        if threads is not None and not (str(threads).isdigit() and int(threads) > 0):
            raise UserError(f"engine.env.{THREADS}={threads}: pass a count of threads > 0, e.g. "
                            f"engine.env.{THREADS}=4, or null for torch's own")

    @classmethod
    @contextmanager
    def environment(cls, env: dict, args: dict | None = None, places: dict | None = None) -> Iterator[dict]:
        """Engine.environment, and torch's thread count from engine.env's
        OMP_NUM_THREADS for the engine's lifetime (torch read the variable
        when it was imported, before any engine config was known)."""
        with super().environment(env, args, places) as recorded, _torch_threads(env.get(THREADS)):
            yield recorded

    @staticmethod
    def machine():
        return quantize.common.machine.detect()

    @staticmethod
    def choose_dtype(fmt, machine, args: dict | None = None) -> str:
        args = args or {}
        if args.get("dtype") not in (None, "auto"):
            return str(args["dtype"])
        return fast_faithful_dtype(fmt.dtype, on_cpu=HfEngine.runs_on_cpu(machine, args.get("device")),
                                   cpu_native_half=machine.cpu_native_half)

    @staticmethod
    def runs_on_cpu(machine, device) -> bool:
        """`engine.args.device` (auto: the GPU where there is one) is a CPU."""
        if device in (None, "auto"):
            return not machine.cuda
        return str(device).startswith("cpu")

    @staticmethod
    def accepted_args() -> set[str]:
        """`engine.args.*` keys this engine reads (conf/engine/hf.yaml)."""
        return {"dtype", "device", "max_model_len"}

    @classmethod
    def check_arg_values(cls, args: dict) -> None:
        quantize.common.machine.check_device("engine.args.device", args.get("device"))
        requested_dtype(args.get("dtype"), "engine.args.dtype")

    @staticmethod
    def supports(fmt, machine, args: dict) -> Verdict:
        verdict = HfEngine._weights_rule(fmt)
        if verdict and fmt.kv_cache and fmt.method == "compressed-tensors":
            # compressed_tensors/modeling/kvcache.py: loading installs QuantizedKVCache on every
            # attention layer, which rounds k/v through the scheme with the checkpoint's scales
            # (measured on SmolLM2 W8A8 + fp8 KV: log-likelihood -583.4 with it, -580.3 without)
            note = f"{fmt.kv_cache} KV cache simulated (k/v rounded with the checkpoint's scales, stored unquantized)"
            return verdict.with_note(note)
        return verdict

    @classmethod
    def weight_bytes(cls, target, args: dict) -> int:
        """Dense in the compute dtype: transformers decompresses
        compressed-tensors weights as it loads (GPTQ and AWQ stay packed
        for gptqmodel's kernels)."""
        return weights_in_memory(target.path, args.get("dtype"),
                                 decompressed=target.format.method not in ("gptq", "awq"))

    @classmethod
    def kv_quant(cls, fmt, args: dict) -> str:
        if fmt.kv_cache and fmt.method == "compressed-tensors":
            return f"{fmt.kv_cache} simulated"
        return "none"

    @staticmethod
    def _weights_rule(fmt) -> Verdict:
        if fmt.scheme == DENSE:
            return YES
        if fmt.method in ("gptq", "awq"):
            from transformers.utils import is_gptqmodel_available, is_optimum_available
            missing = [p for p, ok in (("gptqmodel", is_gptqmodel_available()),
                                       ("optimum", fmt.method != "gptq" or is_optimum_available())) if not ok]
            if missing:
                return Verdict(False, f"transformers needs {' and '.join(missing)} to load {fmt.method.upper()}-format "
                                      f"checkpoints, not installed here; use engine=vllm")
            return YES
        # compressed-tensors: transformers decompresses the weights on load.
        return Verdict(True, "weights decompressed to dense: its speed and memory are the dense model's, "
                             "not the format's kernels'")

    @classmethod
    def import_libraries(cls, target) -> None:
        """torch, transformers, the model's class and compressed-tensors
        (which loads quantized checkpoints): ~390 MB of a process's RSS."""
        import transformers
        from transformers import AutoModelForCausalLM  # noqa: F401
        for arch in target.config.get("architectures") or ():
            getattr(transformers, arch, None)  # imports the module that defines it
        with suppress(ImportError):
            import transformers.quantizers.quantizer_compressed_tensors  # noqa: F401
            from compressed_tensors.compressors import ModelCompressor  # noqa: F401

    def start(self, target, args: dict, max_model_len: int) -> None:
        import torch

        from quantize.common import hf_load
        from quantize.common.dtypes import checkpoint_dtype, compute_dtype
        device = args.get("device") or "auto"   # None: auto
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        dtype = compute_dtype(checkpoint_dtype(target.path), args.get("dtype"), self.device)
        self.args = {"dtype": str(dtype).removeprefix("torch."), "device": self.device,
                     "max_model_len": max_model_len}
        t0 = time.perf_counter()
        from quantize.common import moe
        if moe.needs_own_loader(target.path):  # per-expert tensors, nn.Linear subclasses: see quantize/common/moe.py
            self.model = moe.reload_dense(target.path).to(dtype).to(self.device).eval()
        else:
            self.model = hf_load.causal_lm(target.path, dtype=dtype, use_safetensors=True).to(self.device).eval()
        self.pad_id = self.model.config.pad_token_id or 0
        with torch.inference_mode():  # transformers decompresses compressed-tensors weights on the first forward
            self.model(torch.tensor([[self.pad_id]], device=self.device))
        self.startup_s = time.perf_counter() - t0

    def versions(self) -> dict[str, str]:
        import torch
        import transformers
        return {"transformers": transformers.__version__, "torch": torch.__version__}

    def describe(self) -> dict:
        import torch
        return super().describe() | {"engine_env": {**self.env, "torch_num_threads": torch.get_num_threads()}}

    def run(self, prompts: list[list[int]], output_len: int, stream: bool = True):
        """Always streamed (one chunk per step); `stream` is accepted for the interface."""
        import torch
        ids = torch.tensor(prompts, device=self.device)
        start = time.perf_counter()
        timings = [RequestTiming(start=start, prompt_tokens=len(p)) for p in prompts]
        with torch.inference_mode():
            self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=output_len, min_new_tokens=output_len,
                                pad_token_id=self.pad_id, streamer=_TimingStreamer(timings))
        return start, timings

    def prompt_logprobs(self, prompts: list[list[int]], k: int):
        """Same shape as VllmEngine.prompt_logprobs, from one forward pass each."""
        import torch
        out = []
        with torch.inference_mode():
            for ids in prompts:
                logits = self.model(torch.tensor([ids], device=self.device)).logits[0, :-1]
                out.append([None, *top_k_positions(torch.log_softmax(logits.float(), dim=-1), ids[1:], k)])
        return out

    def stop(self) -> None:
        del self.model


@contextmanager
def _torch_threads(count) -> Iterator[None]:
    """torch's intra-op threads set to `count` (None: as they are), and put back after."""
    if count is None:
        yield
        return
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(int(count))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def top_k_positions(log_probs, targets: list[int], k: int) -> list[dict]:
    """Per row of `log_probs` ([len(targets), vocab]): {token id: (logprob,
    rank)} for the top k, and for the target token where it is not among them
    (its rank: 1 + the tokens more likely). Computed on the device and copied
    to the host in one piece: reading tensor elements one by one costs a
    device sync each on CUDA. float64 holds float32 log-probs and token ids
    exactly, so the values are those of the element-wise reads."""
    import torch
    top = log_probs.topk(k, dim=-1)
    actual = log_probs.gather(1, torch.tensor(targets, dtype=torch.long, device=log_probs.device)[:, None])
    rank = (log_probs > actual).sum(dim=1, keepdim=True) + 1
    table = torch.cat([t.double() for t in (top.values, top.indices, actual, rank)], dim=1).tolist()
    positions = []
    for row, target in zip(table, targets):
        d = {int(token): (value, r + 1) for r, (value, token) in enumerate(zip(row[:k], row[k:2 * k]))}
        if target not in d:
            d[target] = (row[2 * k], int(row[2 * k + 1]))
        positions.append(d)
    return positions
