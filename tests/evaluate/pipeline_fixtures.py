"""Fixtures the evaluate-pipeline test files share (test_pipeline*.py import
them): the session's artifacts of the tiny model, and small scenarios."""
from pathlib import Path

import pytest

PIPELINE_RECIPES = ("original", "w8a8_smooth_ptq", "w8a16_awq", "w4a16_rtn")


@pytest.fixture(scope="module")
def eval_artifacts(build_artifact, tiny_model, tmp_path_factory) -> dict[str, Path]:
    """The tiny model and its session artifacts (tests/conftest.py
    build_artifact, shared by every worker: copy one before changing it) of
    four recipes: baseline, W8A8 (vLLM-CPU kernel everywhere), W8A16 (no
    vLLM-CPU kernel), W4A16 (kernel on AVX-512 only); `root`: this module's
    own folder."""
    root = tmp_path_factory.mktemp("eval")
    return {"root": root, "model": tiny_model, **{r: build_artifact(r).dir for r in PIPELINE_RECIPES}}


@pytest.fixture(scope="module")
def scen(tmp_path_factory) -> dict[str, str]:
    """Small scenarios for the tests, passed as a user passes their own:
    `scenario=<path>` (a temp folder, never the checkout's conf/scenario/)."""
    d = tmp_path_factory.mktemp("scenarios")
    files = {
        "test_tiny_a": "name: test_tiny_a\nbatch_size: 1\ninput_len: 32\noutput_len: 16\n",
        "test_tiny_b": "name: test_tiny_b\nbatch_size: 4\ninput_len: 64\noutput_len: 8\n",
        "test_pair": "name: test_pair\ninclude: [test_tiny_a, test_tiny_b]\n",  # found next to it
    }
    for name, text in files.items():
        (d / f"{name}.yaml").write_text(text)
    return {name: f"scenario={d / name}.yaml" for name in files}
