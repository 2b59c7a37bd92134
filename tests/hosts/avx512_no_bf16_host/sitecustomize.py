"""On PYTHONPATH, makes every Python process see an x86 CPU with AVX-512 and
VNNI but without AVX512-BF16 or AMX (an Intel Xeon of that kind), through
torch's ISA queries: vLLM still loads its AVX-512 library (with the int4
kernel, which computes in bf16) while quantbench's capability layer finds
no native bf16 and runs everything else in float32. The instructions that
run are this host's; only the decisions are those of such a host."""
import torch.cpu

for _query in ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    setattr(torch.cpu, _query, lambda: False)
