"""The search's checks before the sweep, driven in-process through
evaluate.search's preflight (the composed config, converted as the CLI does)."""
import pytest

from evaluate.search.__main__ import preflight


@pytest.mark.parametrize("study", [[], ["study=my-study"]])
def test_a_model_name_with_a_slash_is_refused_as_model_name_before_any_trial(tmp_path, capsys, study):
    """It was reported as a bad study= the user never set (the default study
    holds model.name), or with study=<name> failed each trial in quantize."""
    with pytest.raises(SystemExit) as exit_:
        preflight(["search=tiny", "model=local", f"model.path={tmp_path / 'ckpt'}", "model.name=org/x",
                   "engine=hf", f"results_dir={tmp_path / 'res'}", *study])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: model.name='org/x' is not a folder name"), lines[0]
    assert "e.g. model.name=my-model" in lines[0] and not (tmp_path / "res").exists()
