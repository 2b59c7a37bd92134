"""Command-line rewriting shared by both stages (quantize/common/config.py)."""
import os

import pytest

from quantize.common.config import expand_path_shorthands, open_pass_through_keys


@pytest.mark.parametrize("arg, expected", [
    ("engine.args.enable_prefix_caching=false", "++engine.args.enable_prefix_caching=false"),
    ("engine.env.OMP_NUM_THREADS=2", "++engine.env.OMP_NUM_THREADS=2"),
    ("lm_eval.model_args.max_num_seqs=8", "++lm_eval.model_args.max_num_seqs=8"),
    ("engine.args.max_num_seqs=8,16", "++engine.args.max_num_seqs=8,16"),   # a sweep stays a sweep
    ("engine=hf", "engine=hf"),                                               # a group choice is left alone
    ("runs=3", "runs=3"),
    ("++engine.args.seed=1", "++engine.args.seed=1"),                         # already explicit
])
def test_pass_through_keys_accept_any_name(arg, expected):
    assert open_pass_through_keys([arg]) == [expected]


def test_group_options_on_hydra_search_path_are_known(tmp_path):
    import pytest

    from quantize.common.config import check_group_options
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "mine.yaml").write_text("name: mine\n")
    check_group_options(["engine=mine", f"hydra.searchpath=[file://{tmp_path}]"])  # no exit
    with pytest.raises(SystemExit) as e:
        check_group_options(["engine=mine"])
    assert e.value.code == 2


@pytest.fixture
def recipe_dirs(tmp_path, monkeypatch):
    """A conf/recipe/ and a recipes/ of the test's own: two presets (one the
    `file` fallback), a recipe with a preset and one dropped in without."""
    from quantize.common import recipe_choices
    presets, recipes = tmp_path / "conf" / "recipe", tmp_path / "recipes"
    presets.mkdir(parents=True)
    recipes.mkdir()
    (presets / "described.yaml").write_text(
        "name: described\npath: ${qb_root:}/recipes/w4a16_rtn.yaml\ndescription: with a preset\n")
    (presets / "file.yaml").write_text("name: ${stem:${.path}}\npath: ???\ndescription: user recipe\n")
    (recipes / "described.yaml").write_text("{}\n")
    (recipes / "my_own_scheme.yaml").write_text("{}\n")
    monkeypatch.setattr(recipe_choices, "PRESETS_DIR", presets)
    monkeypatch.setattr(recipe_choices, "RECIPES_DIR", recipes)
    return recipes


def test_recipe_choices_are_the_presets_and_the_recipes_dir(recipe_dirs):
    """A YAML dropped into recipes/ is an option under its stem, whatever its
    name; a preset describes its recipe; `file` is no option of its own."""
    from quantize.common.paths import PROJECT_ROOT
    from quantize.common.recipe_choices import RecipeChoice, available, find
    assert available() == [
        RecipeChoice("described", str(PROJECT_ROOT / "recipes" / "w4a16_rtn.yaml"), "with a preset"),
        RecipeChoice("my_own_scheme", str(recipe_dirs / "my_own_scheme.yaml")),
    ]
    assert find("my_own_scheme").path == str(recipe_dirs / "my_own_scheme.yaml")
    assert find("file") is None and find("nope") is None


def test_the_cli_lists_the_same_recipe_choices(recipe_dirs, capsys):
    from quantize.common.config import check_group_options
    check_group_options(["recipe=my_own_scheme"])  # no exit: an option
    with pytest.raises(SystemExit) as e:
        check_group_options(["recipe=nope"])
    assert e.value.code == 2
    assert "my_own_scheme" in capsys.readouterr().err


def test_a_sweep_of_paths_sweeps_the_path_option(tmp_path, monkeypatch):
    """`model=a/,b/` sweeps model.path as Hydra would `model=local model.path=a/,b/`."""
    monkeypatch.chdir(tmp_path)
    assert expand_path_shorthands(["model=./a,./b", "recipe=x.yaml,~/y.yaml"]) == [
        "model=local", f"model.path={tmp_path / 'a'},{tmp_path / 'b'}",
        "recipe=file", f"recipe.path={tmp_path / 'x.yaml'},{os.path.expanduser('~/y.yaml')}"]


@pytest.mark.parametrize("arg", ["recipe=original,w4a16_gptq", "model=smollm2_135m,./a", "model=./a,"])
def test_a_sweep_that_is_not_all_paths_stays_hydras(arg):
    assert expand_path_shorthands([arg]) == [arg]


@pytest.mark.parametrize("order", ["name first", "path first"])
def test_a_sweep_mixing_recipe_names_and_paths_is_one_line_naming_the_paths(order, tmp_path, monkeypatch, capsys):
    """`-m recipe=w4a16_rtn,u/my_w4.yaml` said "unknown recipe 'u/my_w4.yaml'",
    the other order Hydra's "Could not find 'recipe/u/my_w4.yaml'": a sweep is
    over names or over paths; the line gives the list as paths, which works."""
    from quantize.common.config import check_group_options
    from quantize.common.paths import PROJECT_ROOT
    monkeypatch.chdir(tmp_path)
    items = ["w4a16_rtn", "u/my_w4.yaml"] if order == "name first" else ["u/my_w4.yaml", "w4a16_rtn"]
    with pytest.raises(SystemExit) as e:
        check_group_options([f"recipe={','.join(items)}"])
    assert e.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    shipped = str(PROJECT_ROOT / "recipes" / "w4a16_rtn.yaml")
    suggested = ",".join(shipped if item == "w4a16_rtn" else item for item in items)
    assert line.startswith(f"error: recipe={','.join(items)} mixes option names and paths")
    assert f"give every recipe as a path (recipe={suggested}), or sweep the names and the paths in two runs" in line
    assert expand_path_shorthands([f"recipe={suggested}"])[0] == "recipe=file"   # the suggestion is a path sweep


def test_the_cli_refuses_a_mixed_sweep_before_hydra(tmp_path):
    from tests.conftest import run_quantize
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "my_w4.yaml").write_text("quant_stage: {}\n")
    proc = run_quantize("-m", "recipe=u/my_w4.yaml,w4a16_rtn", "model=smollm2_135m", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "mixes option names and paths" in proc.stderr and "Could not find" not in proc.stderr
    assert not (tmp_path / "multirun").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["u"]


@pytest.mark.parametrize("key, names, paths", [("model", "smollm2_135m", "/tmp/some/checkpoint"),
                                                ("calibration", "austen", "/data/chat.jsonl")])
def test_a_mixed_preset_sweep_is_refused_with_two_runs_not_paths(key, names, paths, capsys):
    """A model or calibration preset has no file to give instead of its name:
    the only fix the line offers is two runs, each of which is one sweep."""
    from quantize.common.config import check_group_options
    with pytest.raises(SystemExit) as e:
        check_group_options([f"{key}={names},{paths}"])
    assert e.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(f"mixes option names and paths, which one sweep cannot take; sweep the names and the "
                         f"paths in two runs ({key}={names}, then {key}={paths})")
    assert "as a path" not in line
    for run in (names, paths):   # each run the line names is accepted
        check_group_options([f"{key}={run}"])


@pytest.mark.parametrize("given, path", [("'./a(b)'", "a(b)"), ('"./a(b)"', "a(b)"), (r"./a\(b\)", "a(b)"),
                                         ("'./a, c'", "a, c")])
def test_a_quoted_path_is_the_path_in_the_quotes_as_the_escaped_one(given, path, tmp_path, monkeypatch):
    """`model='/x/a(b)'`, quoted as Hydra's grammar error advises, was joined to
    the working directory quotes and all (/cwd/'/x/a(b)'), and a quoted comma
    was read as a sweep of two models."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from quantize.common.config import check_group_options
    monkeypatch.chdir(tmp_path)
    check_group_options([f"model={given}"])   # no exit
    group, path_arg = expand_path_shorthands([f"model={given}"])
    assert group == "model=local"
    assert OverridesParser.create().parse_override(path_arg).value() == str(tmp_path / path)


@pytest.mark.parametrize("given, paths", [("'./a(b)','./c(d)'", ["a(b)", "c(d)"]),
                                          ("'./a, c',./d", ["a, c", "d"]), (r"./a\(b\),'./c(d)'", ["a(b)", "c(d)"])])
def test_a_sweep_of_quoted_paths_is_those_paths(given, paths, tmp_path, monkeypatch):
    """`model='/x/a(b)','/y/c(d)'`, each path quoted as Hydra's grammar asks,
    was joined to the working directory item by item, quotes and all."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from quantize.common.config import check_group_options
    monkeypatch.chdir(tmp_path)
    check_group_options([f"model={given}"])   # no exit
    group, path_arg = expand_path_shorthands([f"model={given}"])
    assert group == "model=local"
    swept = [getattr(item, "text", item) for item in OverridesParser.create().parse_override(path_arg).value().list]
    assert swept == [str(tmp_path / path) for path in paths]


def test_a_quoted_hub_id_stays_the_id():
    assert expand_path_shorthands(["model='owner/name'"]) == ["model=local", "model.path='owner/name'"]


def test_an_added_key_the_first_job_has_composes_no_other_job(monkeypatch):
    """++calibration.num_samples=8 on a sweep of recipes composed every job,
    though the first one already has the key."""
    from quantize.common import config, hydra_errors
    calls, real = [], hydra_errors.composed_or_raise
    monkeypatch.setattr(hydra_errors, "composed_or_raise",
                        lambda name, overrides: calls.append(tuple(overrides)) or real(name, overrides))
    config.check_added_keys("quantize", "python -m quantize",
                            ["-m", "recipe=original,w4a16_rtn,w4a16_gptq", "++calibration.num_samples=8"])
    assert len(calls) == 1


def test_a_sweep_whose_first_job_fails_composes_no_other(monkeypatch):
    """-m recipe=<3> runz=1 composed all three jobs before raising the first
    one's error; the first job, and the command line less its sweeps, decide."""
    from quantize.common import config, hydra_errors
    calls, real = [], hydra_errors.composed_or_raise
    monkeypatch.setattr(hydra_errors, "composed_or_raise",
                        lambda name, overrides: calls.append(tuple(overrides)) or real(name, overrides))
    argv = ["-m", "recipe=original,w4a16_rtn,w4a16_gptq", "runz=1"]
    config.check_sweep_jobs_compose("quantize", argv, config.SweepJobs("quantize", argv))
    assert calls == [("recipe=original", "runz=1"), ("runz=1",)]
