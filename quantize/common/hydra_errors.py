"""Hydra's own errors as the one line every other bad input gets: a key the
config lacks (with the nearest one it has, or the options of its group that
have it), an argument Hydra's override grammar cannot read (an unquoted path
with a space), a required group not given. Hydra says these in several lines and a HYDRA_FULL_ERROR hint. And
one Hydra takes without a word: one value for a setting that holds keys."""
import re
import shlex

from quantize.common.errors import UserError, nearest

# "Could not override 'out_dir'." (key=value) and "Could not delete from config. 'out_dir' ..." (~key)
UNKNOWN_KEY = re.compile(r"Could not (?:override|delete from config\.) '([^']+)'")
MISSING_GROUP = re.compile(r"You must specify '([^']+)'")
# a typed node (the sweeper's seed: int) read through an interpolation of a setting (${seed})
UNCONVERTED = re.compile(r"interpolation '\$\{([\w.]+)\}': Value '(.*?)' of type '\w+' could not be converted to (\w+)")
KINDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false"}
# a sweep (`recipe=a,b`, `seed=range(0,3)`) without -m; a quoted comma is one value, which Hydra takes
SWEEP_WITHOUT_M = re.compile(r"^(?:Ambiguous value for argument '(.*)'|Sweep parameters '(.*)' requires --multirun)$",
                             re.M)


def as_user_error(e: BaseException, module: str, config_name: str, overrides: list[str]) -> UserError | None:
    """The one line for Hydra's error `e` raised composing `config_name` from
    `overrides` (the command line as Hydra got it); None when `e` is not Hydra's."""
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException
    if not isinstance(e, (HydraException, OmegaConfBaseException)):
        return None
    text, command = str(e), f"python -m {module}"
    unknown = UNKNOWN_KEY.search(text)
    if unknown:
        return UserError(unknown_key(unknown.group(1), command, config_name, overrides))
    unconverted = UNCONVERTED.search(text)
    if unconverted:
        key, value, kind = unconverted.groups()
        return UserError(f"{key}={value}: pass {KINDS.get(kind, kind.lower())} for {key}")
    sweep = SWEEP_WITHOUT_M.search(text)
    if sweep:
        return UserError(sweep_without_m(sweep.group(1) or sweep.group(2), command, config_name, overrides))
    group = MISSING_GROUP.search(text)
    if group:
        return UserError(missing_group(group.group(1), command, overrides))
    unreadable = next((arg for arg in overrides if override_error(arg)), None)
    if isinstance(e, OverrideParseException) and unreadable:
        return UserError(override_error(unreadable))
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
    return UserError(f"{first} ({command} --help lists its groups and keys)")


def unknown_key(key: str, command: str, config_name: str, overrides: list[str]) -> str:
    """The line for `key`, which the config composed from `overrides` lacks; in
    a sweep, its first job's config decides, and the nearest key is of any job's.
    Each command line it composes is composed once (a sweep's many, a tenth of a second each)."""
    global _memo
    _memo = {}
    try:
        return _unknown_key(key, command, config_name, overrides)
    finally:
        _memo = None


def _unknown_key(key: str, command: str, config_name: str, overrides: list[str]) -> str:
    from quantize.common.conf_groups import search_path_dirs
    from quantize.common.conf_groups import one_job_per_choice
    from quantize.common.paths import CONF_DIR
    roots = [CONF_DIR, *search_path_dirs(overrides)]
    jobs = one_job_per_choice(overrides, roots)
    values = config_values(config_name, jobs[0], {key})
    parent, _, name = key.rpartition(".")
    given = next((a.partition("=")[2] for a in overrides if override_key(a) == key), None)
    if parent in values and values[parent] is None and given:
        # a mapping that is empty (null) by default, as cost.per_gpu: Hydra adds no key to it, but takes it
        # whole (a null scalar reads the same here; its own check then names the value it takes)
        return (f"{command} has no key {key}: {parent} is empty by default, so set it whole: "
                f"{parent}={{{name}:{given}}} (several, quoted against the shell's brace expansion: "
                f"'{parent}={{a:1,b:2}}')")
    if parent in values and not isinstance(values[parent], (dict, type(None))):
        return f"{command} has no key {key}: {parent} takes one value, not keys ({parent}=<value>)"
    parts = key.split(".")
    # only a name with a dot of its own: a plain nested key job 0 has is one another job lacks (engine=vllm,hf)
    splits = [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(1, len(parts) - 1)]
    holder, inner = next(((h, n) for h, n in splits if isinstance(values.get(h), dict) and n in values[h]), (None, None))
    if holder:   # a key whose own name holds a dot (search.params' `trial.scheme`): Hydra reads it as nesting
        fix = f"pass {inner}=<value>" if inner in values else f"change it in its YAML, or set {holder} whole"
        return f"{command} has no key {key}: {holder} holds `{inner}` as one key, which an override cannot reach; {fix}"
    elsewhere = other_options_key(key, config_name, jobs)
    if elsewhere:
        return elsewhere
    keys = dict.fromkeys(values)
    # a key without its group's prefix (stall_timeout_s for engine.stall_timeout_s) may match any job's key
    prefix = key.partition(".")[0]
    prefixed = any(k == prefix or k.startswith(f"{prefix}.") for k in values)
    for job in (job for job in jobs[1:] if not prefixed or may_differ(job, jobs[0], prefix, roots)):
        keys |= dict.fromkeys(config_values(config_name, job, {key}))
    close = nearest(key, [*keys, *options_keys(key, jobs[0])])
    if close and close not in keys:   # a key of another option of its group (slo.ttft_m on slo=none: slo.ttft_ms)
        elsewhere = other_options_key(close, config_name, [[a for a in job if override_key(a) != key] for job in jobs])
        if elsewhere:
            return f"{command} has no key {key}; did you mean {close}? {elsewhere}"
        if chosen_class_takes(config_name, jobs[0], key, close):   # load.burstiness, which the YAML leaves out
            return (f"{command} has no key {key}; did you mean {close}? {close.rpartition('.')[0]}'s YAML leaves it "
                    f"at its default: add it with +{close}={given if given is not None else '<value>'}")
        close = nearest(key, list(keys))
    hint = f"; did you mean {close}?" if close else ""
    return f"{command} has no key {key}{hint} ({command} --help lists its keys)"


def chosen_class_takes(config_name: str, overrides: list[str], key: str, close: str) -> bool:
    """Whether the class the config composed from `overrides` (less `key`)
    names for the setting `close` is on takes it as a field of its own."""
    from quantize.common.conf_groups import class_takes
    values = composed(config_name, kept_overrides(overrides, {key}))
    return values is not None and class_takes(values, close, gathered=False)


def other_options_key(key: str, config_name: str, jobs: list[list[str]]) -> str | None:
    """`slo.ttft_ms is a key of slo=batch, interactive_gpu, not of slo=none
    (pick one, or hardware=cuda, whose default is interactive_gpu)`: `key`
    belongs to other options of the config group it starts with than those the
    `jobs` chose (a GPU key on a CPU host's defaults); None where none has it."""
    from quantize.common.conf_groups import group_options, is_group, search_path_dirs
    from quantize.common.paths import CONF_DIR
    group, dot, _ = key.partition(".")
    roots = [CONF_DIR, *search_path_dirs(jobs[0])]
    if not dot or not is_group(group, roots):
        return None
    rest = [a for a in jobs[0] if override_key(a) not in (key, group)]
    having = [name for name in sorted(group_options(group, roots)) if option_has(config_name, rest, group, name, key)]
    if not having:
        return None
    first = job_choices(config_name, jobs[0], {key})   # a job choosing as the first one does is not composed
    chosen = [job_choices(config_name, job, {key}) if may_differ(job, jobs[0], group, roots) else first
              for job in jobs]
    lacking = sorted({c[group] for c in chosen if c.get(group) and c[group] not in having})
    if not lacking:
        return None
    # another group's option that picks one by default, where the command line picks none (theirs wins)
    named = any(override_key(a) == group for a in jobs[0])
    ways = ["pick one", *(way for other, name in defaults_choosing(group, having, roots)
                          if not named and not any(other == f"{g}={c[g]}" for c in chosen for g in c)
                          for way in [default_way(config_name, rest, group, other, name)] if way)]
    if any(c.get(group) in having for c in chosen):   # a sweep: ++ sets it where there is one
        ways.append(f"++{key}=<value> to set it only in the jobs that have it")
    return (f"{key} is a key of {group}={', '.join(having)}, not of {group}={', '.join(lacking)} "
            f"({', or '.join(ways)})")


def options_keys(key: str, overrides: list[str]) -> set[str]:
    """The keys the options of the config group `key` starts with set in
    their files (slo.ttft_ms of slo=batch), and the fields of the class each
    names: what a near miss of another option's key may have meant. Read, not
    composed (other_options_key then says which options have the one meant)."""
    import yaml

    from quantize.common.conf_groups import is_group, search_path_dirs, target_fields
    from quantize.common.paths import CONF_DIR
    group, dot, _ = key.partition(".")
    roots = [CONF_DIR, *search_path_dirs(overrides)]
    if not dot or not is_group(group, roots):
        return set()
    found = set()
    for path in (p for root in roots for p in (root / group).glob("*.yaml")):
        try:
            option = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(option, dict):
            option.pop("defaults", None)
            found |= {f"{group}.{name}" for name, _ in dotted(option)}
            found |= {f"{group}.{name}" for name in target_fields(option.get("_target_"))}
    return found


def option_has(config_name: str, overrides: list[str], group: str, name: str, key: str) -> bool:
    """Whether the config with `group=name` has `key`, in its files or as a
    named field of the class a setting on its path names (not as any key a
    class gathers, as a scenario file does: every typo would be the file's)."""
    from quantize.common.conf_groups import class_takes
    values = composed(config_name, [*kept_overrides(overrides, {key}), f"{group}={name}"])
    return values is not None and (key in dict(dotted(values)) or class_takes(values, key, gathered=False))


def default_way(config_name: str, overrides: list[str], group: str, other: str, name: str) -> str | None:
    """`hardware=cuda, whose default is <name>`; None where `other` does not
    compose with `overrides` (a group this entry point's config lacks). A
    default only a server engine runs (only_with_server) says so: with an
    in-process engine no such load runs, and its key would do nothing."""
    values = composed(config_name, [*kept_overrides(overrides, set()), other])
    if values is None:
        return None
    option = values.get(group)
    server = isinstance(option, dict) and option.get("only_with_server") and not serves_http(values.get("engine"))
    return f"{other}{' with engine=vllm_server' if server else ''}, whose default is {name}"


def serves_http(engine) -> bool:
    """Whether the engine setting `engine` (its `_target_` class) serves over HTTP."""
    import importlib
    module, _, name = str(engine.get("_target_") if isinstance(engine, dict) else "").rpartition(".")
    try:
        return bool(getattr(getattr(importlib.import_module(module), name), "serves_http", False))
    except Exception:   # no such class here: the job's own check names it
        return False


def defaults_choosing(group: str, names: list[str], roots) -> list[tuple[str, str]]:
    """(`other=option`, name) for each option of another group whose defaults
    list picks one of `names` for `group` (hardware=cuda: slo interactive_gpu),
    whichever entry point's config has that group (default_way checks it)."""
    import yaml
    found = []
    for path in sorted(p for root in roots for p in root.glob("*/*.yaml")):
        try:
            defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        for entry in (e for e in defaults if isinstance(e, dict)):
            found += [(f"{path.parent.name}={path.stem}", value) for target, value in entry.items()
                      if target.removeprefix("override").strip().strip("/") == group and value in names]
    return found


def may_differ(job: list[str], first: list[str], prefix: str, roots) -> bool:
    """Whether the sweep's single job `job` (one_job_per_choice: the first job
    `first` with another option of one group) may have other keys or choices
    under `prefix` (a key's first part) than `first`: the group it changes is
    `prefix` (or near it), or its options choose other groups' options or set
    keys anywhere (`# @package _global_`, as hardware=cuda)."""
    group = next((override_key(a) for a, b in zip(job, first) if a != b), None)
    if group is None:
        return False
    if group.partition(".")[0] == prefix or nearest(prefix, [group.partition(".")[0]]):
        return True
    for path in (p for root in roots for p in (root / group.replace(".", "/")).glob("*.yaml")):
        try:
            text = path.read_text()
        except OSError:
            return True
        if "@package _global_" in text or re.search(r"^defaults:", text, re.M):
            return True
    return False


def job_choices(config_name: str, overrides: list[str], bad_keys: set[str]) -> dict:
    """{group: option} of the config composed from `overrides` less those
    naming `bad_keys`; {} when it cannot be composed."""
    try:
        return _composition(config_name, kept_overrides(overrides, bad_keys))[1]
    except Exception:
        return {}


def sweep_without_m(arg: str, command: str, config_name: str, overrides: list[str]) -> str:
    """The fix for the sweep `arg` given without -m, as the whole command line
    `overrides`: a list for a key that holds one (load.levels=1,2,4 with -m
    ran one job per level, each given one number), else -m."""
    head, _, value = arg.partition("=")
    key = override_key(arg)
    if "(" not in value and isinstance(config_values(config_name, overrides, {key}).get(key), list):
        fix = f"{head}=[{value}]"
        line = " ".join(shlex.quote(fix if a == arg else a) for a in overrides)
        return f"{arg} is a sweep; {key} holds a list: pass {fix} ({command} {line})"
    if one_job_flags_off(overrides) != overrides:  # -m would clash with them (and a search is always a sweep)
        return f"{arg} is a sweep, and --cfg/--info show one job: give {key} one value to see that job's config"
    return f"{arg} is a sweep: add -m ({command} -m {' '.join(shlex.quote(a) for a in one_job_flags_off(overrides))})"


def one_job_flags_off(argv: list[str]) -> list[str]:
    """`argv` without --cfg and --info (and their values), which show one job, not a sweep."""
    from quantize.common.conf_groups import CFG_CHOICES, INFO_CHOICES
    kept, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        if arg in ("--cfg", "-c", "--info", "-i"):
            if rest and rest[0] in (CFG_CHOICES if arg in ("--cfg", "-c") else INFO_CHOICES):
                rest.pop(0)
        elif not arg.startswith(("--cfg=", "-c=", "--info=", "-i=")):
            kept.append(arg)
    return kept


def override_key(arg: str) -> str:
    """The dotted key an override names: a.b of `a.b=1`, `+a.b=1` and `~a.b`."""
    return arg.lstrip("+~").partition("=")[0]


def missing_group(group: str, command: str, overrides: list[str]) -> str:
    from quantize.common.conf_groups import search_path_dirs, shown_options
    from quantize.common.paths import CONF_DIR
    options = shown_options(group, [CONF_DIR, *search_path_dirs(overrides)])
    return f"{command} needs {group}=<{group}>; choose from {options}"


def override_error(arg: str) -> str | None:
    """Why Hydra's grammar cannot read the argument `arg`, with the fix; None when it can."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    if arg.startswith("-"):
        return None  # a flag
    try:
        OverridesParser.create().parse_override(arg)
        return None
    except HydraException as e:
        first = str(e).splitlines()[0]
    if "=" not in arg:
        return (f"cannot read the argument {arg!r}: it is not key=value; a value with a space must be quoted "
                "as one argument, e.g. model='/path/with a space'")
    return (f"cannot read {arg!r}: {first} (Hydra's override grammar: quote a value with special characters, "
            "e.g. title='a [b]')")


def check_no_value_replaces_keys(config_name: str, overrides: list[str]) -> None:
    """`limits=foo`, `cost=nope`, `sanity.floors=foo`: Hydra lets one value
    replace a setting that holds keys, and the job then failed deep in its
    work (`accuracy.lastword=foo` after every speed run) with an unexpected
    AttributeError. Refused here in one line, before any work."""
    given = dict(_scalar_values(overrides))
    if not given:
        return
    values = config_values(config_name, overrides, set(given))
    for key, value in given.items():
        if isinstance(values.get(key), dict):
            keys = sorted(values[key])
            held = f" ({', '.join(keys)})" if keys else ""
            raise UserError(f"{key}={value}: {key} holds keys{held}, not one value; "
                            f"set one as {key}.{keys[0] if keys else '<name>'}=<value>")


def _scalar_values(overrides: list[str]):
    """(key, value) of each `key=value` that sets a plain value (not a list,
    mapping, null or sweep) on a key that is not a config group."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    from quantize.common.conf_groups import is_group, search_path_dirs
    from quantize.common.paths import CONF_DIR
    roots = [CONF_DIR, *search_path_dirs(overrides)]
    parser = OverridesParser.create()
    for arg in overrides:
        if arg.startswith("-") or "=" not in arg or override_key(arg).startswith("hydra"):
            continue
        try:
            parsed = parser.parse_override(arg)
        except HydraException:
            continue  # Hydra's own error says it
        key = parsed.key_or_group
        # a nested group is a folder of folders: hydra.launcher is hydra/launcher
        group = is_group(key.replace(".", "/"), roots)
        if (parsed.type == OverrideType.CHANGE and not parsed.is_sweep_override() and not group
                and isinstance(parsed.value(), (str, int, float, bool))):
            yield key, parsed.value()


def config_values(config_name: str, overrides: list[str], bad_keys: set[str]) -> dict:
    """Every dotted key of the config, with its value, as composed from
    `overrides` less those naming `bad_keys` (the groups chosen decide the
    keys); {} when it cannot be composed."""
    kept = kept_overrides(overrides, bad_keys)
    for attempt in (kept, [a for a in kept if a.startswith("hydra.searchpath")]):
        values = composed(config_name, attempt)
        if values is not None:  # else another error of the command line: try the defaults
            return dict(dotted(values))
    return {}


def kept_overrides(overrides: list[str], bad_keys: set[str]) -> list[str]:
    """The overrides of the command line `overrides` that compose: none naming
    `bad_keys`, no flag, none Hydra's grammar cannot read."""
    return [a for a in overrides if not a.startswith("-") and "=" in a
            and override_key(a) not in bad_keys and not override_error(a)]


def composed(config_name: str, overrides: list[str]) -> dict | None:
    """The config (unresolved) Hydra composes from the overrides `overrides`;
    None when it cannot."""
    try:
        return _composition(config_name, overrides)[0] if _memo is not None else composed_or_raise(config_name,
                                                                                                     overrides)
    except Exception:
        return None


# While unknown_key makes its line: (config, {group: option}) or the error, by the command line composed
_memo: dict | None = None


def _composition(config_name: str, overrides: list[str]) -> tuple[dict, dict]:
    """(the config, unresolved, and its {group: option}) composed from `overrides`, once while `_memo` is kept."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from quantize.common.paths import CONF_DIR
    memo_key = (config_name, tuple(overrides))
    if _memo is not None and memo_key in _memo:
        if isinstance(_memo[memo_key], Exception):
            raise _memo[memo_key]
        return _memo[memo_key]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
            choices = {group: choice for group, choice in cfg.hydra.runtime.choices.items() if "/" not in group}
            values = OmegaConf.to_container(cfg, resolve=False)
            values.pop("hydra", None)
    except Exception as e:
        if _memo is not None:
            _memo[memo_key] = e
        raise
    if _memo is not None:
        _memo[memo_key] = (values, choices)
    return values, choices


def composed_or_raise(config_name: str, overrides: list[str]) -> dict:
    """composed(), raising the error of a config that does not compose."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from quantize.common.paths import CONF_DIR
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name, overrides=overrides), resolve=False)


def dotted(values: dict, prefix: str = ""):
    """(dotted key, value) of every key in `values`, nested ones too."""
    for key, value in values.items():
        if key.startswith("_"):
            continue  # _target_ and the like: set by the config files, never on the command line
        yield f"{prefix}{key}", value
        if isinstance(value, dict):
            yield from dotted(value, f"{prefix}{key}.")
