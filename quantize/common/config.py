"""Hydra plumbing shared by both stages: resolvers, the recipe options (from
recipe_choices), and the path shorthands (`model=/some/dir`, `recipe=my.yaml`, `calibration=data.jsonl`,
`scenario=my.yaml`)."""
import os
import re
import shlex
import sys
from pathlib import Path

from hydra.core.config_store import ConfigStore

from quantize.common.conf_groups import (CFG_CHOICES, HYDRA_SWITCHES, HYDRA_VALUE_FLAGS, INFO_CHOICES, PATH_GROUPS,
                                         class_takes, group_options, holds_list, is_group, one_job_per_choice,
                                         search_path_dirs, set_in_files, shown_options, sweep_values)
from quantize.common.credentials import HYDRA_ESCAPED
from quantize.common.errors import UserError
from quantize.common.hub import is_repo_id
from quantize.common.paths import CONF_DIR
from quantize.common.recipe_choices import available, has_preset
from quantize.common.resolvers import register_resolvers

def warn_old_spelling(old: str, advice: str) -> None:
    """The one deprecation line a command prints for a spelling of the
    previous release it still accepts (the report's and the capability
    table's old flags)."""
    print(f"warning: {old!r} is the old spelling and stops working in the next release; {advice}", file=sys.stderr)


# Dicts handed to another library as they are (vLLM engine args, environment,
# lm-eval model args): their keys are whatever that library takes.
PASS_THROUGH = ("engine.args.", "engine.env.", "lm_eval.model_args.")


def register() -> None:
    """Idempotent: resolvers for config files, and every recipe option without
    a conf/recipe/ preset (a YAML dropped into recipes/) as a `recipe=<stem>`
    option, so adding a recipe is dropping one YAML file."""
    register_resolvers()
    cs = ConfigStore.instance()
    for choice in available():
        if not has_preset(choice.name):
            cs.store(group="recipe", name=choice.name,
                     node={"name": choice.name, "path": choice.path, "description": choice.description})


def expand_path_shorthands(argv: list[str]) -> list[str]:
    """Rewrite `group=<existing path>` into the group's path option.

    Hydra only accepts option names for a config group; users expect to pass a
    directory or file directly, as with `vllm serve <dir>`."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in PATH_GROUPS and _looks_like_path(_unquoted(value), quoted=_unquoted(value) != value):
            out += [f"{key}={PATH_GROUPS[key]}", f"{key}.path={_path_value(key, value)}"]
        elif sep and key in PATH_GROUPS and _is_path_sweep(value):
            # `model=a/,b/`: a sweep over paths, as Hydra sweeps `model.path=a/,b/`; each item quoted or not
            paths = ",".join(_path_value(key, item) for item in _sweep_items(value))
            out += [f"{key}={PATH_GROUPS[key]}", f"{key}.path={paths}"]
        else:
            out.append(arg)
    return out


def _path_value(key: str, value: str) -> str:
    """`group.path`'s value for the path `value` as given: `model='/x/a(b)'`,
    quoted as Hydra's grammar error advises, is the path in the quotes (quoted
    again for Hydra), as the backslash-escaped `model=/x/a\\(b\\)` stays escaped."""
    inner = _unquoted(value)
    if inner == value:
        return str(_full_path(key, value))
    quote = value[0]
    return quote + str(_full_path(key, inner)).replace(quote, "\\" + quote) + quote


def _full_path(key: str, value: str):
    # a hub id (owner/name, no such local path) stays as written: quantize downloads it
    return value if key == "model" and is_repo_id(value) else Path(os.path.expanduser(value)).resolve()


def _is_path_sweep(value: str) -> bool:
    """Comma-separated, and every item a path (a sweep of option names, or of options and paths, stays Hydra's)."""
    items = _sweep_items(value)
    return len(items) > 1 and all(item and _looks_like_path(_unquoted(item), quoted=_unquoted(item) != item)
                                  for item in items)


def _sweep_items(value: str) -> list[str]:
    """The items of the comma list `value` as written: `'/x/a(b)','/y/c,d'`
    (each quoted, as Hydra's grammar asks of such paths) is two, quotes kept;
    `/x/a\\,b` (Hydra's escaped comma) is one, the escape kept."""
    items, item, quote, escaped = [], "", None, False
    for i, char in enumerate(value):
        if escaped:
            escaped = False
        elif not quote and char == "\\":
            escaped = True   # the next character is the value's own
        elif quote and char == quote and value[i - 1] != "\\":
            quote = None
        elif not quote and char in "'\"":
            quote = char
        elif not quote and char == ",":
            items, item = [*items, item], ""
            continue
        item += char
    return [*items, item]


# Hydra's functions a value may start with (its override grammar): sweeps, and sort()/shuffle() of one
SWEEP_FUNCTIONS = ("choice(", "glob(", "range(", "interval(", "sort(", "shuffle(", "tag(")


def _looks_like_path(value: str, quoted: bool = False) -> bool:
    """`quoted`: `value` was in quotes, where a comma or a '(' is the path's own."""
    if not quoted and (len(_sweep_items(value)) > 1 or value.startswith(SWEEP_FUNCTIONS)):
        return False  # a sweep expression: leave it to Hydra
    return os.sep in value or value.startswith((".", "~")) or Path(value).suffix in (
        ".yaml", ".yml", ".json", ".jsonl", ".txt")


def check_group_options(argv: list[str]) -> None:
    """An unknown `group=<name>` becomes one line naming the choices (Hydra's
    own error is a screenful); sweeps (`a,b`, `choice(a,b)`, `glob(a*)`) are
    checked name by name, and a sweep mixing names and paths is refused (see
    _refuse_names_with_paths)."""
    roots = [CONF_DIR] + search_path_dirs(argv)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key.startswith("hydra") or not is_group(key, roots):
            continue
        known = group_options(key, roots)
        quoted, value = _unquoted(value) != value, _unquoted(value)
        called = value.startswith(SWEEP_FUNCTIONS)   # not a '(' of a path (my\(model\))
        swept = _swept_names(arg, roots) if called else None
        if called and swept is None:
            continue  # Hydra's grammar cannot read it: its own error says so
        if swept == []:
            print(f"error: {arg} matches no {key}; choose from {shown_options(key, roots)}", file=sys.stderr)
            raise SystemExit(2)
        if swept and all(_looks_like_path(name) for name in swept):
            print(f"error: {arg}: {value.partition('(')[0]}() sweeps {key} names; a sweep over paths is "
                  f"{key}={','.join(swept)}", file=sys.stderr)
            raise SystemExit(2)
        written = [] if swept else [value] if quoted else _sweep_items(value)   # a quoted comma is the value's own
        items = swept or [_unquoted(item) for item in written]
        in_quotes = [quoted or _unquoted(item) != item for item in written] or [False] * len(items)
        # a path is an option only where the group has a path option (PATH_GROUPS); elsewhere a name unknown
        names = [item for item, q in zip(items, in_quotes) if key not in PATH_GROUPS or not _looks_like_path(item, q)]
        unknown = [name for name in names if name not in known and name != "null"]
        if unknown:
            print(f"error: unknown {key} {unknown[0]!r}; choose from {shown_options(key, roots)}", file=sys.stderr)
            raise SystemExit(2)
        if names and len(names) < len(items):
            _refuse_names_with_paths(key, items)


def _unquoted(value: str) -> str:
    """`'original'` as Hydra reads it: one value in matching quotes is that value."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" and value[0] not in value[1:-1]:
        return value[1:-1]
    return value


def _swept_names(arg: str, roots) -> list[str] | None:
    """The options the sweep `arg` (`engine=choice(vllm,hf)`, `engine=glob(v*)`,
    `sort(...)`, `shuffle(...)`: any Hydra's grammar reads as one) runs; None
    where it reads no sweep, or cannot read it (its own error says so)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    try:
        parsed = OverridesParser.create().parse_override(arg)
        return sweep_values(parsed, roots) if parsed.is_sweep_override() else None
    except (HydraException, TypeError, ValueError):
        return None


def _refuse_names_with_paths(key: str, items: list[str]) -> None:
    """`recipe=w4a16_rtn,u/my.yaml`: a sweep is over the group's options (names)
    or over the path option's paths; Hydra cannot take both in one list. The
    list as paths is offered only where every name has a file (recipes): a
    calibration or model preset has none, so two runs it is."""
    names = [item for item in items if not _looks_like_path(item)]
    paths = [item for item in items if _looks_like_path(item)]
    fix = f"sweep the names and the paths in two runs ({key}={','.join(names)}, then {key}={','.join(paths)})"
    as_paths = [item if _looks_like_path(item) else _option_file(key, item) for item in items]
    if all(as_paths):
        fix = f"give every {key} as a path ({key}={','.join(as_paths)}), or {fix}"
    print(f"error: {key}={','.join(items)} mixes option names and paths, which one sweep cannot take; {fix}",
          file=sys.stderr)
    raise SystemExit(2)


def _option_file(key: str, name: str) -> str | None:
    """The file behind `recipe=<name>` (relative to the working directory where
    it is under it); None for other groups' options, which are not one file."""
    from quantize.common.recipe_choices import find
    choice = find(name) if key == "recipe" else None
    if choice is None:
        return None
    path = Path(choice.path)
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def open_pass_through_keys(argv: list[str]) -> list[str]:
    """`engine.args.X=v` (and the other pass-through dicts) may name any key
    the engine accepts, not only the ones the config file lists: rewrite it to
    Hydra's add-or-override form `++engine.args.X=v`."""
    return [f"++{arg}" if arg.startswith(PASS_THROUGH) and "=" in arg else arg for arg in argv]



def hydra_flags_last(argv: list[str], command: str) -> list[str]:
    """`argv` with Hydra's flags (and their values) after the overrides:
    Hydra's parser takes one run of overrides, so `a=1 -m b=1,2` (-m where a
    sweep is thought of) ended in its 9-line usage; last, a bare --info takes
    no override for its value. A flag it lacks, one without its value, or -m
    with a flag that shows one job (--cfg, --info) is one line instead."""
    flags, overrides, rest = [], [], list(argv)
    while rest:
        arg = rest.pop(0)
        name, eq, _ = arg.partition("=")
        if not arg.startswith("-"):
            overrides.append(arg)
        elif arg in HYDRA_SWITCHES or (eq and name in (*HYDRA_VALUE_FLAGS, "--info", "-i")):
            flags.append(arg)
        elif arg in ("--cfg", "-c"):
            if not rest or rest[0] not in CFG_CHOICES:
                raise UserError(f"{arg} takes one of {', '.join(CFG_CHOICES)}: {arg} job prints the composed config")
            flags += [arg, rest.pop(0)]
        elif arg in HYDRA_VALUE_FLAGS:
            if not rest or rest[0].startswith("-"):
                raise UserError(f"{arg} takes a value ({command} --hydra-help says which)")
            flags += [arg, rest.pop(0)]
        elif arg in ("--info", "-i"):
            flags += [arg] + ([rest.pop(0)] if rest and rest[0] in INFO_CHOICES else [])
        else:
            raise UserError(f"{command} has no option {arg}; it takes key=value overrides, -m for a sweep, "
                            f"--cfg job ({command} --help lists them)")
    names = [flag.partition("=")[0] for flag in flags]
    shows = next((name for name in names if name in ("--cfg", "-c", "--info", "-i")), None)
    if shows and ("-m" in names or "--multirun" in names):   # Hydra's own error is an unexpected ValueError
        raise UserError(f"{shows} shows one job: drop -m and give one value per key")
    return overrides + flags


# Hydra's flags that choose another config than the entry's own: the keys it has are its own.
OTHER_CONFIG_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")


def prepare_argv(config_name: str) -> None:
    """The command line of the entry whose config is `config_name`, checked and
    in the form Hydra reads."""
    from quantize.common import hydra_errors
    register()
    sys.argv[1:] = hydra_flags_last(sys.argv[1:], command(config_name))
    check_group_options(sys.argv[1:])
    sys.argv[1:] = open_pass_through_keys(expand_path_shorthands(sys.argv[1:]))
    check_added_keys(config_name, command(config_name), sys.argv[1:])
    hydra_errors.check_no_value_replaces_keys(config_name, sys.argv[1:])
    jobs = SweepJobs(config_name, sys.argv[1:])
    check_list_sweeps(config_name, sys.argv[1:], jobs)
    check_folder_names(sys.argv[1:])
    check_sweep_jobs_compose(config_name, sys.argv[1:], jobs)


class SweepJobs:
    """The single jobs of a sweep's group choices (one_job_per_choice), each
    composed from its whole command line once, when a check first asks, and
    shared by the checks: composing is most of a check's time."""

    def __init__(self, config_name: str, argv: list[str]):
        self.config_name, self.argv, self._jobs, self._configs = config_name, argv, None, []

    def jobs(self) -> list[list[str]]:
        """Each job's command line, as it is composed."""
        from quantize.common.hydra_errors import kept_overrides
        if self._jobs is None:
            jobs = one_job_per_choice(self.argv, [CONF_DIR, *search_path_dirs(self.argv)])
            self._jobs = [kept_overrides(job, set()) for job in jobs]
        return self._jobs

    def configs(self):
        """Each job's config (unresolved), or the error composing it raised,
        composed as the caller gets to it: a check that stops at a job's error
        composes none after it."""
        from quantize.common.hydra_errors import composed_or_raise
        for i, job in enumerate(self.jobs()):
            if i == len(self._configs):
                try:
                    self._configs.append(composed_or_raise(self.config_name, job))
                except Exception as e:   # the check that composes the jobs raises it, the others skip the job
                    self._configs.append(e)
            yield self._configs[i]


def check_added_keys(config_name: str, command: str, overrides: list[str]) -> None:
    """`+key=v` and `++key=v` add a key the config lacks: Hydra takes a typo so
    (`+calibration.num_sample=8` beside num_samples) and the job runs on the
    default of the key meant. Refused as an unknown key, but in the dicts
    handed to a library as they are (PASS_THROUGH), Hydra's own
    settings, and a class the command line names (`engine._target_=`), whose
    keys no config file lists, nor a key the class a group names takes
    (class_takes). A key any job of a sweep has counts. Where the
    rest of the command line does not compose, or names another config
    (-cn/-cp/-cd), Hydra's own error (or that config) decides instead."""
    from quantize.common.hydra_errors import composed, dotted, override_key, unknown_key
    roots = [CONF_DIR, *search_path_dirs(overrides)]
    classes = tuple(override_key(a).removesuffix("_target_") for a in overrides if override_key(a).endswith("._target_"))
    added = [override_key(a) for a in overrides if a.startswith("+") and "=" in a]
    added = [key for key in added if not key.startswith(("hydra.", "hydra/", *PASS_THROUGH, *classes))
             and "/" not in key and not is_group(key.replace(".", "/"), roots)]
    if not added or any(a.partition("=")[0] in OTHER_CONFIG_FLAGS for a in overrides):
        return
    known, jobs = set(), one_job_per_choice(overrides, roots)
    for job in jobs:
        values = composed(config_name, [a for a in job if not a.startswith("-") and "=" in a
                                        and override_key(a) not in added])
        if values is None:
            return  # another error of the command line: Hydra names it, not the key added here
        known |= {key for key, _ in dotted(values)} | {key for key in added if class_takes(values, key)}
        if known.issuperset(added):
            return   # the other jobs cannot make a known key unknown
    for key in added:
        if key not in known:
            raise UserError(unknown_key(key, command, config_name, overrides))


def check_list_sweeps(config_name: str, argv: list[str], jobs: "SweepJobs | None" = None) -> None:
    """With -m, `load.levels=1,2,4` is Hydra's sweep: one job per level, each
    given one number where the key holds a list. Meant as the list, surely:
    refused before any job (or the sweep folder) is made, naming the list and
    the sweep over lists; so is a sweep over lists with an item left bare
    (`[1,2],4`), naming it in brackets. choice(1,2,4) is taken as the sweep
    it says it is. A key its config files set to single values only (runs=1,2)
    is no list key, and is decided without composing the jobs (`jobs`)."""
    from hydra.core.override_parser.types import ChoiceSweep

    from quantize.common.hydra_errors import override_key
    if not any(arg in ("-m", "--multirun") for arg in argv):
        return
    roots, jobs = [CONF_DIR, *search_path_dirs(argv)], jobs or SweepJobs(config_name, argv)
    for arg in argv:
        parsed = _parsed(arg)
        if (parsed is None or not isinstance(parsed.value(), ChoiceSweep) or not parsed.value().simple_form
                or all(isinstance(v, (list, dict)) for v in parsed.value().list)
                or override_key(arg).startswith("hydra") or is_group(parsed.key_or_group.replace(".", "/"), roots)):
            continue
        key = parsed.key_or_group
        found = [value for value in set_in_files(key, roots, config_name) if value is not None]
        if found and not any(isinstance(value, list) for value in found):
            continue
        if any(holds_list(values, key, roots, config_name) for values in jobs.configs() if isinstance(values, dict)):
            raise UserError(_list_sweep_fix(arg, parsed))


def _list_sweep_fix(arg: str, parsed) -> str:
    """The line refusing the sweep `arg` (`parsed`) of single values for a key that holds a list."""
    items, head, key = list(parsed.sweep_string_iterator()), parsed.get_key_element(), parsed.key_or_group
    bare = [not isinstance(value, (list, dict)) for value in parsed.value().list]
    if not all(bare):   # a sweep over lists, one item left bare: that job would get one value
        lists = f"{head}={','.join(f'[{item}]' if b else item for item, b in zip(items, bare))}"
        first = next(item for item, b in zip(items, bare) if b)
        return (f"{arg} with -m runs one job per item, but {key} holds a list and {first} is one value: pass "
                f"{shlex.quote(lists)} for one job per list")
    one = f"{head}=[{','.join(items)}]"
    lists = f"{head}=[{','.join(items[:-1])}],[{items[-1]}]"
    return (f"{arg} with -m runs one job per item, but {key} holds a list: pass {shlex.quote(one)} "
            f"for one job with the list (a sweep over lists: {shlex.quote(lists)})")


def check_sweep_jobs_compose(config_name: str, argv: list[str], jobs: "SweepJobs | None" = None) -> None:
    """Hydra writes a sweep's multirun.yaml, then composes each job: one that
    cannot (`-m runz=1,2`, a key engine=hf lacks in engine=hf,vllm_server) was
    refused with a sweep folder left holding only that file. The job of each
    group choice (`jobs`) is composed here first, and the first one's error raised
    before Hydra starts (said as Hydra's is). Where the command line less its
    sweeps does not compose either, Hydra's own first error comes before any folder."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from quantize.common.hydra_errors import composed, kept_overrides
    sweeps = [arg for arg in argv if (parsed := _parsed(arg)) is not None and parsed.is_sweep_override()]
    if (not sweeps or not any(arg in ("-m", "--multirun") for arg in argv)
            or any(arg.partition("=")[0] in OTHER_CONFIG_FLAGS for arg in argv)):
        return
    for error in (c for c in (jobs or SweepJobs(config_name, argv)).configs() if isinstance(c, Exception)):
        if not isinstance(error, (HydraException, OmegaConfBaseException)):
            continue   # not the config's: the job's own run says it
        if composed(config_name, [arg for arg in kept_overrides(argv, set()) if arg not in sweeps]) is None:
            return
        raise error


def _parsed(arg: str):
    """The override `arg` as Hydra's grammar reads it; None for a flag or what it cannot read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    if arg.startswith("-") or "=" not in arg:
        return None
    try:
        return OverridesParser.create().parse_override(arg)
    except HydraException:
        return None


def command(config_name: str) -> str:
    """`python -m <module>` of the entry whose config is `config_name` (its help's name)."""
    from quantize.common.cli_help import load
    return load(config_name)["hydra"]["help"]["app_name"]


def check_folder_names(argv: list[str]) -> None:
    """`model.name=` and `recipe.name=` are folders of Hydra's log path too, which
    Hydra makes before any job: `model.name=../../x` is refused before it."""
    from quantize.common.paths import folder_name
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key in ("model.name", "recipe.name"):
            for name in _sweep_items(value):   # a sweep's names, each
                folder_name(key, _as_read(name))


def _as_read(item: str) -> str:
    """The text of `item` (of a comma list) as Hydra reads it: the value in
    its quotes, or with its escapes (`a\\,b`, Hydra's escaped comma) undone."""
    inner = _unquoted(item)
    return inner if inner != item else re.sub(r"\\" + HYDRA_ESCAPED.pattern, r"\1", item)
