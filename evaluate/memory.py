"""Peak memory while a run executes: resident memory of a process tree (by
default this process and its children: vLLM's engine core and workers run
in child processes; a served engine: the server's tree), and device memory
in use when CUDA is present. Sampled in a background thread.

The process tree is listed once per run (the engine's processes live as long
as the engine): listing walks all of /proc (~2 ms), reading a known process's
RSS costs ~15 us, and the sampler shares the cores with the engine it measures."""
import math
import threading

import psutil


class PeakMemory:
    """`pid`: the root of the tree to watch (None: this process). A root that
    is gone leaves peak_rss_bytes None."""

    def __init__(self, interval_s: float = 0.05, pid: int | None = None, gpu: bool = True):
        self.interval_s, self.pid = interval_s, pid
        self.peak_rss_bytes = 0
        self.peak_gpu_bytes = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._gpu = gpu and _gpu_used_bytes() is not None  # probe NVML once

    def __enter__(self):
        try:
            root = psutil.Process(self.pid)
            self._procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            self.peak_rss_bytes, self._procs = None, []
            return self
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join()
        self._sample()

    def as_metrics(self) -> dict:
        out = {"peak_memory_bytes": self.peak_rss_bytes}
        if self.peak_gpu_bytes is not None:
            out["peak_gpu_memory_bytes"] = self.peak_gpu_bytes
        return out

    def _loop(self):
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self):
        rss = 0
        for p in self._procs:
            try:
                rss += p.memory_info().rss
            except psutil.Error:  # a child exiting between listing and reading
                pass
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        gpu = _gpu_used_bytes() if self._gpu else None
        if gpu is not None:
            self.peak_gpu_bytes = max(self.peak_gpu_bytes or 0, gpu)


def _gpu_used_bytes() -> int | None:
    """Device memory in use, via NVML: unlike torch.cuda it creates no CUDA
    context in this process, which would take memory from the engine."""
    try:
        import pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        return sum(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used
                   for i in range(count))
    except Exception:  # no NVIDIA driver: CPU-only measurement
        return None


def kv_bytes_per_token(config: dict, itemsize: int, args: dict) -> int | None:
    """Bytes of KV cache one token takes on one rank (keys and values of every
    layer, heads split over tensor-parallel ranks, layers over pipeline
    stages); None for a config without plain attention sizes."""
    text = config.get("text_config") or config
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    if not (isinstance(layers, int) and isinstance(heads, int) and heads):
        return None
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text.get("hidden_size") or 0) // heads
    if not head_dim:
        return None
    tp, pp = int(args.get("tensor_parallel_size") or 1), int(args.get("pipeline_parallel_size") or 1)
    return 2 * math.ceil(layers / pp) * max(1, kv_heads // tp) * head_dim * itemsize


def rank_memory_bytes(cuda: bool) -> int | None:
    """The memory one rank of an engine computes in: the smallest GPU's (via
    NVML) on a CUDA machine, else this machine's RAM; None where NVML cannot say."""
    if not cuda:
        return psutil.virtual_memory().total
    try:
        import pynvml
        pynvml.nvmlInit()
        return min(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total
                   for i in range(pynvml.nvmlDeviceGetCount()))
    except Exception:  # no NVIDIA driver (a simulated CUDA host): no bound from memory
        return None
