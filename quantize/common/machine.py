"""What this machine can do, as probed facts: CPU instruction sets, CUDA
compute capabilities, and which ops the serving engine's kernel library has.

Decisions (which dtype, whether a format can be served) are made from these
facts, never from CPU model names, so a test can inject any machine."""
import os
import platform
import re
import tempfile
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from quantize.common.stdout import redirected_stdout

# CPU flags that change which kernels and dtypes are fast (names as in /proc/cpuinfo).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile",
             "asimd", "bf16", "sve")
# Variables that cap the instructions torch (ATen and inductor's C++), MKL and
# oneDNN use below what the CPU has (scripts/as_avx2_host.sh sets them): they
# change speed, so rows record them.
ISA_CAP_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
X86 = ("x86_64", "amd64", "i686")
# vLLM ops whose presence decides a format on CPU (vllm/_custom_ops.py names).
VLLM_CPU_OPS = ("cpu_gemm_wna16", "onednn_scaled_mm", "fp8_scaled_mm_cpu")


@dataclass(frozen=True)
class Machine:
    arch: str                                  # platform.machine(): x86_64, aarch64, ...
    isa: frozenset = frozenset()               # subset of ISA_FLAGS
    cuda: tuple = ()                           # compute capability per GPU, e.g. ((8, 0),)
    vllm_library: str | None = None            # kernel library vLLM loaded (_C, _C_AVX512, _C_AVX2)
    vllm_ops: frozenset | None = None          # subset of VLLM_CPU_OPS present; None: not probed
    gpu_names: tuple = field(default=(), compare=False)
    numa_nodes: int = 1                        # NUMA nodes holding the CPUs this process may use
    # Who runs an FP8 checkpoint's matmuls in vLLM-CPU here: "amx_fp8" (its own kernel), else the
    # torch._scaled_mm fallback, run by oneDNN (its implementation, e.g. "ref:any") or by torch
    # itself ("torch"); "unavailable": that fallback fails here; None: not probed.
    fp8_gemm: str | None = None

    @property
    def x86(self) -> bool:
        return self.arch.lower() in X86

    @property
    def cpu_native_half(self) -> bool:
        """bf16/fp16 matmul in the CPU's hardware. x86 without AVX512-BF16 or AMX
        converts through float32 (measured on AVX2: bf16 linear 17 GFLOPS vs 147
        in fp32); ARM needs the bf16 extension; other architectures are trusted."""
        if self.x86:
            return bool(self.isa & {"avx512_bf16", "amx_bf16"})
        if self.arch.lower() in ("aarch64", "arm64"):
            return "bf16" in self.isa
        return True

    @property
    def min_cuda_capability(self) -> tuple | None:
        return min(self.cuda) if self.cuda else None

    def describe(self) -> str:
        """One line for logs, the capability table and the report header."""
        if self.cuda:
            gpus = ", ".join(f"{n} (sm{a}{b})" for n, (a, b) in zip(self.gpu_names or ["GPU"] * len(self.cuda), self.cuda))
            return f"CUDA: {gpus}"
        isa = " ".join(f for f in ISA_FLAGS if f in self.isa) or "no SIMD flags seen"
        kernels = ""
        if self.vllm_library:
            kernels = f"; vLLM kernel library {self.vllm_library} with " + (
                ", ".join(sorted(self.vllm_ops)) if self.vllm_ops else "none of " + ", ".join(VLLM_CPU_OPS))
        half = "native" if self.cpu_native_half else "emulated (float32 is faster)"
        fp8 = f"; fp8 matmul {self.fp8_gemm}" if self.fp8_gemm else ""
        return f"{self.arch} CPU, ISA {isa}; bf16/fp16 {half}{kernels}{fp8}"

    def facts(self) -> dict:
        """JSON-able, for result rows."""
        return {"arch": self.arch, "isa": sorted(self.isa), "cuda": [list(c) for c in self.cuda],
                "vllm_library": self.vllm_library,
                "vllm_ops": None if self.vllm_ops is None else sorted(self.vllm_ops),
                "cpu_native_half": self.cpu_native_half, "numa_nodes": self.numa_nodes,
                "fp8_gemm": self.fp8_gemm}


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@lru_cache(maxsize=None)
def detect(vllm: bool = False) -> Machine:
    """This machine. `vllm=True` also loads vLLM's kernel library and lists
    the ops it has (a few seconds; only the evaluate stage needs it)."""
    arch = platform.machine()
    x86 = arch.lower() in X86
    machine = Machine(arch=arch, isa=_torch_x86_isa() if x86 else frozenset(cpu_flags() & set(ISA_FLAGS)),
                      numa_nodes=numa_nodes(), **_cuda())
    if vllm and not machine.cuda:
        machine = replace(machine, **_vllm_cpu_kernels())
    return machine


def numa_nodes() -> int:
    """NUMA nodes that hold a CPU this process may run on (vLLM-CPU's automatic
    thread binding gives each tensor-parallel rank one of them); 1 when the
    kernel does not say."""
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
    """The x86 ISA as torch sees it: the same queries vLLM uses to choose its
    kernel library, so both decide from one answer."""
    import torch
    queries = {"avx2": "_is_avx2_supported", "avx512f": "_is_avx512_supported",
               "avx512_vnni": "_is_vnni_supported", "avx512_bf16": "_is_avx512_bf16_supported",
               "amx_tile": "_is_amx_tile_supported"}
    isa = {flag for flag, query in queries.items() if getattr(torch.cpu, query, lambda: False)()}
    if "amx_tile" in isa:
        isa |= {"amx_bf16", "amx_int8"}
    if "avx512f" not in isa:
        isa.discard("avx512_vnni")  # torch's VNNI query also answers for AVX-VNNI
    return frozenset(isa)


def _cuda() -> dict:
    try:
        import torch
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return {"cuda": tuple(torch.cuda.get_device_capability(i) for i in range(n)),
                    "gpu_names": tuple(torch.cuda.get_device_name(i) for i in range(n))}
    except Exception:  # a broken CUDA setup is a machine without CUDA here
        pass
    return {}


def _vllm_cpu_kernels() -> dict:
    """Ask what is loaded: vLLM picks _C, _C_AVX512 or _C_AVX2 at import, and
    _C_AVX2 has no int4 kernel."""
    try:
        import torch
        from vllm.platforms import current_platform
        current_platform.import_kernels()
    except Exception:  # no vLLM in this environment
        return {}
    ops = frozenset(op for op in VLLM_CPU_OPS if hasattr(torch.ops._C, op))
    return {"vllm_library": _loaded_vllm_library(), "vllm_ops": ops, "fp8_gemm": _fp8_gemm()}


def _fp8_gemm() -> str | None:
    """See Machine.fp8_gemm. vLLM-CPU has an FP8 W8A8 kernel only with AMX-FP8
    (scaled_mm/cpu.py); elsewhere it calls torch._scaled_mm, which torch hands
    to oneDNN on some CPUs, and oneDNN's verbose line names the implementation
    it picked: on an AMX host without AMX-FP8 that was its reference code,
    2 s for one 64x576x3072 product (bf16: 0.3 ms)."""
    import torch
    if hasattr(torch.ops._C, "cpu_has_amx_fp8") and torch.ops._C.cpu_has_amx_fp8():
        return "amx_fp8"
    a = torch.zeros(4, 32).to(torch.float8_e4m3fn)
    one = torch.ones(1)
    with tempfile.TemporaryFile(mode="w+") as log:
        try:  # oneDNN prints its verbose lines to the process's stdout
            with redirected_stdout(log.fileno()), torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        except (RuntimeError, NotImplementedError):  # what vLLM's fallback would hit at start-up
            return "unavailable"
        except Exception:  # the probe itself failed: say nothing rather than something wrong
            return None
        log.seek(0)
        found = re.search(r"primitive,exec,cpu,matmul,([^,]+),", log.read())
    return found.group(1) if found else "torch"


def _loaded_vllm_library() -> str | None:
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            name = line.rsplit("/", 1)[-1]
            if "/vllm/_C" in line and name.endswith(".so"):
                return name.split(".")[0]
    except OSError:
        pass
    return None
