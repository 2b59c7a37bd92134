"""evaluate/scenarios.py loading: names in conf/scenario/, files given by path
(`scenario=/path/to/my.yaml`, through the same command-line rewriting and
Hydra composition as `python -m evaluate`), and set files with includes."""
import pytest
from hydra import compose, initialize_config_dir

from evaluate import scenarios
from evaluate.config import scenario_choice
from evaluate.scenarios import Scenario
from quantize.common.config import expand_path_shorthands, register
from quantize.common.errors import UserError
from quantize.common.paths import CONF_DIR

TINY = "name: my_tiny\nbatch_size: 2\ninput_len: 32\noutput_len: 16\n"


def scenario_cfg(*overrides: str):
    """The typed scenario choice `python -m evaluate <overrides>` composes and converts."""
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return scenario_choice(compose(config_name="evaluate", overrides=expand_path_shorthands(list(overrides))).scenario)


def test_a_name_loads_from_conf():
    (s,) = scenarios.resolve(scenario_cfg("scenario=interactive"))
    assert s == Scenario("interactive", 1, 128, 64)
    assert scenarios.is_set(scenario_cfg("scenario=cpu")) and not scenarios.is_set(scenario_cfg("scenario=base"))
    assert [s.name for s in scenarios.resolve(scenario_cfg("scenario=cpu"))] == [
        "interactive", "medium_batch", "cpu_prefill"]


def test_a_file_given_by_path(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    cfg = scenario_cfg(f"scenario={tmp_path / 'tiny.yaml'}")
    assert not scenarios.is_set(cfg)
    assert scenarios.resolve(cfg) == [Scenario("my_tiny", 2, 32, 16)]  # named by its `name:`
    (tmp_path / "unnamed.yaml").write_text("batch_size: 1\ninput_len: 8\noutput_len: 4\n")
    assert scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'unnamed.yaml'}"))[0].name == "unnamed"


def test_a_relative_path_is_taken_from_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    assert scenarios.resolve(scenario_cfg("scenario=tiny.yaml"))[0].name == "my_tiny"
    assert scenarios.resolve(scenario_cfg("scenario=./tiny.yaml"))[0].name == "my_tiny"


def test_command_line_keys_go_over_the_file(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (s,) = scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'tiny.yaml'}", "+scenario.input_len=64"))
    assert (s.name, s.batch_size, s.input_len) == ("my_tiny", 2, 64)


def test_a_set_file_includes_files_next_to_it_then_conf(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "interactive.yaml").write_text("name: my_interactive\nbatch_size: 1\ninput_len: 4\noutput_len: 4\n")
    (tmp_path / "pair.yaml").write_text("name: my_pair\ninclude: [tiny, interactive, decode_bound]\n")
    cfg = scenario_cfg(f"scenario={tmp_path / 'pair.yaml'}")
    assert scenarios.is_set(cfg)
    assert [s.name for s in scenarios.resolve(cfg)] == ["my_tiny", "my_interactive", "decode_bound"]


def test_a_set_file_may_include_paths(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "tiny.yaml").write_text(TINY)
    (tmp_path / "pair.yaml").write_text("include: [sub/tiny.yaml]\n")
    assert scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'pair.yaml'}")) == [Scenario("my_tiny", 2, 32, 16)]
    assert scenarios.load(str(tmp_path / "sub" / "tiny.yaml")) == Scenario("my_tiny", 2, 32, 16)


def test_all_leaves_out_sets_and_the_file_option():
    names = [s.name for s in scenarios.resolve(scenario_cfg("scenario=all"))]
    assert "interactive" in names and "base" in names
    assert not {"cpu", "reference", "none", "all", "file"} & set(names)


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_a_missing_path_is_one_line_naming_the_fix(tmp_path):
    missing = tmp_path / "nowhere" / "my.yaml"
    with pytest.raises(UserError) as e:
        scenarios.resolve(scenario_cfg(f"scenario={missing}"))
    message = one_line_error(e)
    assert str(missing) in message and "does not exist" in message
    assert "scenario=<path to a scenario YAML>" in message and "interactive" in message


def test_a_set_file_naming_a_missing_scenario(tmp_path):
    (tmp_path / "pair.yaml").write_text("include: [tiny, no_such_scenario]\n")
    (tmp_path / "tiny.yaml").write_text(TINY)
    with pytest.raises(UserError) as e:
        scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'pair.yaml'}"))
    message = one_line_error(e)
    assert "'no_such_scenario'" in message and str(tmp_path) in message and "known: " in message


def test_a_file_that_is_not_a_scenario(tmp_path):
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="not a mapping"):
        scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'list.yaml'}"))
    (tmp_path / "half.yaml").write_text("name: half\nbatch_size: 1\n")
    with pytest.raises(UserError, match="half has no input_len or output_len; give each an integer"):
        scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'half.yaml'}"))


def test_a_bad_shape_names_the_override_that_reaches_it(tmp_path):
    """scenario.<key>= sets a scenario chosen by name; a file's key is added
    with +scenario.<key>= (scenario.<key>= is refused there)."""
    with pytest.raises(UserError, match=r"pass one \(`batch_size: 8` in its file, or scenario.batch_size=8\)$"):
        scenarios.resolve(scenario_cfg("scenario=interactive", "scenario.batch_size=0"))
    (tmp_path / "half.yaml").write_text("name: half\nbatch_size: 1\ninput_len: 8\n")
    with pytest.raises(UserError, match=r"\(`output_len:` in its file, or \+scenario.output_len=<integer>\)$"):
        scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'half.yaml'}"))
    (s,) = scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'half.yaml'}", "+scenario.output_len=4"))
    assert s == Scenario("half", 1, 8, 4)   # the fix named works as typed
    (tmp_path / "nameless.yaml").write_text("name: null\nbatch_size: 1\ninput_len: 8\noutput_len: 4\n")
    with pytest.raises(UserError, match=r"has no name; give it one \(`name:` in its file\)$"):   # its name: is the file's
        scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'nameless.yaml'}"))


def test_an_unknown_name_still_names_the_known_ones():
    with pytest.raises(UserError, match="unknown scenario 'no_such'.*interactive"):
        scenarios.load("no_such")


LADDERS = {  # set -> (batch sizes, input lengths, output length)
    "batch_ladder": ([1, 2, 4, 8, 16], [128], 16),
    "batch_ladder_gpu": ([1, 2, 4, 8, 16, 32], [512], 64),
    "context_ladder": ([1], [128, 512, 1024, 2048, 4096], 16),
    "context_ladder_gpu": ([1], [1024, 6144, 14336, 30720], 256),
}


@pytest.mark.parametrize("name", LADDERS)
def test_the_ladders_are_sets_of_inline_scenarios(name):
    cfg = scenario_cfg(f"scenario={name}")
    assert scenarios.is_set(cfg)
    found = scenarios.resolve(cfg)
    batches, inputs, output = LADDERS[name]
    assert [(s.batch_size, s.input_len, s.output_len) for s in found] == [
        (b, i, output) for b in batches for i in inputs]
    assert len({s.name for s in found}) == len(found)


def test_all_leaves_out_sets_of_inline_scenarios():
    names = {s.name for s in scenarios.resolve(scenario_cfg("scenario=all"))}
    assert not {"bs1", "ctx128", "batch_ladder", "context_ladder"} & names


def test_a_set_may_include_and_define_scenarios(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "mixed.yaml").write_text("name: mixed\ninclude: [tiny, interactive]\nscenarios:\n"
                                         "  - {name: bs2, batch_size: 2, input_len: 8, output_len: 4}\n")
    cfg = scenario_cfg(f"scenario={tmp_path / 'mixed.yaml'}")
    assert scenarios.is_set(cfg)
    assert scenarios.resolve(cfg) == [Scenario("my_tiny", 2, 32, 16), Scenario("interactive", 1, 128, 64),
                                      Scenario("bs2", 2, 8, 4)]


@pytest.mark.parametrize("body, match", [
    ("include: [interactive]\nscenarios:\n  - {name: interactive, batch_size: 2, input_len: 8, output_len: 4}\n",
     "interactive appear more than once"),
    ("scenarios:\n  - {name: a, batch_size: 1, input_len: 8, output_len: 4}\n"
     "  - {name: a, batch_size: 2, input_len: 8, output_len: 4}\n", "a appear more than once"),
    ("scenarios: [bs1]\n", "scenarios must be a list of mappings"),
    ("scenarios:\n  - {name: half, batch_size: 1}\n", "half has no input_len or output_len"),
    ("scenarios:\n  - {batch_size: 1, input_len: 8, output_len: 4}\n", "has no name; give it one"),
    ("scenarios:\n  - {name: [a], batch_size: 1, input_len: 8, output_len: 4}\n", "has no name; give it one"),
    # int() read these as batch 2 and batch 1: another shape than the file's, timed without a word
    ("scenarios:\n  - {name: a, batch_size: 2.5, input_len: 8, output_len: 4}\n",
     r"scenario a: batch_size=2.5 is not an integer >= 1; pass one \(`batch_size: 8` in its file\)$"),
    ("scenarios:\n  - {name: a, batch_size: true, input_len: 8, output_len: 4}\n", "a: batch_size=true is not an integer"),
    ("scenarios:\n  - {name: a, batch_size: 1, input_len: '8', output_len: 4}\n", "a: input_len=8 is not an integer"),
    ("scenarios:\n  - {name: a, batch_size: 1, input_len: 8, output_len: 0}\n", "a: output_len=0 is not an integer >= 1"),
])
def test_a_bad_inline_set_is_one_line(tmp_path, body, match):
    (tmp_path / "bad.yaml").write_text(f"name: bad\n{body}")
    with pytest.raises(UserError, match=match) as e:
        scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'bad.yaml'}"))
    one_line_error(e)


GRID = '''"""A scenario set computed by code: every batch size with every input length."""
from dataclasses import dataclass

from evaluate.scenarios import Scenario, ScenarioChoice


@dataclass
class Grid(ScenarioChoice):
    name: str
    batch_sizes: list
    input_lens: list
    output_len: int

    def resolve(self):
        return [Scenario(f"b{b}_i{i}", b, i, self.output_len) for b in self.batch_sizes for i in self.input_lens]
'''


def test_a_scenario_set_computed_by_code_is_one_module_and_one_yaml(tmp_path, monkeypatch):
    """The scenario group is an extension point: a YAML on Hydra's search path
    names its class with `_target_`, nothing in evaluate/ lists it."""
    (tmp_path / "grid_set.py").write_text(GRID)
    (tmp_path / "scenario").mkdir()
    (tmp_path / "scenario" / "grid.yaml").write_text(
        "_target_: grid_set.Grid\nname: grid\nbatch_sizes: [1, 4]\ninput_lens: [8, 16]\noutput_len: 4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    choice = scenario_cfg("scenario=grid", f"hydra.searchpath=[file://{tmp_path}]")
    assert scenarios.is_set(choice)
    assert [(s.name, s.batch_size, s.input_len) for s in scenarios.resolve(choice)] == [
        ("b1_i8", 1, 8), ("b1_i16", 1, 16), ("b4_i8", 4, 8), ("b4_i16", 4, 16)]
    # a set file that names a class which is not a scenario choice: one line naming the fix
    (tmp_path / "scenario" / "bad.yaml").write_text("_target_: grid_set.Scenario\nname: bad\n")
    with pytest.raises(UserError, match="is not a subclass of evaluate.scenarios.ScenarioChoice") as e:
        scenario_cfg("scenario=bad", f"hydra.searchpath=[file://{tmp_path}]")
    one_line_error(e)


def test_the_file_option_without_a_path_names_the_fix():
    with pytest.raises(UserError, match="scenario=file needs a path") as e:
        scenario_cfg("scenario=file")
    one_line_error(e)


def test_a_name_given_on_the_command_line_labels_a_files_scenario_over_its_own(tmp_path):
    """scenario.name= over a file with a `name:` of its own was dropped without a word."""
    (tmp_path / "x.yaml").write_text("name: mine\nbatch_size: 1\ninput_len: 8\noutput_len: 2\n")
    (tmp_path / "pair.yaml").write_text("name: own_set\ninclude: [x]\n")
    chosen = f"scenario={tmp_path / 'x.yaml'}"
    assert scenarios.resolve(scenario_cfg(chosen)) == [Scenario("mine", 1, 8, 2)]
    assert scenarios.resolve(scenario_cfg(chosen, "scenario.name=theirs")) == [Scenario("theirs", 1, 8, 2)]
    assert scenario_cfg(f"scenario={tmp_path / 'pair.yaml'}", "scenario.name=renamed").chosen().name == "renamed"


def test_a_sets_include_of_one_name_names_the_list_to_pass():
    """`-m scenario.include=interactive,cpu` sweeps one job per name, each
    refused: the line says how to pass the list."""
    with pytest.raises(UserError) as e:
        scenarios.resolve(scenario_cfg("scenario=reference", "scenario.include=interactive"))
    assert one_line_error(e) == (
        "scenario reference: include must be a list of scenarios or 'all', not 'interactive'; pass a list in "
        "brackets, e.g. scenario.include=[interactive] (under -m, a comma without brackets sweeps one job per name)")


def test_an_unknown_key_of_a_sets_scenario_is_refused_as_in_a_file_chosen_alone(tmp_path):
    """A typo in a set's own scenarios or in an included file was dropped
    without a word (the scenario ran with another shape, or the setting was
    ignored); the same file chosen alone refuses it."""
    (tmp_path / "x.yaml").write_text("name: x\nbatch_size: 1\ninput_len: 8\noutput_len: 2\nnum_prompts: 100\n")
    (tmp_path / "inc.yaml").write_text("name: inc\ninclude: [x]\n")
    (tmp_path / "own.yaml").write_text("name: own\nscenarios:\n"
                                       "  - {name: y, batch_size: 1, input_len: 8, outptu_len: 2, output_len: 4}\n")
    alone = f"{tmp_path / 'x.yaml'}: 'num_prompts' is not a setting of OneScenario; it takes name, batch_size, " \
            "input_len, output_len"
    for file, message in (("x.yaml", alone), ("inc.yaml", alone),
                          ("own.yaml", "scenario y of set own: 'outptu_len' is not a setting of OneScenario; "
                                       "did you mean output_len?")):
        with pytest.raises(UserError) as e:
            scenarios.resolve(scenario_cfg(f"scenario={tmp_path / file}"))
        assert one_line_error(e) == message


def test_an_included_file_may_name_its_class_and_a_set_is_no_include(tmp_path):
    (tmp_path / "x.yaml").write_text(f"_target_: evaluate.scenarios.OneScenario\n{TINY}")
    (tmp_path / "pair.yaml").write_text("name: pair\ninclude: [x]\n")
    (tmp_path / "outer.yaml").write_text("name: outer\ninclude: [pair]\n")
    assert scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'pair.yaml'}")) == [Scenario("my_tiny", 2, 32, 16)]
    with pytest.raises(UserError) as e:
        scenarios.resolve(scenario_cfg(f"scenario={tmp_path / 'outer.yaml'}"))
    assert one_line_error(e).startswith(f"{tmp_path / 'pair.yaml'} is a scenario set, and a set includes single")
