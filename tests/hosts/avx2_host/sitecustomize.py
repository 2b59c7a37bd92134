"""On PYTHONPATH, makes every Python process see an AVX2-only x86 CPU through
torch's ISA queries, which is what vLLM (choosing _C_AVX2, without the int4
kernel) and quantbench's capability layer both ask. The instructions that run
are this host's; only the decisions are those of an AVX2 host."""
import torch.cpu

for _query in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
               "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    setattr(torch.cpu, _query, lambda: False)
