"""The check of a forced sweep's folders (`-m seed=0,1 force=true`), run
before Hydra: it stays out of the way of commands that only print, and costs
one composition per choice of config groups, not one per point."""
import hydra
import pytest

from quantize.common.point_folders import check_forced_sweep

SHARED = ["-m", "seed=0,1", "recipe=w4a16_rtn", "force=true"]


def test_a_forced_sweep_sharing_a_folder_is_refused(capsys):
    with pytest.raises(SystemExit) as ended:
        check_forced_sweep("quantize", SHARED)
    assert ended.value.code == 2
    assert "(seed=0) and (seed=1) share" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--cfg", "job"], ["--info", "config"], ["--help"], ["--hydra-help"]])
def test_a_command_that_only_prints_is_left_to_hydra(flag, capsys):
    check_forced_sweep("quantize", SHARED[:1] + flag + SHARED[1:])
    assert capsys.readouterr().err == ""


def test_points_that_differ_in_values_only_are_composed_once(monkeypatch):
    composed = []
    compose = hydra.compose

    def counting(config_name, overrides):
        composed.append(list(overrides))
        return compose(config_name, overrides=overrides)
    monkeypatch.setattr(hydra, "compose", counting)
    check_forced_sweep("quantize", ["-m", "seed=range(0,40)", "recipe=w4a16_rtn,w8a8_smooth_ptq", "force=true",
                                    "artifact_dir=${artifacts_dir}/${model.name}/${recipe.name}-seed${seed}"])
    assert sorted(composed) == [["recipe=w4a16_rtn"], ["recipe=w8a8_smooth_ptq"]]


def test_values_set_after_composing_still_tell_the_points_apart(capsys):
    """calibration.num_samples swept, a folder naming it: apart; the same
    sweep into one folder: refused, naming the fix with that key."""
    sweep = ["-m", "calibration.num_samples=8,16", "recipe=w4a16_rtn", "force=true"]
    check_forced_sweep("quantize", sweep + ["artifact_dir=${artifacts_dir}/${model.name}/${recipe.name}"
                                            "-n${calibration.num_samples}"])
    with pytest.raises(SystemExit):
        check_forced_sweep("quantize", sweep)
    assert "artifact_dir='${artifacts_dir}/${model.name}/${recipe.name}-n${calibration.num_samples}'" in (
        capsys.readouterr().err)
