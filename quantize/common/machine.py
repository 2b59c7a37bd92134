"""What this machine can do, as probed facts: CPU instruction sets, CUDA
compute capabilities, NUMA nodes. What a serving engine finds out about
itself here (its package, its kernel library) is the engine's own probe
(e.g. evaluate/engines/vllm_kernels.py), attached under `Machine.engines`.

Decisions (which dtype, whether a format can be served) are made from these
facts, never from CPU model names, so a test can inject any machine."""
import importlib.util
import os
import platform
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Protocol

# CPU flags that change which kernels and dtypes are fast (names as in /proc/cpuinfo).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile",
             "avx512_fp16", "amx_fp16", "asimd", "bf16", "sve")
HALF = ("bfloat16", "float16")
# Variables that cap the instructions torch (ATen and inductor's C++), MKL and
# oneDNN use below what the CPU has (scripts/as_avx2_host.sh sets them): they
# change speed, so rows record them.
ISA_CAP_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
X86 = ("x86_64", "amd64", "i686")


class EngineFacts(Protocol):
    """What an engine probed about itself on this machine."""

    def facts(self) -> dict:
        """JSON-able keys for result rows (flat, named after the engine)."""

    def describe(self) -> str:
        """A clause for Machine.describe(), or ""."""


@dataclass(frozen=True)
class Machine:
    arch: str                                  # platform.machine(): x86_64, aarch64, ...
    isa: frozenset = frozenset()               # subset of ISA_FLAGS
    cuda: tuple = ()                           # compute capability per GPU, e.g. ((8, 0),)
    gpu_names: tuple = field(default=(), compare=False)
    numa_nodes: int = 1                        # NUMA nodes holding the CPUs this process may use
    # engine name -> what that engine probed about itself here; an engine absent from it was
    # not probed (a machine kind printed from rules: as if its package were installed)
    engines: Mapping[str, EngineFacts] = field(default_factory=dict, hash=False)

    def engine(self, name: str) -> EngineFacts | None:
        return self.engines.get(name)

    def with_engine(self, name: str, facts: EngineFacts) -> "Machine":
        return replace(self, engines={**self.engines, name: facts})

    @property
    def x86(self) -> bool:
        return self.arch.lower() in X86

    @property
    def cpu_native_half(self) -> frozenset:
        """The half-precision dtypes (of HALF) the CPU multiplies in hardware;
        the others convert through float32 and are slower than it. x86: bf16
        with AVX512-BF16 or AMX (measured on AVX2: bf16 linear 17 GFLOPS vs
        147 in fp32), fp16 with AVX512-FP16 or AMX-FP16, which every CPU with
        AMX has (Sapphire Rapids on); AMD Zen 4/5 has AVX512-BF16 but not
        AVX512-FP16 (measured: fp16 linear 15.6 GFLOPS, fp32 51.5, bf16 120).
        ARM: both with the bf16 extension; other architectures are trusted."""
        if self.x86:
            native = {"bfloat16": self.isa & {"avx512_bf16", "amx_bf16"},
                      "float16": self.isa & {"avx512_fp16", "amx_fp16", "amx_tile"}}
            return frozenset(name for name, flags in native.items() if flags)
        if self.arch.lower() in ("aarch64", "arm64"):
            return frozenset(HALF) if "bf16" in self.isa else frozenset()
        return frozenset(HALF)

    @property
    def min_cuda_capability(self) -> tuple | None:
        return min(self.cuda) if self.cuda else None

    def describe(self) -> str:
        """One line for logs, the capability table and the report header."""
        engines = "".join(f"; {text}" for text in (e.describe() for e in self.engines.values()) if text)
        if self.cuda:
            gpus = ", ".join(f"{n} (sm{a}{b})" for n, (a, b) in zip(self.gpu_names or ["GPU"] * len(self.cuda), self.cuda))
            return f"CUDA: {gpus}{engines}"
        isa = " ".join(f for f in ISA_FLAGS if f in self.isa) or "no SIMD flags seen"
        native = self.cpu_native_half
        return f"{self.arch} CPU, ISA {isa}; {half_text('bfloat16' in native, 'float16' in native)}{engines}"

    def facts(self) -> dict:
        """JSON-able, for result rows: the machine's, then each engine's own keys."""
        out = {"arch": self.arch, "isa": sorted(self.isa), "cuda": [list(c) for c in self.cuda],
               # bf16: rows written before fp16 was told apart held this one flag, decided from the bf16 ISA
               "cpu_native_half": "bfloat16" in self.cpu_native_half,
               "cpu_native_fp16": "float16" in self.cpu_native_half, "numa_nodes": self.numa_nodes}
        for engine in self.engines.values():
            out |= engine.facts()
        return out


def half_text(bf16: bool, fp16: bool | None) -> str:
    """Which half-precision dtypes are native, for the machine line and the
    report; `fp16` None: not recorded (rows written before it was told apart)."""
    slow = "emulated (float32 is faster)"
    if fp16 is None:
        return f"bf16 {'native' if bf16 else slow}"
    if bf16 == fp16:
        return f"bf16/fp16 {'native' if bf16 else slow}"
    return f"{'bf16' if bf16 else 'fp16'} native, {'fp16' if bf16 else 'bf16'} {slow}"


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@lru_cache(maxsize=None)
def detect() -> Machine:
    """This machine's CPU, CUDA and NUMA facts (an engine adds its own with
    Machine.with_engine, see Engine.machine)."""
    arch = platform.machine()
    x86 = arch.lower() in X86
    return Machine(arch=arch, isa=_torch_x86_isa() if x86 else frozenset(cpu_flags() & set(ISA_FLAGS)),
                   numa_nodes=numa_nodes(), **gpus())


def numa_nodes() -> int:
    """NUMA nodes that hold a CPU this process may run on (a CPU engine may
    bind each tensor-parallel rank to one of them); 1 when the kernel does
    not say."""
    try:
        allowed = os.sched_getaffinity(0)
        nodes = 0
        for cpulist in Path("/sys/devices/system/node").glob("node[0-9]*/cpulist"):
            nodes += bool(allowed & set(parse_cpu_list(cpulist.read_text())))
        return max(nodes, 1)
    except (OSError, AttributeError, ValueError):
        return 1


def parse_cpu_list(text: str) -> list[int]:
    """Linux's CPU list syntax, e.g. "0-3,8,10-11"."""
    out = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    return out


def _torch_x86_isa() -> frozenset:
    """The x86 ISA as torch sees it: the queries engines built on torch
    choose their CPU kernels by, so the rules and the engine decide from one
    answer."""
    import torch
    queries = {"avx2": "_is_avx2_supported", "avx512f": "_is_avx512_supported",
               "avx512_vnni": "_is_vnni_supported", "avx512_bf16": "_is_avx512_bf16_supported",
               "amx_tile": "_is_amx_tile_supported", "amx_fp16": "_is_amx_fp16_supported"}
    isa = {flag for flag, query in queries.items() if getattr(torch.cpu, query, lambda: False)()}
    if "amx_tile" in isa:
        isa |= {"amx_bf16", "amx_int8"}
    if "avx512f" not in isa:
        isa.discard("avx512_vnni")  # torch's VNNI query also answers for AVX-VNNI
    # every CPU with AVX512-FP16 has AVX512-BF16 too, so a host faked without
    # it (tests/hosts) is asked no further
    if "avx512_bf16" in isa and _onednn_fp16():
        isa.add("avx512_fp16")
    return frozenset(isa)


def _onednn_fp16() -> bool:
    """oneDNN's own fp16 check, which torch's CPU fp16 matmul is dispatched
    by (torch.cpu has no AVX512-FP16 query)."""
    import torch
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def gpus() -> dict:
    """This machine's CUDA GPUs as detect() has them ({"cuda": capabilities,
    "gpu_names": names}; {} where there are none), without detect()'s CPU
    probe: enough to choose between the CPU and the GPU defaults."""
    if not _torch_may_see_a_gpu():
        return {}
    try:
        import torch
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return {"cuda": tuple(torch.cuda.get_device_capability(i) for i in range(n)),
                    "gpu_names": tuple(torch.cuda.get_device_name(i) for i in range(n))}
    except Exception:  # a broken CUDA setup is a machine without CUDA here
        pass
    return {}


def _torch_may_see_a_gpu() -> bool:
    """False where the installed torch is built without CUDA and ROCm (its
    version.py, read without importing torch, says cuda = None and hip =
    None): that torch sees no GPU, and asking it would cost its import (~2 s)."""
    spec = importlib.util.find_spec("torch")
    try:
        text = (Path(spec.submodule_search_locations[0]) / "version.py").read_text()
    except (AttributeError, IndexError, TypeError, OSError):  # no torch, or not laid out as a package
        return True
    built_for = dict(re.findall(r"^(cuda|hip)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.M))
    return built_for != {"cuda": "None", "hip": "None"}


def check_device(key: str, device) -> None:
    """`key=<device>` for a model quantbench runs in torch (engine=hf, the
    accuracy reference): auto, cpu or cuda[:N], and CUDA only where there is
    one. torch's own parse decides what a device string is; another value, or
    CUDA on a CPU machine, failed as the model moved there."""
    from quantize.common.errors import UserError
    from quantize.common.settings import shown
    if device is None or device == "auto":
        return
    import torch
    text = shown(device)
    try:
        kind = torch.device(device).type if isinstance(device, str) else None  # 0 would be cuda:0
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise UserError(f"{key}={text} is not a device quantbench runs models on; pass {key}=auto, cpu or cuda "
                        "(cuda:N for one GPU)")
    if kind == "cuda" and not detect().cuda:
        raise UserError(f"{key}={text}: this machine has no CUDA device; pass {key}=auto or cpu")
