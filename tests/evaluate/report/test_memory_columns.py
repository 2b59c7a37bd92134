"""The report's memory figures say what they are (evaluate/report/memory_figures.py):
peak host memory is labelled as host memory everywhere; rows measured on a GPU
show the GPU weights the engine reported, its GPU KV cache and the whole
device's memory in use, with a note on `gpu_memory_utilization`; a CPU-only
report has no GPU column. Expected cells are computed here from the rows."""
import statistics

from evaluate.analysis.groups import aggregate
from evaluate.report import build_report
from evaluate.report import memory_figures as memory
from evaluate.report.formatting import MISSING, fmt_fixed
from evaluate.report.tables_csv import summary_records

from .rows import ARTIFACTS, ENGINE_ARGS, HARDWARE, MACHINE, SCENARIOS, heading, main_rows, md_tables, ok_speed, \
    speed_run, store

GPU_HARDWARE = HARDWARE | {"accelerators": ["NVIDIA H100 80GB HBM3"]}
GPU_MACHINE = MACHINE | {"cuda": [[9, 0]], "vllm_library": None, "vllm_ops": None}
GPU_ARGS = ENGINE_ARGS | {"gpu_memory_utilization": 0.9}
# recipe -> what vLLM reported: weights on the GPU, and the KV cache it filled the rest of its share with
ENGINE_MEMORY = {recipe: {"weights_bytes": int(nbytes * 1.01), "kv_cache_bytes": 74_000_000_000 - nbytes}
                 for recipe, (_, _, nbytes, _) in ARTIFACTS.items()}
DEVICE_IN_USE = 77_564_018_688   # NVML: about gpu_memory_utilization of the card, whatever the model


def gpu_rows() -> list:
    """The fixture's speed runs as measured on a GPU: NVML's figure per run, vLLM's per engine start."""
    runs = [(recipe, scenario, i) for recipe in ARTIFACTS for scenario in SCENARIOS for i in range(3)]
    out = []
    for recipe, scenario, i in runs:
        row = speed_run(recipe, scenario, i)
        out.append(row.but(hardware=GPU_HARDWARE, machine=GPU_MACHINE, engine_args=GPU_ARGS, engine_env={},
                           engine_memory=ENGINE_MEMORY[recipe],
                           metrics=row.metrics | {memory.GPU_IN_USE: DEVICE_IN_USE + 1_000_000 * i}))
    return out


def report_md(tmp_path, rows, name="res") -> str:
    store(tmp_path / name, rows)
    build_report(tmp_path / name, tmp_path / f"out-{name}", "T", outputs=("markdown",))
    return (tmp_path / f"out-{name}" / "report.md").read_text()


def mb_text(nbytes) -> str:
    return f"{nbytes / 1e6:.1f}"


def all_headers(md: str) -> set[str]:
    return {h.strip() for line in md.splitlines() if line.startswith("| ") for h in line.strip("| ").split(" | ")}


def test_a_cpu_report_says_host_memory_and_has_no_gpu_column(tmp_path):
    rows = main_rows()
    md = report_md(tmp_path, rows)
    heads = all_headers(md)
    assert memory.HOST_HEADER == "Peak host memory (MB)" and memory.HOST_HEADER in heads
    assert "Peak memory (MB)" not in heads and not any("GPU" in h for h in heads)
    assert "On a GPU, *GPU weights" not in md
    for scenario in SCENARIOS:
        summary = {r["Recipe"]: r for r in md_tables(md, "Summary")[heading(scenario)]}
        detail = {r["Recipe"]: r for r in md_tables(md, "Speed in detail")[heading(scenario)]}
        for recipe in ARTIFACTS:
            runs = ok_speed(rows, recipe, scenario)
            host = statistics.mean(r.metrics["peak_memory_bytes"] for r in runs)
            assert summary[recipe][memory.HOST_HEADER] == mb_text(host)
            assert memory.HOST_HEADER not in detail[recipe]  # the Summary has it
            kv = int(rows[0].engine_env["VLLM_CPU_KVCACHE_SPACE"]) * 2 ** 30
            assert detail[recipe][memory.HOST_KV_HEADER] == mb_text(kv)
        for run in md_tables(md, "Detailed runs")[heading(scenario)]:
            assert memory.HOST_HEADER in run and memory.GPU_IN_USE_HEADER not in run


def test_a_gpu_report_shows_the_gpu_weights_and_says_what_the_whole_device_figure_is(tmp_path):
    rows = gpu_rows()
    md = report_md(tmp_path, rows)
    assert md.index("## What to use on this machine") < md.index("## Summary")
    for scenario in SCENARIOS:
        summary = {r["Recipe"]: r for r in md_tables(md, "Summary")[heading(scenario)]}
        detail = {r["Recipe"]: r for r in md_tables(md, "Speed in detail")[heading(scenario)]}
        for recipe in ARTIFACTS:
            runs = ok_speed(rows, recipe, scenario)
            reported = ENGINE_MEMORY[recipe]
            assert summary[recipe][memory.GPU_WEIGHTS_HEADER] == mb_text(reported["weights_bytes"])
            assert memory.HOST_HEADER not in summary[recipe] and len(summary[recipe]) <= 10
            assert detail[recipe][memory.HOST_HEADER] == mb_text(
                statistics.mean(r.metrics["peak_memory_bytes"] for r in runs))
            assert detail[recipe][memory.GPU_KV_HEADER] == mb_text(reported["kv_cache_bytes"])
            assert detail[recipe][memory.GPU_IN_USE_HEADER] == mb_text(
                statistics.mean(r.metrics[memory.GPU_IN_USE] for r in runs))
            assert memory.HOST_KV_HEADER not in detail[recipe]  # the KV cache is on the GPU, not in host memory
        by_run = {(r["Recipe"], r["Run"]): r for r in md_tables(md, "Detailed runs")[heading(scenario)]}
        for run in rows:
            if run.scenario == scenario:
                cells = by_run[run.recipe, f"run {run.run_index + 1}"]
                assert cells[memory.HOST_HEADER] == mb_text(run.metrics["peak_memory_bytes"])
                assert cells[memory.GPU_IN_USE_HEADER] == mb_text(run.metrics[memory.GPU_IN_USE])
    share = GPU_ARGS["gpu_memory_utilization"]
    note = next(line for line in md.splitlines() if line.startswith("On a GPU, *GPU weights"))
    assert f"(`gpu_memory_utilization`, here {share})" in note and "does not compare them" in note
    assert md.count(note) == 1
    assert "Peak memory (MB)" not in all_headers(md)


def test_cpu_and_gpu_stores_side_by_side_show_each_rows_own_figure(tmp_path):
    cpu, gpu = main_rows(), gpu_rows()
    store(tmp_path / "cpu", cpu)
    store(tmp_path / "gpu", gpu)
    build_report([tmp_path / "cpu", tmp_path / "gpu"], tmp_path / "out", "T", outputs=("markdown",))
    md = (tmp_path / "out" / "report.md").read_text()
    table = md_tables(md, "Summary")[heading("interactive")]
    assert {memory.HOST_HEADER, memory.GPU_WEIGHTS_HEADER} <= set(table[0])
    assert sum("store gpu" in c["Recipe"] for c in table) == sum("store cpu" in c["Recipe"] for c in table) == 3
    for cells in table:
        on_gpu = "store gpu" in cells["Recipe"]
        recipe = cells["Recipe"].split(" (")[0]
        runs = ok_speed(gpu if on_gpu else cpu, recipe, "interactive")
        assert cells[memory.HOST_HEADER] == mb_text(statistics.mean(r.metrics["peak_memory_bytes"] for r in runs))
        assert cells[memory.GPU_WEIGHTS_HEADER] == (mb_text(ENGINE_MEMORY[recipe]["weights_bytes"]) if on_gpu
                                                    else MISSING)


def test_which_rows_are_on_a_gpu():
    gpu = gpu_rows()[0]
    cpu = main_rows()[0]
    assert memory.on_gpu(gpu) and not memory.on_gpu(cpu)
    assert not memory.on_gpu(gpu.but(engine_args={**GPU_ARGS, "device": "cpu"}))  # told to run on the CPU
    bare = cpu.but(machine={}, hardware={}, metrics={memory.GPU_IN_USE: DEVICE_IN_USE})
    assert memory.on_gpu(bare)  # no capability facts: NVML saw a GPU in use
    # what the engine reported on a CPU is host memory: never a GPU figure
    reported = cpu.but(engine_memory={"weights_bytes": 1, "kv_cache_bytes": 2})
    assert memory.gpu_weights_bytes(reported) is None and memory.host_kv_bytes(reported) == 2
    assert memory.gpu_kv_bytes(gpu) == ENGINE_MEMORY[gpu.recipe]["kv_cache_bytes"]


def test_the_summary_and_detail_heads_follow_the_rows():
    cpu, gpu = aggregate(main_rows(), "speed"), aggregate(gpu_rows(), "speed")
    assert memory.summary_heads(cpu) == [memory.HOST_HEADER]
    assert memory.detail_heads(cpu) == [memory.HOST_KV_HEADER]
    assert memory.summary_heads(gpu) == [memory.GPU_WEIGHTS_HEADER]
    assert memory.detail_heads(gpu) == [memory.HOST_HEADER, memory.GPU_KV_HEADER, memory.GPU_IN_USE_HEADER]
    assert memory.gpu_note(cpu) == ""
    # a GPU row whose engine reported no weights (transformers on CUDA) keeps peak host memory as its headline
    unreported = aggregate([r.but(engine_memory=None) for r in gpu_rows()], "speed")
    assert memory.summary_heads(unreported) == [memory.HOST_HEADER]
    assert memory.cells(unreported[0], [memory.GPU_WEIGHTS_HEADER]) == [MISSING]


def test_the_layouts_name_host_and_gpu_memory_apart(tmp_path):
    """oneline and context_table: peak host memory by that name, and on a GPU
    the engine's GPU weights and KV cache (context_table) and the whole device
    (oneline) beside it, never inside it."""
    rows = [r.but(scenario="b1", batch_size=1) for r in gpu_rows() if r.scenario == "interactive"]
    store(tmp_path / "res", rows)
    paths = build_report(tmp_path / "res", tmp_path / "out", "T", layouts=("oneline", "context_table"))
    md = {p.name: p.read_text() for p in paths if p.suffix == ".md"}
    gb = lambda x: fmt_fixed(x / 1e9)  # noqa: E731
    for recipe in ARTIFACTS:
        runs = [r for r in rows if r.recipe == recipe]
        host = statistics.mean(r.metrics["peak_memory_bytes"] for r in runs)
        device = statistics.mean(r.metrics[memory.GPU_IN_USE] for r in runs)
        reported = ENGINE_MEMORY[recipe]
        assert (f"peak_host_mem: {gb(host)} GB, gpu_weights: {gb(reported['weights_bytes'])} GB, "
                f"gpu_in_use: {gb(device)} GB") in md["oneline.md"]
        assert (f"tok/s · host {gb(host)} GB · GPU weights {gb(reported['weights_bytes'])} · "
                f"KV {gb(reported['kv_cache_bytes'])} GB") in md["context_table.md"]
    assert "peak_mem:" not in md["oneline.md"] and "plus device memory" not in "".join(md.values())


def test_summary_csv_carries_the_gpu_figures_under_their_own_keys():
    """The raw keys stay (peak_memory_bytes_* is host memory); the engine's GPU
    weights and KV cache are columns of their own, empty off a GPU."""
    gpu = {(r["recipe"], r["scenario"]): r for r in summary_records(aggregate(gpu_rows(), "speed"))}
    for (recipe, scenario), rec in gpu.items():
        runs = ok_speed(gpu_rows(), recipe, scenario)
        assert rec["gpu_weights_bytes"] == ENGINE_MEMORY[recipe]["weights_bytes"]
        assert rec["gpu_kv_cache_bytes"] == ENGINE_MEMORY[recipe]["kv_cache_bytes"]
        assert rec["peak_memory_bytes_mean"] == statistics.mean(r.metrics["peak_memory_bytes"] for r in runs)
        assert rec[f"{memory.GPU_IN_USE}_mean"] == statistics.mean(r.metrics[memory.GPU_IN_USE] for r in runs)
    for rec in summary_records(aggregate(main_rows(), "speed")):
        assert rec["gpu_weights_bytes"] is None and rec["gpu_kv_cache_bytes"] is None
        assert f"{memory.GPU_IN_USE}_mean" not in rec
