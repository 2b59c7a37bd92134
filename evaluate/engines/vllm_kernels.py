"""What the installed vLLM has on this machine: whether it imports at all
(and is the build for this machine: CUDA or CPU), and on a CPU which kernel
library it loaded, which ops that library has and who runs an FP8 matmul.
The vLLM engine asks this (VllmEngine.machine) and attaches the answer to
the machine facts as `machine.engine("vllm")`; the rules in
evaluate/engines/vllm.py decide from it. A machine without the record (a
kind printed by `machine=`) is judged as if vLLM were installed."""
import re
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from evaluate.formats import FP8_BLOCK, FP8_PER_TENSOR, FP8_PER_TOKEN, FP8_WEIGHT_ONLY
from quantize.common.stdout import redirected_stdout

# vLLM ops whose presence decides a format on CPU (vllm/_custom_ops.py names).
VLLM_CPU_OPS = ("cpu_gemm_wna16", "onednn_scaled_mm", "fp8_scaled_mm_cpu")
# The command that installs the vLLM build this machine needs (it picks cuda or cpu).
SETUP_COMMAND = "bash scripts/setup.sh"


@dataclass(frozen=True)
class VllmKernels:
    installed: bool = True                     # vllm imports here, in the build for this machine
    missing: str = ""                          # why not, one line (the import error, or the wrong build)
    library: str | None = None                 # CPU kernel library vLLM loaded (_C, _C_AVX512, _C_AVX2)
    ops: frozenset | None = None               # subset of VLLM_CPU_OPS present; None: not probed
    # Who runs an FP8 checkpoint's matmuls in vLLM-CPU here: "amx_fp8" (its own kernel), else the
    # torch._scaled_mm fallback, run by oneDNN (its implementation, e.g. "ref:any") or by torch
    # itself ("torch"); "unavailable": that fallback fails here; None: not probed.
    fp8_gemm: str | None = None
    # The kernel class the installed vLLM-CPU picks here for each FP8 strategy (evaluate.formats'
    # FP8_*), None where it has none (its start fails); None: not asked (FP8_KERNELS then says).
    fp8_kernels: dict | None = None
    # The vLLM release whose CUDA rules apply (vllm_cuda_rules.rules_for); None: the installed
    # one. Set to judge rows another machine measured with another vLLM (scripts/device/rules_vs_observed.py).
    release: str | None = None

    def facts(self) -> dict:
        """The row keys (vllm_library, vllm_ops, fp8_gemm as rows have always had them)."""
        return {"vllm_installed": self.installed, "vllm_library": self.library,
                "vllm_ops": None if self.ops is None else sorted(self.ops), "fp8_gemm": self.fp8_gemm,
                "vllm_fp8_kernels": self.fp8_kernels}

    def describe(self) -> str:
        if not self.installed:
            return f"vLLM not usable ({self.missing})"
        text = ""
        if self.library:
            text = f"vLLM kernel library {self.library} with " + (
                ", ".join(sorted(self.ops)) if self.ops else "none of " + ", ".join(VLLM_CPU_OPS))
        if self.fp8_gemm:
            text += ("; " if text else "") + f"fp8 matmul {self.fp8_gemm}"
        return text

    def refusal(self) -> str:
        """The one line every vLLM cell shows where vLLM cannot run here."""
        return f"vLLM is not usable here ({self.missing}); run `{SETUP_COMMAND}` (it installs the cuda or cpu " \
               "build this machine needs)"


# What each vLLM-CPU kernel library was seen to hold, by the kind of CPU that
# loads it: the capability table prints a kind you are not on from these.
KERNELS_BY_CPU_KIND = {
    "avx2": VllmKernels(library="_C_AVX2", ops=frozenset({"onednn_scaled_mm"})),
    "avx512": VllmKernels(library="_C_AVX512", ops=frozenset({"onednn_scaled_mm", "cpu_gemm_wna16"})),
    "avx512_bf16": VllmKernels(library="_C", ops=frozenset(VLLM_CPU_OPS)),
    "amx": VllmKernels(library="_C", ops=frozenset(VLLM_CPU_OPS), fp8_gemm="ref:any"),  # AMX without AMX-FP8
}


# What vLLM-CPU 0.32's kernel selection picks for each FP8 strategy (None: no
# kernel, the start fails in create_weights), by what it reads of the CPU:
# AMX tiles (torch.cpu._is_amx_tile_supported) and AMX-FP8 (cpu_has_amx_fp8).
# The candidates and their order: vllm/model_executor/kernels/linear/__init__.py
# (_POSSIBLE_FP8_KERNELS, _POSSIBLE_FP8_BLOCK_KERNELS, _POSSIBLE_WFP8A16_KERNELS,
# whose CPU list is empty); what each CPU kernel needs: scaled_mm/cpu.py
# (CPUFP8W8A8* need AMX-FP8; CPUFp8PerTensor* and CPUFp8BlockScaledMMKernel, bf16
# activations on AMX BRGEMM, need AMX tiles and the fp8_scaled_mm_cpu op of _C);
# the *Torch* kernels are scaled_mm/pytorch.py's torch._scaled_mm fallback.
# This machine asks the installed vLLM instead (fp8_kernels_here); a test checks
# these rows against that selection with each CPU fact set.
FP8_KERNELS = {
    "amx_fp8": {FP8_PER_TENSOR: "CPUFP8W8A8ScaledMMLinearKernel", FP8_PER_TOKEN: "CPUFP8W8A8ScaledMMLinearKernel",
                FP8_BLOCK: "CPUFp8W8A8BlockScaledMMKernel", FP8_WEIGHT_ONLY: None},
    "amx": {FP8_PER_TENSOR: "CPUFp8PerTensorScaledMMLinearKernel",
            FP8_PER_TOKEN: "ChannelWiseTorchFP8ScaledMMLinearKernel",
            FP8_BLOCK: "CPUFp8BlockScaledMMKernel", FP8_WEIGHT_ONLY: None},
    "no_amx": {FP8_PER_TENSOR: "PerTensorTorchFP8ScaledMMLinearKernel",
               FP8_PER_TOKEN: "ChannelWiseTorchFP8ScaledMMLinearKernel", FP8_BLOCK: None, FP8_WEIGHT_ONLY: None},
}
# The AMX kernels that write only bf16 or float32 (scaled_mm/cpu.py, can_implement: "Only bfloat16/float32
# output dtype supported"; the layer's output dtype is the model's, compressed_tensors_w8a8_fp8.py), and
# what vLLM's selection picks instead under float16: the next candidate that takes it (None: none does).
BF16_FP32_OUT_KERNELS = {"CPUFp8PerTensorScaledMMLinearKernel": "PerTensorTorchFP8ScaledMMLinearKernel",
                         "CPUFp8BlockScaledMMKernel": None, "CPUFp8W8A8BlockScaledMMKernel": None}
BF16_FP32 = ("bfloat16", "float32")
# The kernels that hand the matmul to torch._scaled_mm (scaled_mm/pytorch.py): fp8_gemm says who runs it.
TORCH_FP8_KERNELS = frozenset({"PerTensorTorchFP8ScaledMMLinearKernel", "ChannelWiseTorchFP8ScaledMMLinearKernel",
                               "RowWiseTorchFP8ScaledMMLinearKernel"})


def fp8_kernels(kernels: VllmKernels | None, isa: frozenset, dtype: str = "bfloat16") -> dict:
    """{FP8 strategy: the kernel vLLM-CPU picks for a model run in `dtype`, or None}: as asked here
    (for bf16), else FP8_KERNELS' row, with BF16_FP32_OUT_KERNELS' limit applied."""
    if kernels is not None and kernels.fp8_kernels is not None:
        chosen = kernels.fp8_kernels
    elif kernels is not None and kernels.fp8_gemm == "amx_fp8":
        chosen = FP8_KERNELS["amx_fp8"]
    else:
        chosen = FP8_KERNELS["amx" if "amx_tile" in isa else "no_amx"]
    if dtype in BF16_FP32:
        return chosen
    return {strategy: BF16_FP32_OUT_KERNELS.get(kernel, kernel) for strategy, kernel in chosen.items()}


@lru_cache(maxsize=None)
def probe(cuda: bool) -> VllmKernels:
    """Import vLLM and ask it (a few seconds): on a CPU, load its kernel
    library as vLLM does at start-up (vllm/platforms/cpu.py, import_kernels)."""
    try:
        from vllm.platforms import current_platform
    except Exception as e:  # not installed, or a build that does not import here
        return VllmKernels(installed=False, missing=first_line(e))
    if cuda and not current_platform.is_cuda():
        return VllmKernels(installed=False, missing="the installed vLLM is not a CUDA build, and this machine "
                                                    "has a CUDA GPU")
    if not cuda and not current_platform.is_cpu():
        return VllmKernels(installed=False, missing="the installed vLLM is not the CPU build, and this machine "
                                                    "has no CUDA GPU")
    return VllmKernels() if cuda else _cpu_kernels()


def first_line(e: Exception) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def _cpu_kernels() -> VllmKernels:
    """Ask what is loaded: vLLM picks _C, _C_AVX512 or _C_AVX2 at import, and
    _C_AVX2 has no int4 kernel."""
    import torch
    from vllm.platforms import current_platform
    try:
        current_platform.import_kernels()
    except Exception as e:  # the kernel library does not load: no engine would start
        return VllmKernels(installed=False, missing=f"its kernel library does not load: {first_line(e)}")
    ops = frozenset(op for op in VLLM_CPU_OPS if hasattr(torch.ops._C, op))
    return VllmKernels(library=_loaded_library(), ops=ops, fp8_gemm=_fp8_gemm(), fp8_kernels=fp8_kernels_here())


def fp8_kernels_here(dtype: str = "bfloat16") -> dict | None:
    """Ask the installed vLLM's own kernel selection which kernel each FP8
    strategy gets on this machine, with the scale keys its schemes build
    (compressed_tensors_w8a8_fp8.py, compressed_tensors_w8a16_fp8.py) and the
    candidate lists create_weights passes (kernels/linear/__init__.py:
    init_fp8_linear_kernel, init_wfp8_a16_linear_kernel); no engine starts.
    The layer shape is SmolLM2-135M's MLP (every size a multiple of 32, as
    the AMX kernels need), run in `dtype`. None where this vLLM's selection has another shape."""
    try:
        import torch
        from vllm.model_executor.kernels import linear
        from vllm.model_executor.layers.quantization.utils import quant_utils as q
        block_weight = q.create_fp8_quant_key(static=True, group_shape=q.GroupShape(128, 128))
        block_input = q.create_fp8_quant_key(static=False, group_shape=q.GroupShape(1, 128))
        asked = {  # strategy: (weight key, activation key, candidates, the name --linear-backend knows it by)
            FP8_PER_TENSOR: (q.kFp8StaticTensorSym, q.kFp8StaticTensorSym, linear._POSSIBLE_FP8_KERNELS, "fp8_w8a8"),
            FP8_PER_TOKEN: (q.kFp8StaticChannelSym, q.kFp8DynamicTokenSym, linear._POSSIBLE_FP8_KERNELS, "fp8_w8a8"),
            FP8_BLOCK: (block_weight, block_input, linear._POSSIBLE_FP8_BLOCK_KERNELS, "fp8_block_w8a8"),
            FP8_WEIGHT_ONLY: (q.kFp8StaticChannelSym, q.kFp8DynamicTensorSym, linear._POSSIBLE_WFP8A16_KERNELS,
                              "w8a16_fp8"),
        }
        chosen = {}
        for strategy, (weight, activation, candidates, name) in asked.items():
            config = linear.FP8ScaledMMLinearLayerConfig(
                weight_quant_key=weight, activation_quant_key=activation, weight_shape=(1536, 576),
                input_dtype=getattr(torch, dtype), out_dtype=getattr(torch, dtype))
            try:
                chosen[strategy] = linear.choose_scaled_mm_linear_kernel(config, candidates, quantization=name).__name__
            except ValueError:  # "Failed to find a kernel that can implement the ScaledMM linear layer"
                chosen[strategy] = None
        return chosen
    except Exception:  # another vLLM: FP8_KERNELS' rows judge instead
        return None


def _fp8_gemm() -> str | None:
    """See VllmKernels.fp8_gemm. vLLM-CPU has an FP8 W8A8 kernel only with
    AMX-FP8 (scaled_mm/cpu.py); elsewhere it calls torch._scaled_mm, which
    torch hands to oneDNN on some CPUs, and oneDNN's verbose line names the
    implementation it picked: on an AMX host without AMX-FP8 that was its
    reference code, 2 s for one 64x576x3072 product (bf16: 0.3 ms)."""
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


def _loaded_library() -> str | None:
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            name = line.rsplit("/", 1)[-1]
            if "/vllm/_C" in line and name.endswith(".so"):
                return name.split(".")[0]
    except OSError:
        pass
    return None
