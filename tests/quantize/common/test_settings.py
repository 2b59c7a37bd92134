"""quantize/common/settings.py: a flag is true or false and a seed an integer.
bool("no") is True: `force=no` rebuilt an artifact and `skip_completed=no`
skipped, where each now refuses in one line before any work."""
import pytest

from quantize.common.errors import UserError
from quantize.common.settings import flag, integer, is_integer, is_number
from tests.conftest import last_line, run_cli


def test_a_flag_is_true_false_1_or_0_and_anything_else_names_both():
    assert [flag("force", v) for v in (True, False, 1, 0)] == [True, False, True, False]
    for value, spelled in (("no", "no"), ("yes", "yes"), ("off", "off"), (2, "2"), (None, "null")):
        with pytest.raises(UserError, match=rf"^force={spelled}: pass force=true or force=false$"):
            flag("force", value)


def test_a_seed_is_an_integer():
    assert integer("seed", 7) == 7
    for value, spelled in (("abc", "abc"), (1.5, "1.5"), (True, "true")):
        with pytest.raises(UserError, match=rf"^seed={spelled}: pass an integer, e.g. seed=0$"):
            integer("seed", value)
    with pytest.raises(UserError, match=r"^text.num_windows=abc: pass an integer, e.g. text.num_windows=4$"):
        integer("text.num_windows", "abc", 4)


def test_a_bool_is_no_number_and_inf_no_setting():
    assert [is_integer(v) for v in (3, -1, True, 2.0, "3")] == [True, True, False, False, False]
    assert [is_number(v) for v in (3, 2.5, False, float("inf"), float("nan"), "2")] == [True, True] + [False] * 4


def test_an_integer_with_a_minimum_names_it():
    assert integer("n_trials", 1, 20, minimum=1) == 1
    for value in (0, -2, "abc"):
        with pytest.raises(UserError, match=rf"^n_trials={value}: pass an integer >= 1, e.g. n_trials=20$"):
            integer("n_trials", value, 20, minimum=1)


@pytest.mark.parametrize("module, arg", [("quantize", "force=no"), ("quantize", "seed=abc"),
                                         ("quantize", "calibration.num_samples=abc"),
                                         ("evaluate", "skip_completed=no")])
def test_the_commands_refuse_a_flag_or_seed_they_would_misread(tiny_model, tmp_path, module, arg):
    key = arg.partition("=")[0]
    where = [f"artifacts_dir={tmp_path / 'art'}", "recipe=original"] if module == "quantize" else \
        [f"results_dir={tmp_path / 'res'}"]
    proc = run_cli(module, f"model={tiny_model}", *where, arg, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert last_line(proc.stderr).startswith(f"error: {arg}: pass ") and key in last_line(proc.stderr)
    assert not (tmp_path / "art").exists() and not (tmp_path / "res").exists()


@pytest.mark.parametrize("value", ["0", "", "float64x"])
def test_a_calibration_dtype_that_names_no_dtype_is_one_line_before_the_model_loads(tiny_model, tmp_path, value):
    """`calibration_dtype=0` and `=` were read as auto."""
    proc = run_cli("quantize", f"model={tiny_model}", f"artifacts_dir={tmp_path / 'art'}", "recipe=original",
                   f"calibration_dtype={value}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert last_line(proc.stderr) == f"error: calibration_dtype={value}: unknown dtype; use auto, float32, bfloat16 or float16"
    assert not (tmp_path / "art").exists()


@pytest.mark.parametrize("arg, line", [
    # a typed group's field (extensions.Configurable): it failed after the speed runs, at the accuracy pass
    ("accuracy.num_windows=abc", "error: accuracy: num_windows=abc is not an integer; pass an integer for num_windows"),
    ("engine.startup_timeout_s=abc", "error: conf/engine/vllm.yaml: engine.startup_timeout_s=abc is not a number of "
                                     "seconds >= 0; pass e.g. engine.startup_timeout_s=600"),
])
def test_a_group_setting_of_another_type_is_one_line_before_any_engine(tiny_model, tmp_path, arg, line):
    proc = run_cli("evaluate", f"model={tiny_model}", f"results_dir={tmp_path / 'res'}", arg, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert last_line(proc.stderr) == line
    assert "starting vLLM" not in proc.stdout + proc.stderr and not (tmp_path / "res").exists()
