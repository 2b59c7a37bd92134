"""Peak memory while a run executes, sampled in a background thread.

What is measured is the engine, not the harness around it. Evaluate runs the
artifacts of a sweep one after another in one process, which by then holds
what earlier jobs left (the accuracy reference's log-probs: 0.8 GB for
SmolLM2), so this process's whole RSS would grow with every job. An engine's
memory is what grew since it began starting (`Baseline`, taken just before):

- this process's resident memory above its baseline (an engine that runs in
  this process: transformers; vLLM's front end), and
- the whole resident memory of every process started since, with their
  children (vLLM's engine core and workers, a server).

Library code this process pages in for the first time while the engine runs
(libtorch's kernels the first model calls: ~11 MB) stays for the rest of the
process, so it is left out of the first: an in-process engine's figure is
what its model and its runs hold (weights, KV cache, activations), whatever
ran before it in the process. A child process's figure is its whole RSS.
What an in-process figure can still miss is memory freed before the
baseline but kept by an allocator, which the engine reuses unseen: glibc's
(one_malloc_arena, release_freed_memory) is handed back; Python's object
arenas are not (2-10 MB measured, on a 400 MB engine).

`PeakMemory(pid=...)` measures one process tree whole instead (a server's,
under load). Device memory in use is added as its own figure where CUDA is
present.

The process tree is listed once per run (the engine's processes live as long
as the engine): listing walks all of /proc (~2 ms), reading a known process's
RSS costs ~15 us, and the sampler shares the cores with the engine it measures."""
import ctypes
import gc
import math
import threading
from dataclasses import dataclass

import psutil

from evaluate.formats import head_dim
from quantize.common.provenance import visible_gpus


@dataclass(frozen=True)
class Baseline:
    """This process just before an engine starts: its resident memory, once
    what earlier jobs freed has gone back to the system, and the processes
    below it then (not the engine's)."""
    rss_bytes: int
    library_bytes: int          # of it, shared-library pages (library_rss_bytes)
    children: frozenset[int]

    @classmethod
    def now(cls) -> "Baseline":
        release_freed_memory()
        me = psutil.Process()
        return cls(me.memory_info().rss, library_rss_bytes(),
                   frozenset(p.pid for p in me.children(recursive=True)))


def library_rss_bytes() -> int:
    """This process's resident pages of shared libraries (*.so mappings), from
    /proc/self/smaps (~0.1 s for a process with torch loaded); 0 where it
    cannot be read."""
    total, in_library = 0, False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                if line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024 if in_library else 0
                elif not line[0].isupper():  # a mapping's first line: address range ... path
                    path = line.split(maxsplit=5)[5:]
                    in_library = bool(path) and ".so" in path[0].rsplit("/", 1)[-1]
    except OSError:
        return 0
    return total


M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def one_malloc_arena() -> None:
    """Let every thread of this process allocate from glibc's main arena
    (mallopt M_ARENA_MAX=1); called before any engine starts. glibc hands the
    free top of a thread's arena back only once it outgrows the trim
    threshold (up to 64 MB each) and malloc_trim leaves it alone, so the next
    engine of a sweep would reuse it unseen: an original's 308 MB of weights
    read as 232 MB after a W4A16 job. Engines in processes of their own keep
    glibc's default."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):  # not glibc
        pass


def release_freed_memory() -> None:
    """Collect garbage and hand malloc's free pages back to the system: freed
    but kept pages are reused by the next engine without adding to RSS, which
    would hide part of its memory."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: its allocator keeps what it keeps
        pass


class PeakMemory:
    """`baseline`: measure the engine started after it (see the module
    docstring); `pid`: the whole tree under that process; neither: this
    process's whole tree; `remote=True`: nothing (an engine on another
    machine). A root that is gone, or a remote one, leaves peak_rss_bytes None."""

    def __init__(self, interval_s: float = 0.05, pid: int | None = None, gpu: bool = True,
                 baseline: Baseline | None = None, remote: bool = False):
        self.interval_s, self.pid, self.baseline, self.remote = interval_s, pid, baseline, remote
        self.peak_rss_bytes = 0
        self.peak_gpu_bytes = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._gpu = gpu and _gpu_used_bytes() is not None  # probe NVML once

    def __enter__(self):
        self.peak_rss_bytes, self._procs = None, []
        if self.remote:
            return self
        try:
            root = psutil.Process(self.pid)
            below = root.children(recursive=True)
        except psutil.Error:
            return self
        self.peak_rss_bytes = self._root_at_peak = 0
        before = self.baseline.children if self.baseline else frozenset()
        self._procs = [root, *(p for p in below if p.pid not in before)]
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join()
        self._sample()
        if self.baseline:  # library code paged in since is this process's, not the engine's
            code = max(0, library_rss_bytes() - self.baseline.library_bytes)
            self.peak_rss_bytes -= min(code, self._root_at_peak)

    def as_metrics(self) -> dict:
        out = {"peak_memory_bytes": self.peak_rss_bytes}
        if self.peak_gpu_bytes is not None:
            out["peak_gpu_memory_bytes"] = self.peak_gpu_bytes
        return out

    def _loop(self):
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self):
        root, *below = self._procs
        own = max(0, _rss(root) - self.baseline.rss_bytes) if self.baseline else _rss(root)
        total = own + sum(_rss(p) for p in below)
        if total > self.peak_rss_bytes:
            self.peak_rss_bytes, self._root_at_peak = total, own
        gpu = _gpu_used_bytes() if self._gpu else None
        if gpu is not None:
            self.peak_gpu_bytes = max(self.peak_gpu_bytes or 0, gpu)


def _rss(p: psutil.Process) -> int:
    try:
        return p.memory_info().rss
    except psutil.Error:  # a child exiting between listing and reading
        return 0


def _gpu_used_bytes() -> int | None:
    """Memory in use on the GPUs this process may use, via NVML: unlike
    torch.cuda it creates no CUDA context in this process, which would take
    memory from the engine."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return sum(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in visible_gpus(pynvml))
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
    size = head_dim(config)
    if not size:
        return None
    tp, pp = int(args.get("tensor_parallel_size") or 1), int(args.get("pipeline_parallel_size") or 1)
    return 2 * math.ceil(layers / pp) * max(1, kv_heads // tp) * size * itemsize


def rank_memory_bytes(cuda: bool) -> int | None:
    """The memory one rank of an engine computes in: the smallest visible
    GPU's (via NVML, visible_gpus) on a CUDA machine, else this machine's
    RAM; None where NVML cannot say."""
    if not cuda:
        return psutil.virtual_memory().total
    try:
        import pynvml
        pynvml.nvmlInit()
        return min(pynvml.nvmlDeviceGetMemoryInfo(h).total for h in visible_gpus(pynvml))
    except Exception:  # no NVIDIA driver (a simulated CUDA host), no visible GPU: no bound from memory
        return None
