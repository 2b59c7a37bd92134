"""Hydra's own errors, in every entry point, are one `error:` line and exit 2:
a key the config lacks names the nearest one it has, an unquoted path with a
space says to quote it, a required group not given lists its options. Never
Hydra's screenful or its HYDRA_FULL_ERROR hint."""
import subprocess
import sys

import pytest

from quantize.common.errors import ExitCode
from tests.conftest import quantize_env

# entry point -> (a good override, a misspelt key, the key it names); the report: below
BAD_KEYS = {
    "quantize": ("recipe=original", "artifact_dri=x", "artifact_dir"),
    "quantize.sensitivity": ("recipe=w4a16_rtn", "out_dir=x", "results_dir"),
    "quantize.propose": ("recipe=w4a16_gptq", "max_size=3", "max_size_mb"),
    "evaluate": ("runs=1", "result_dir=x", "results_dir"),
    "evaluate.search": ("n_trials=1", "n_trial=2", "n_trials"),
    "evaluate.capabilities": ("probe=false", "machin=avx2", "machine"),
    "evaluate.track": ("tracking=none", "results_di=x", "results_dir"),
}


def run(module: str, *args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=quantize_env(), capture_output=True,
                          text=True, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("module", list(BAD_KEYS))
def test_an_unknown_key_is_one_line_naming_the_nearest(module, tmp_path):
    good, bad, nearest = BAD_KEYS[module]
    proc = run(module, good, bad, cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    line = one_error_line(proc)
    key = bad.partition("=")[0]
    assert line == (f"error: python -m {module} has no key {key}; did you mean {nearest}? "
                    f"(python -m {module} --help lists its keys)")
    assert not (tmp_path / "results").exists() and not (tmp_path / "artifacts").exists()


def test_a_key_under_an_empty_mapping_is_one_line_giving_the_mapping_form(tmp_path):
    """cost.per_gpu is null by default: Hydra adds no cost.per_gpu.H100, but takes the mapping whole."""
    proc = run("evaluate.report", "cost.per_gpu.H100=2.5", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc) == ("error: python -m evaluate.report has no key cost.per_gpu.H100: cost.per_gpu is "
                                    "empty by default, so set it whole: cost.per_gpu={H100:2.5} "
                                    "(several, quoted against the shell's brace expansion: 'cost.per_gpu={a:1,b:2}')")


def test_a_key_under_a_single_value_says_it_takes_one_value(tmp_path):
    """runs is 3 by default: runs.x=3 is no key, and no near key fixes it."""
    proc = run("evaluate", "runs.x=3", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc) == ("error: python -m evaluate has no key runs.x: runs takes one value, not keys "
                                    "(runs=<value>)")


def test_a_key_whose_name_holds_a_dot_names_the_override_that_reaches_it(tmp_path):
    """search.params' keys are `trial.scheme` and the like: the line said "did you mean
    search.params.trial.scheme?", the key it had just refused."""
    proc = run("evaluate.search", "search=tiny", "search.params.trial.scheme=w8a8", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc) == ("error: python -m evaluate.search has no key search.params.trial.scheme: "
                                    "search.params holds `trial.scheme` as one key, which an override cannot "
                                    "reach; pass trial.scheme=<value>")


def test_the_report_names_its_keys_in_one_line(tmp_path):
    proc = run("evaluate.report", "ouput=[csv]", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc).startswith("error: unknown argument 'ouput=[csv]'; python -m evaluate.report takes ")


# entry point -> (a good override, one value for a setting that holds keys, its keys); Hydra takes
# such a value, and the job failed later with an AttributeError (evaluate's after every speed run)
ONE_VALUE_FOR_KEYS = {
    "quantize": ("recipe=original", "sanity.floors=foo", "other, sparse_2of4, w4, w8a16, w8a8"),
    "quantize.sensitivity": ("recipe=w4a16_rtn", "text=foo", "books, num_windows, source, window_len"),
    "evaluate": ("runs=1", "limits=foo", "batch_size, batch_tokens, runs"),
    "evaluate.search": ("search=tiny", "trial=foo", "dampening, group_size, keep_dense, scheme, smoothquant, sparse_2_4"),
    "evaluate.capabilities": ("probe=false", "limits=foo", "batch_size, batch_tokens, runs"),
    "evaluate.report": ("title=t", "cost=nope", "per_gpu, per_profile, usd_per_hour"),
}


@pytest.mark.parametrize("module", list(ONE_VALUE_FOR_KEYS))
def test_one_value_for_a_setting_that_holds_keys_is_one_line(module, tmp_path):
    good, bad, keys = ONE_VALUE_FOR_KEYS[module]
    proc = run(module, good, bad, cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    key, _, value = bad.partition("=")
    assert one_error_line(proc) == (f"error: {key}={value}: {key} holds keys ({keys}), not one value; "
                                    f"set one as {key}.{keys.split(',')[0]}=<value>")
    assert not (tmp_path / "results").exists() and not (tmp_path / "artifacts").exists()


def test_a_whole_mapping_for_a_setting_that_holds_keys_is_taken(tmp_path):
    proc = run("evaluate", "limits={runs:7}", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "runs: 7" in proc.stdout


@pytest.mark.parametrize("module", ["quantize", "evaluate", "quantize.sensitivity"])
def test_an_unquoted_path_with_a_space_is_one_line(module, tmp_path):
    folder = tmp_path / "my models" / "tiny"
    proc = run(module, "recipe=original", *f"model={folder}".split(" "), cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc) == (
        "error: cannot read the argument 'models/tiny': it is not key=value; a value with a space must be quoted "
        "as one argument, e.g. model='/path/with a space'")


def test_a_value_hydra_cannot_parse_is_one_line(tmp_path):
    proc = run("evaluate", "runs=[1", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc).startswith("error: cannot read 'runs=[1': no viable alternative at input '[1' ")


def test_a_required_group_not_given_lists_its_options(tmp_path):
    proc = run("quantize", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc).startswith("error: python -m quantize needs recipe=<recipe>; choose from ")
    assert "w4a16_gptq" in proc.stderr


@pytest.mark.parametrize("module, args, key, nearest", [
    ("quantize", ["recipe=original", "+calibration.num_sample=8"], "calibration.num_sample", "calibration.num_samples"),
    ("evaluate", ["+runz=5"], "runz", "runs"),
    ("evaluate", ["++runz=5"], "runz", "runs"),
])
def test_a_key_added_with_a_plus_that_the_config_lacks_is_an_unknown_key(module, args, key, nearest, tmp_path):
    """Hydra added the misspelt key beside the one meant, and the job ran on its default."""
    proc = run(module, *args, "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    assert one_error_line(proc) == (f"error: python -m {module} has no key {key}; did you mean {nearest}? "
                                    f"(python -m {module} --help lists its keys)")


def test_a_key_added_in_a_sweep_counts_where_one_of_its_jobs_has_it():
    """engine.startup_timeout_s is vllm_server's, not hf's: `++` sets it for the jobs that have it."""
    from quantize.common import config
    from quantize.common.errors import UserError
    sweep = ["-m", "engine=hf,vllm_server", "++engine.startup_timeout_s=5"]
    config.check_added_keys("evaluate", "python -m evaluate", sweep)
    with pytest.raises(UserError, match="no key engine.startup_timeout; did you mean engine.startup_timeout_s"):
        config.check_added_keys("evaluate", "python -m evaluate", [*sweep, "++engine.startup_timeout=5"])


def test_a_plus_still_adds_where_no_config_file_lists_the_keys(tmp_path):
    """The dicts handed to a library as they are, Hydra's settings, a key the
    config has (++ overrides it), and the settings of a class the command line names."""
    proc = run("evaluate", "+engine.env.QB_X=1", "++engine.args.max_num_seqs=3", "++runs=5",
               "+hydra.job.env_set.QB_Y=2", "engine._target_=my.Engine", "+engine.gate=/tmp/g", "--cfg", "job",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in ("QB_X: 1", "max_num_seqs: 3", "runs: 5", "gate: /tmp/g"):
        assert line in proc.stdout, proc.stdout


@pytest.mark.parametrize("module, args, line", [
    ("evaluate", ["engine=openai", "++engine.retry_backoff_s=2", "scenario.batch_size=1"],
     "error: scenario.batch_size is a key of scenario=base, "),   # not of the default, a set of scenarios
    ("quantize", ["++calibration.num_samples=8"], "error: python -m quantize needs recipe=<recipe>; choose from "),
])
def test_an_added_key_leaves_another_error_of_the_command_line_to_name_itself(module, args, line, tmp_path):
    """The rest did not compose, the check fell back to the defaults, and it
    named the valid added key instead of the bad override or missing group."""
    proc = run(module, *args, "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    assert one_error_line(proc).startswith(line)


def test_an_added_key_of_a_config_the_command_line_names_is_taken(tmp_path):
    """-cd/-cn: the keys are that config's, which the entry's own lacks."""
    (tmp_path / "myeval.yaml").write_text("defaults:\n  - evaluate\n  - _self_\nmyextra: 1\n")
    proc = run("evaluate", "-cd", str(tmp_path), "-cn", "myeval", "++myextra=2", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\nmyextra: 2\n" in proc.stdout


def test_an_added_key_beside_a_sweepers_interval_is_checked_on_the_rest(monkeypatch):
    """interval() has no value to compose with: the whole command line fell
    back to the defaults (engine=vllm), which lack openai's retry_backoff_s."""
    from quantize.common import config
    from quantize.common.errors import UserError
    args = ["-m", "engine=openai", "trial.dampening=interval(0.001,0.1)"]
    monkeypatch.setattr(sys, "argv", ["search", *args, "++engine.retry_backoff_s=2"])
    config.prepare_argv("search")
    monkeypatch.setattr(sys, "argv", ["search", *args, "++engine.retry_backof_s=2"])
    with pytest.raises(UserError, match="no key engine.retry_backof_s; did you mean engine.retry_backoff_s"):
        config.prepare_argv("search")


def test_an_added_key_the_chosen_class_takes_is_taken(tmp_path):
    """A field the group's YAML leaves at its class default (docs/extending.md's
    only_with_server), and any key of a scenario file (`+scenario.<key>=`, over
    the file's own), were refused as unknown; a near miss still is."""
    (tmp_path / "tiny.yaml").write_text("name: tiny\nbatch_size: 2\ninput_len: 16\noutput_len: 4\n")
    proc = run("evaluate", "scenario=tiny.yaml", "+scenario.input_len=64", "load=sweep_gpu",
               "+load.only_with_server=true", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "  input_len: 64\n" in proc.stdout and "  only_with_server: true\n" in proc.stdout
    proc = run("evaluate", "load=sweep_gpu", "+load.only_with_servr=true", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc).startswith("error: python -m evaluate has no key load.only_with_servr")


def test_an_added_key_of_the_gpu_defaults_is_taken_on_a_gpu(monkeypatch):
    """The check composed the CPU defaults (slo=none, load=none) before the
    entry point added hardware=cuda, and refused keys the GPU defaults have."""
    from evaluate import cli, hardware, memory
    jobs = []
    monkeypatch.setattr(hardware, "detected", lambda machine=None: "cuda")
    monkeypatch.setattr(memory, "one_malloc_arena", lambda: None)
    monkeypatch.setattr(cli, "_hydra_main", lambda: jobs.append(sys.argv[1:]))
    monkeypatch.setattr(sys, "argv", ["evaluate", "++slo.ttft_ms=100", "++load.max_requests=50", "--cfg", "job"])
    cli.main()
    assert jobs == [["hardware=cuda", "++slo.ttft_ms=100", "++load.max_requests=50", "--cfg", "job"]]


def test_a_flag_between_overrides_is_read_as_hydra_reads_it_last(tmp_path):
    """Hydra's parser takes one run of overrides: `-m` typed where the sweep is
    thought of (docs/evaluate.md had one) ended in its 9-line usage."""
    from hydra._internal.utils import get_args_parser

    from quantize.common.config import hydra_flags_last
    argv = hydra_flags_last(["recipe=original", "scenario=interactive", "-m", "scenario.batch_size=1,4,16"], "c")
    args = get_args_parser().parse_args(argv)
    assert args.multirun and args.overrides == ["recipe=original", "scenario=interactive", "scenario.batch_size=1,4,16"]
    proc = run("evaluate", "runs=2", "--cfg", "job", "warmup_runs=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\nruns: 2\n" in proc.stdout and "\nwarmup_runs: 2\n" in proc.stdout


@pytest.mark.parametrize("args, line", [
    (["--dry-run"], "error: python -m evaluate has no option --dry-run; it takes key=value overrides, -m for a "
                    "sweep, --cfg job (python -m evaluate --help lists them)"),
    (["runs=2", "--cfg"], "error: --cfg takes one of job, hydra, all: --cfg job prints the composed config"),
    (["--config-name"], "error: --config-name takes a value (python -m evaluate --hydra-help says which)"),
])
def test_a_flag_hydra_lacks_or_one_without_its_value_is_one_line(args, line, tmp_path):
    proc = run("evaluate", *args, cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc) == line and "usage:" not in proc.stderr


@pytest.mark.parametrize("module, args", [
    ("quantize", ["-m", "recipe=original,w4a16_gptq", "--cfg", "job"]),
    ("evaluate", ["runs=1,2", "--info", "config", "--multirun"]),
])
def test_a_sweep_shown_with_a_flag_that_shows_one_job_is_one_line(module, args, tmp_path):
    """Every --help footer offers --cfg job; with -m Hydra raised an unexpected ValueError (exit 1)."""
    proc = run(module, *args, cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    flag = "--cfg" if "--cfg" in args else "--info"
    assert one_error_line(proc) == f"error: {flag} shows one job: drop -m and give one value per key"


@pytest.mark.parametrize("args, line", [
    (["recipe=original,w4a16_gptq"],
     "error: recipe=original,w4a16_gptq is a sweep: add -m (python -m quantize -m recipe=original,w4a16_gptq)"),
    (["recipe=original", "seed=range(0,3)"],
     "error: seed=range(0,3) is a sweep: add -m (python -m quantize -m recipe=original 'seed=range(0,3)')"),
    (["recipe=original", "seed=range(0,3)", "--cfg", "job"],  # -m would clash with --cfg
     "error: seed=range(0,3) is a sweep, and --cfg/--info show one job: give seed one value to see that "
     "job's config"),
    (["recipe=original", "calibration=austen", "calibration.books=emma,persuasion"],
     "error: calibration.books=emma,persuasion is a sweep; calibration.books holds a list: pass "
     "calibration.books=[emma,persuasion] (python -m quantize recipe=original calibration=austen "
     "'calibration.books=[emma,persuasion]')"),
    (["recipe=original", "calibration=austen", "calibration.books=emma,persuasion", "--cfg", "job"],
     "error: calibration.books=emma,persuasion is a sweep; calibration.books holds a list: pass "
     "calibration.books=[emma,persuasion] (python -m quantize recipe=original calibration=austen "
     "'calibration.books=[emma,persuasion]' --cfg job)"),
])
def test_a_sweep_without_m_is_one_line_adding_it(args, line, tmp_path):
    """Hydra said "Ambiguous value for argument ..." and left its own fix (add --multirun) out of the line.
    The fix is the whole command line (it dropped the other overrides), and for a key that holds a
    list, the list: -m ran one job per item, each with one book."""
    proc = run("quantize", *args, cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc) == line


def test_a_searched_choice_under_cfg_job_asks_for_one_value_not_for_m(tmp_path):
    """evaluate.search is always a sweep: "add -m" there led to "--cfg shows one job: drop -m"."""
    proc = run("evaluate.search", "n_trials=12", "trial.scheme=choice(w4a16,w8a8)", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT
    assert one_error_line(proc) == ("error: trial.scheme=choice(w4a16,w8a8) is a sweep, and --cfg/--info show one "
                                    "job: give trial.scheme one value to see that job's config")


def test_a_quoted_comma_is_one_value_not_a_sweep(tmp_path):
    proc = run("quantize", "recipe=original", "model.name='a,b'", "--cfg", "job", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "  name: a,b\n" in proc.stdout


@pytest.mark.parametrize("engines", ["vllm,vllm_server", "vllm_server,vllm"])
def test_the_key_an_added_misspelt_key_meant_is_found_whatever_the_order_of_the_sweep(engines):
    """retry_backoff_s is vllm_server's: with vllm first, the nearest was looked
    for among vllm's keys alone, and engine.args was suggested."""
    from quantize.common import config
    from quantize.common.errors import UserError
    with pytest.raises(UserError, match=r"no key engine.retry_backof_s; did you mean engine.retry_backoff_s\?"):
        config.check_added_keys("evaluate", "python -m evaluate", ["-m", f"engine={engines}",
                                                                    "++engine.retry_backof_s=2"])


@pytest.mark.parametrize("args, line", [
    (["++slo.ttft_ms=100"], "slo.ttft_ms is a key of slo=batch, interactive_cpu, interactive_gpu, not of slo=none "
                            "(pick one, or hardware=cuda, whose default is interactive_gpu)"),
    (["slo=none", "++slo.ttft_ms=100"], "slo.ttft_ms is a key of slo=batch, interactive_cpu, interactive_gpu, not of "
                                        "slo=none (pick one)"),
    (["engine=hf", "++engine.startup_timeout_s=60"], "engine.startup_timeout_s is a key of engine=vllm, vllm_server, "
                                                     "not of engine=hf (pick one)"),
])
def test_a_key_of_another_option_of_its_group_names_the_options_that_have_it(args, line):
    """On the CPU defaults (slo=none) a GPU's slo key was called nonexistent,
    with slo.name as the key meant."""
    from quantize.common import config
    from quantize.common.errors import UserError
    with pytest.raises(UserError) as e:
        config.check_added_keys("evaluate", "python -m evaluate", args)
    assert str(e.value) == line


def test_a_key_of_another_option_set_in_a_sweep_says_where_it_is(tmp_path):
    """Hydra's own error for the job lacking it (engine=hf), read from the command line."""
    proc = run("evaluate", "-m", "engine=hf,vllm_server", "engine.startup_timeout_s=5",
               f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    assert one_error_line(proc) == ("error: engine.startup_timeout_s is a key of engine=vllm, vllm_server, not of "
                                    "engine=hf (pick one, or ++engine.startup_timeout_s=<value> to set it only in "
                                    "the jobs that have it)")


@pytest.mark.parametrize("value", ["choice(vllm,openai)", "glob(*)", "glob(v*,exclude=vllm)"])
def test_a_group_swept_with_hydras_sweep_functions_is_taken(value, monkeypatch):
    """choice() and glob() were split at commas and refused as an unknown engine 'choice(vllm'."""
    from quantize.common import config
    monkeypatch.setattr(sys, "argv", ["evaluate", "-m", f"engine={value}", "++engine.retry_backoff_s=2"])
    config.prepare_argv("evaluate")   # no exit; retry_backoff_s is openai's and vllm_server's, each glob has one


@pytest.mark.parametrize("value, line", [
    ("choice(vllm,nope)", "error: unknown engine 'nope'; choose from hf, openai, vllm, vllm_server"),
    ("glob(x*)", "error: engine=glob(x*) matches no engine; choose from hf, openai, vllm, vllm_server"),
])
def test_a_group_sweep_function_naming_no_option_is_one_line(value, line, capsys):
    from quantize.common import config
    with pytest.raises(SystemExit) as e:
        config.check_group_options(["-m", f"engine={value}"])
    assert e.value.code == ExitCode.BAD_INPUT
    assert capsys.readouterr().err.strip() == line


def test_a_sweep_function_over_a_group_reaches_hydra(tmp_path):
    """Through the whole command line: each option choice() names is a job (hf lacks the key vllm_server has)."""
    proc = run("evaluate", "-m", "engine=choice(hf,vllm_server)", "engine.startup_timeout_s=5",
               f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    assert one_error_line(proc).startswith("error: engine.startup_timeout_s is a key of engine=vllm, vllm_server, "
                                           "not of engine=hf ")


@pytest.mark.parametrize("value", ["sort(w4a16_rtn,original)", "shuffle(original,w4a16_rtn)",
                                   "sort(choice(w4a16_rtn,original))"])
def test_a_group_swept_with_sort_or_shuffle_is_taken(value):
    """sort() and shuffle() were not known as sweeps: refused as an unknown recipe 'sort(w4a16_rtn'."""
    from quantize.common import config
    config.check_group_options(["-m", f"recipe={value}"])   # no exit


def test_a_glob_inside_sort_is_left_to_hydras_own_error(capsys):
    """Hydra's grammar cannot read it; it was called an unknown recipe 'shuffle(glob(w4*))'."""
    from quantize.common import config
    config.check_group_options(["-m", "recipe=shuffle(glob(w4*))"])
    assert capsys.readouterr().err == ""


def test_a_choice_of_names_and_paths_is_refused_as_a_mix(capsys):
    """It was told to use recipe=w4a16_rtn,u/my.yaml, which this very refusal then refused."""
    from quantize.common import config
    with pytest.raises(SystemExit) as e:
        config.check_group_options(["-m", "recipe=choice(w4a16_rtn,u/my.yaml)"])
    assert e.value.code == ExitCode.BAD_INPUT
    assert capsys.readouterr().err.startswith("error: recipe=w4a16_rtn,u/my.yaml mixes option names and paths, ")


def test_a_sweep_over_paths_with_escaped_parentheses_or_a_quoted_name_is_taken(tmp_path):
    """A '(' sent the value through Hydra's sweep parser, which read the path
    list as a sweep "function" and refused it; a quoted name, which Hydra reads
    as the name, was an unknown recipe "'original'"."""
    from quantize.common import config
    config.check_group_options(["-m", rf"model={tmp_path}/my\(model\),{tmp_path}/b"])   # no exit
    config.check_group_options(["recipe='original'"])
    config.check_group_options(["recipe=\"w8a8_smooth_gptq\""])


def test_an_escaped_comma_in_a_path_is_one_value_as_hydra_reads_it(tmp_path):
    """model=<dir>/a\\,b (Hydra's escape for a comma in a value) was split at
    the comma by the option check: `unknown model 'b'`, before any job."""
    (tmp_path / "a,b").mkdir()
    proc = run("evaluate", "-m", rf"model={tmp_path}/a\,b,{tmp_path}/c", f"hydra.sweep.dir={tmp_path / 'sweep'}",
               cwd=tmp_path)
    out = (proc.stdout + proc.stderr).splitlines()
    failed = [line.partition("job failed: ")[2] for line in out if "job failed: " in line]
    assert len(failed) == 2, "\n".join(out[-30:])   # one job per path, the first its folder with the comma
    assert failed[0].startswith(f"{tmp_path}/a,b is not a model checkpoint"), failed
    assert failed[1].startswith(f"model {tmp_path}/c does not exist"), failed


@pytest.mark.parametrize("arg", [r"model.name=a\,b", "model.name='a,b'", r"recipe.name=x\,y,z"])
def test_a_name_with_an_escaped_or_quoted_comma_is_one_folder_name(arg):
    """model.name=a\\,b was checked as the names 'a\\' and 'b', and refused for its backslash."""
    from quantize.common import config
    config.check_folder_names([arg])   # no error


def test_an_escaped_comma_leaves_a_folder_name_checked_whole():
    from quantize.common import config
    from quantize.common.errors import UserError
    with pytest.raises(UserError, match=r"^model.name='a,b/c' is not a folder name"):
        config.check_folder_names([r"model.name=a\,b/c"])


def test_a_path_in_a_group_without_a_path_option_is_an_unknown_name(capsys):
    """engine=choice(vllm,./my_engine.yaml) was told to sweep the names and the
    paths in two runs, though engine= takes no path."""
    from quantize.common import config
    with pytest.raises(SystemExit) as e:
        config.check_group_options(["-m", "engine=choice(vllm,./my_engine.yaml)"])
    assert e.value.code == ExitCode.BAD_INPUT
    assert capsys.readouterr().err.startswith("error: unknown engine './my_engine.yaml'; choose from ")


def test_a_misspelt_key_of_the_chosen_option_is_not_said_to_be_a_scenario_files():
    """A scenario file takes any key (over its own), so every misspelt scenario
    key was called scenario=file's, with no word of the key meant."""
    from quantize.common import config
    from quantize.common.errors import UserError
    with pytest.raises(UserError) as e:
        config.check_added_keys("evaluate", "python -m evaluate", ["scenario=interactive", "++scenario.batch_sise=4"])
    assert str(e.value).startswith("python -m evaluate has no key scenario.batch_sise; did you mean "
                                   "scenario.batch_size?")


def test_another_options_key_offers_no_group_the_entry_point_lacks():
    """The search's config has no hardware group: hardware=cuda was offered all the same."""
    from quantize.common import config
    from quantize.common.errors import UserError
    with pytest.raises(UserError) as e:
        config.check_added_keys("search", "python -m evaluate.search", ["++scenario.include=[interactive]"])
    assert str(e.value) == ("scenario.include is a key of scenario=all, cpu, none, reference, not of "
                            "scenario=interactive (pick one)")


@pytest.mark.parametrize("engine, way", [([], "hardware=cuda with engine=vllm_server"),
                                         (["engine=vllm_server"], "hardware=cuda")])
def test_a_default_load_only_a_server_engine_runs_is_offered_with_one(engine, way):
    """hardware=cuda's load runs only with a server engine: with the default
    engine=vllm the key was set on a load that never ran, without a word."""
    from quantize.common import config
    from quantize.common.errors import UserError
    with pytest.raises(UserError) as e:
        config.check_added_keys("evaluate", "python -m evaluate", [*engine, "++load.max_requests=50"])
    assert str(e.value).endswith(f"not of load=none (pick one, or {way}, whose default is sweep_gpu_with_server)")


def test_a_list_given_as_a_sweep_with_m_is_one_line_naming_the_list(tmp_path):
    """load.levels=1,2,4 with -m ran three jobs, each given one level (a number where the list goes)."""
    sweep = tmp_path / "sweep"
    proc = run("evaluate", "-m", "model=/nonexistent/x", "load=concurrency", "load.levels=1,2,4",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    assert one_error_line(proc) == ("error: load.levels=1,2,4 with -m runs one job per item, but load.levels holds a "
                                    "list: pass 'load.levels=[1,2,4]' for one job with the list (a sweep over lists: "
                                    "'load.levels=[1,2],[4]')")
    assert not sweep.exists()


def test_a_sweep_over_lists_with_an_item_left_bare_is_one_line_bracketing_it(tmp_path):
    """load.levels=[1,2],4 with -m made the sweep folder and ran a job given
    the number 4 where the list goes, refused only in that job."""
    sweep = tmp_path / "sweep"
    proc = run("evaluate", "-m", "model=/nonexistent/x", "load=concurrency", "load.levels=[1,2],4",
               f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    assert one_error_line(proc) == ("error: load.levels=[1,2],4 with -m runs one job per item, but load.levels holds "
                                    "a list and 4 is one value: pass 'load.levels=[1,2],[4]' for one job per list")
    assert list(tmp_path.iterdir()) == []


def test_every_bare_item_of_a_sweep_over_lists_is_bracketed():
    from quantize.common import config
    from quantize.common.errors import UserError
    with pytest.raises(UserError, match=r"pass 'load.levels=\[4\],\[1,2\],\[8\]' for one job per list$"):
        config.check_list_sweeps("evaluate", ["load=concurrency", "load.levels=4,[1,2],8", "-m"])


def test_a_key_taking_one_name_or_a_list_is_swept_over_both():
    """calibration.text_field takes one field name or a list: a job of each is no bare item."""
    from quantize.common import config
    config.check_list_sweeps("quantize", ["recipe=w4a16_rtn", "calibration=open_platypus",
                                          "calibration.text_field=[instruction,output],output", "-m"])   # no error


@pytest.mark.parametrize("value", ["[1,2],[4]", "choice(1,2,4)"])
def test_a_sweep_over_lists_or_a_choice_of_a_list_key_is_taken(value):
    from quantize.common import config
    config.check_list_sweeps("evaluate", ["load=concurrency", f"load.levels={value}", "load.max_requests=1,2", "-m"])


def test_a_key_taking_one_name_or_a_list_is_swept_name_by_name():
    """calibration.text_field takes one field name or a list: open_platypus's
    default is a list, and `-m calibration.text_field=instruction,output` (a
    sweep docs/sweeps.md gives a folder suffix for) was refused as a list key."""
    from quantize.common import config
    config.check_list_sweeps("quantize", ["recipe=w4a16_rtn", "calibration=open_platypus",
                                          "calibration.text_field=instruction,output", "-m"])   # no error


@pytest.mark.parametrize("config_name, args", [
    ("evaluate", ["engine=vllm_server", "load=rate", "load.rates=1,2"]),
    ("evaluate", ["lm_eval=hub", "lm_eval.tasks=gsm8k,arc_easy"]),
    ("evaluate", ["accuracy.books=emma,persuasion"]),
    ("quantize", ["recipe=w4a16_rtn", "calibration=austen", "calibration.books=emma,persuasion"]),
])
def test_a_key_taking_only_a_list_is_still_refused_as_a_sweep(config_name, args):
    from quantize.common import config
    from quantize.common.errors import UserError
    with pytest.raises(UserError, match=f"but {args[-1].partition('=')[0]} holds a list: pass"):
        config.check_list_sweeps(config_name, [*args, "-m"])


def test_a_class_field_taking_a_name_too_is_no_list():
    """`include: list | str` takes `all`: the class typing it a list too made it one."""
    from quantize.common.conf_groups import target_fields
    assert target_fields("evaluate.scenarios.ScenarioSet")["include"] is not list
    assert target_fields("evaluate.serving.profiles.Concurrency")["levels"] is list


def test_a_sweep_composes_each_job_of_its_group_choices_once(monkeypatch):
    """Each job of a group choice was composed once per other swept key (to
    look for a list key) and again (to check it composes): seconds of Hydra
    before a sweep of a few recipes started. runs, warmup_runs and seed are
    set to single values in the config: no list key, no composing for them."""
    from quantize.common import config, hydra_errors
    calls, real = [], hydra_errors.composed_or_raise
    monkeypatch.setattr(hydra_errors, "composed_or_raise",
                        lambda name, overrides: calls.append(tuple(overrides)) or real(name, overrides))
    monkeypatch.setattr(sys, "argv", ["evaluate", "-m", "recipe=original,w4a16_rtn", "engine=vllm,hf", "runs=1,2",
                                      "warmup_runs=0,1", "seed=0,1"])
    config.prepare_argv("evaluate")
    assert len(calls) == 3 == len(set(calls))   # the jobs: recipe=original engine=vllm, then w4a16_rtn, then hf


def test_a_list_field_the_yaml_leaves_out_holds_a_list():
    """The class a setting names decides where its YAML leaves the field at its default."""
    from quantize.common.conf_groups import holds_list
    from quantize.common.paths import CONF_DIR
    values = {"load": {"_target_": "evaluate.serving.profiles.Concurrency", "name": "concurrency"}}
    assert holds_list(values, "load.levels", [CONF_DIR], "evaluate")
    assert not holds_list(values, "load.max_requests", [CONF_DIR], "evaluate")


@pytest.mark.parametrize("args, line", [
    (["runz=1,2"], "error: python -m evaluate has no key runz; did you mean runs? (python -m evaluate --help lists "
                   "its keys)"),
    (["engine=hf,vllm_server", "engine.startup_timeout_s=5"],
     "error: engine.startup_timeout_s is a key of engine=vllm, vllm_server, not of engine=hf (pick one, or "
     "++engine.startup_timeout_s=<value> to set it only in the jobs that have it)"),
])
def test_a_refused_sweep_leaves_no_sweep_folder(args, line, tmp_path):
    """Hydra wrote multirun.yaml before composing the jobs: the refusal left a
    sweep folder holding only that file."""
    sweep = tmp_path / "logs" / "sweep"
    proc = run("evaluate", "-m", "model=/nonexistent/x", *args, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    assert one_error_line(proc) == line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, line", [
    (["slo=none", "++slo.ttft_m=100"], "python -m evaluate has no key slo.ttft_m; did you mean slo.ttft_ms? slo.ttft_ms "
                                       "is a key of slo=batch, interactive_cpu, interactive_gpu, not of slo=none "
                                       "(pick one)"),
    (["engine=hf", "++engine.startup_timeout=60"], "python -m evaluate has no key engine.startup_timeout; did you "
                                                   "mean engine.startup_timeout_s? engine.startup_timeout_s is a key "
                                                   "of engine=vllm, vllm_server, not of engine=hf (pick one)"),
    (["slo=none", "++slo.nme=x"], "python -m evaluate has no key slo.nme; did you mean slo.name? "
                                  "(python -m evaluate --help lists its keys)"),
])
def test_a_near_miss_of_another_options_key_names_that_key_and_its_options(args, line):
    """slo.ttft_m on slo=none was asked "did you mean slo.name?", the only slo key slo=none has."""
    from quantize.common import config
    from quantize.common.errors import UserError
    with pytest.raises(UserError) as e:
        config.check_added_keys("evaluate", "python -m evaluate", args)
    assert str(e.value) == line


@pytest.mark.parametrize("arg", ["+load.burstines=0.5", "load.burstines=0.5"])
def test_a_near_miss_of_a_class_field_the_yaml_leaves_out_says_to_add_it(arg):
    """load.burstiness is a field of the chosen load's class, left out of its
    YAML: a near miss of it was asked "did you mean load.name?"."""
    from quantize.common import hydra_errors
    line = hydra_errors.unknown_key("load.burstines", "python -m evaluate", "evaluate",
                                    ["engine=vllm_server", "load=concurrency", arg])
    assert line == ("python -m evaluate has no key load.burstines; did you mean load.burstiness? load's YAML leaves "
                    "it at its default: add it with +load.burstiness=0.5")


def test_a_near_miss_of_another_options_key_through_hydras_own_error(tmp_path):
    proc = run("evaluate", "model=/nonexistent/x", "slo=none", "slo.ttft_m=5", cwd=tmp_path)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr[-3000:]
    assert one_error_line(proc).startswith("error: python -m evaluate has no key slo.ttft_m; did you mean "
                                           "slo.ttft_ms? slo.ttft_ms is a key of slo=batch, ")


@pytest.mark.parametrize("engines", ["vllm,hf", "hf,vllm"])
def test_a_key_some_swept_options_lack_is_named_so_in_either_order(engines):
    """engine=vllm,hf said "engine holds `stall_timeout_s` as one key … set
    engine whole": the first job's engine has the key, read as one whose name
    holds a dot. The line is the same whichever option comes first."""
    from quantize.common import hydra_errors
    line = hydra_errors.unknown_key("engine.stall_timeout_s", "python -m evaluate", "evaluate",
                                    ["model=local", "model.path=/nonexistent/x", f"engine={engines}",
                                     "engine.stall_timeout_s=5"])
    assert line == ("engine.stall_timeout_s is a key of engine=openai, vllm, vllm_server, not of engine=hf (pick one, "
                    "or ++engine.stall_timeout_s=<value> to set it only in the jobs that have it)")


@pytest.mark.parametrize("key, meant", [("stall_timeout_s", "engine.stall_timeout_s"),
                                         ("base_url", "engine.base_url")])
def test_a_key_without_its_group_is_matched_to_a_later_jobs_key(key, meant):
    """-m engine=hf,vllm stall_timeout_s=5: only a later job's engine has the
    key the user meant, so that job is composed for the hint too."""
    from quantize.common import hydra_errors
    line = hydra_errors.unknown_key(key, "python -m evaluate", "evaluate",
                                    ["model=local", "model.path=/nonexistent/x", "engine=hf,vllm,openai", f"{key}=5"])
    assert f"did you mean {meant}?" in line, line


def test_a_misspelt_key_in_a_sweep_composes_no_job_the_key_cannot_differ_in(monkeypatch):
    """slo.ttft_m=5 with -m engine=<3> scenario=<11> took seven seconds to refuse:
    every job was composed for its choices, twice, and for its keys, though no
    engine or scenario changes slo. The first job, each slo option, and the
    default naming one decide."""
    import hydra

    from quantize.common import hydra_errors
    calls, real = [], hydra.compose
    monkeypatch.setattr(hydra, "compose", lambda *a, **k: calls.append(k.get("overrides")) or real(*a, **k))
    line = hydra_errors.unknown_key("slo.ttft_m", "python -m evaluate", "evaluate",
                                    ["model=local", "model.path=/nonexistent/x", "engine=vllm,hf,vllm_server",
                                     "scenario=base,cpu,interactive", "slo.ttft_m=5"])
    assert line == ("python -m evaluate has no key slo.ttft_m; did you mean slo.ttft_ms? slo.ttft_ms is a key of "
                    "slo=batch, interactive_cpu, interactive_gpu, not of slo=none (pick one, or hardware=cuda, whose "
                    "default is interactive_gpu)")
    assert len(calls) == 6   # the first job, the four slo options, hardware=cuda
