"""The reference reports' tables from real runs: a batch ladder (2 batch
sizes) and a context ladder (2 input lengths) on the tiny model, measured
with transformers and the dummy engine (tests/evaluate/engines/dummy_engine.py)
side by side in one `python -m evaluate -m` sweep, then rendered by
layout=batch_table,context_table,oneline from the same rows. The layouts need
two engines' rows, not vLLM's: a reported KV-cache split is rendered in
test_layouts.py, and vLLM's rows carrying it are checked by
tests/evaluate/engines/test_vllm_startup_real.py."""
import os
import shutil

import pytest

from tests.conftest import quantize_env, run_cli, tail
from tests.evaluate.engines.test_base import DUMMY_DIR, DUMMY_YAML
from evaluate import results
from evaluate.report.formatting import MISSING

pytestmark = pytest.mark.slow

ENGINES = ("dummy", "hf")
LADDERS = """\
name: tiny_ladders
scenarios:
  - {name: bs1, batch_size: 1, input_len: 32, output_len: 8}
  - {name: bs4, batch_size: 4, input_len: 32, output_len: 8}
  - {name: ctx96, batch_size: 1, input_len: 96, output_len: 8}
"""


def table_rows(markdown: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in markdown.splitlines()
            if line.startswith("| ") and not line.startswith("|---")]


def with_dummy_engine(folder) -> tuple[str, dict]:
    """The Hydra search-path override and environment that make `engine=dummy`
    a choice (its YAML outside the checkout's conf/, its module on PYTHONPATH)."""
    (folder / "engine").mkdir(parents=True)
    shutil.copy(DUMMY_YAML, folder / "engine" / "dummy.yaml")
    pythonpath = os.pathsep.join((str(DUMMY_DIR), quantize_env()["PYTHONPATH"]))
    return f"hydra.searchpath=[file://{folder}]", {"PYTHONPATH": pythonpath}


@pytest.fixture(scope="module")
def ladders(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ladders")
    (tmp / "ladders.yaml").write_text(LADDERS)
    res, out = tmp / "res", tmp / "reports"
    searchpath, env = with_dummy_engine(tmp / "searchpath")
    run = run_cli("evaluate", "-m", f"model={tiny_model}", f"scenario={tmp / 'ladders.yaml'}",
                  f"engine={','.join(ENGINES)}", searchpath, "accuracy=none", "runs=2", f"results_dir={res}",
                  cwd=tmp, env=env)
    assert run.returncode == 0, tail(run)
    report = run_cli("evaluate.report", f"results_dir={res}", f"out_dir={out}",
                     "layout=batch_table,context_table,oneline", cwd=tmp)
    assert report.returncode == 0, tail(report)
    return results.read(res), {name: (out / f"{name}.md").read_text()
                               for name in ("batch_table", "context_table", "oneline")}


def test_both_engines_measured_every_rung(ladders):
    rows, _ = ladders
    measured = {(r.engine, r.scenario) for r in rows if r.ok and r.kind == "speed"}
    assert measured == {(e, s) for e in ENGINES for s in ("bs1", "bs4", "ctx96")}


def test_batch_table_has_each_batch_size_per_engine(ladders):
    _, md = ladders
    sections = md["batch_table"].split("### ")[1:]  # one per engine and prompt shape
    assert {s.split(" · ")[2] for s in sections} == set(ENGINES)  # model · recipe · engine · setup · prompt
    for section in sections:
        if "prompt 32 tokens" in section.splitlines()[0]:
            sizes = [row[1] for row in table_rows(section)[1:] if row[0] == "Decode (token)"]
            assert sizes == ["1", "4"], section
            assert all(MISSING not in row[2:5] for row in table_rows(section)[1:])  # avg, min, max measured


def test_context_table_puts_the_engines_side_by_side(ladders):
    _, md = ladders
    header, *body = table_rows(md["context_table"])
    assert header[0] == "Input length" and len(header) == 3
    assert sorted(h.rsplit(" · ", 1)[1] for h in header[1:]) == sorted(ENGINES)
    assert [row[0] for row in body] == ["32", "96"]
    for row in body:  # neither engine reports its weights' and KV cache's memory: no split is made up
        assert all(cell.endswith(" GB") and " tok/s · " in cell for cell in row[1:]), row


def test_oneline_gives_each_result_and_its_repro_command(ladders):
    _, md = ladders
    results_lines = [line for line in md["oneline"].splitlines() if line.startswith("- **")]
    assert len(results_lines) == 6
    assert all("tok/s: " in line and "peak_host_mem: " in line and "kv_quant: none" in line for line in results_lines)
    assert md["oneline"].count("repro: `") == 6 and "python -m evaluate" in md["oneline"]
