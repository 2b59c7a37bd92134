"""The config groups on disk: which `group=<name>` options exist, under conf/
and the folders a command line adds with `hydra.searchpath`; the single jobs
a sweep's group choices make, and the keys a chosen option's class takes.
Shared by the command-line checks (config), Hydra's errors (hydra_errors) and --help."""
from pathlib import Path

from quantize.common.recipe_choices import available

# Config groups whose value may also be a filesystem path; the shorthand maps
# `group=<path>` to `group=<fallback option> group.path=<path>`.
PATH_GROUPS = {"model": "local", "recipe": "file", "calibration": "file", "scenario": "file"}


def is_group(group: str, roots: list[Path]) -> bool:
    """Whether `group` (Hydra's spelling: `engine`, `report/layout`) is a
    config group: a folder under one of the config roots."""
    return any((root / group).is_dir() for root in roots)


def group_options(group: str, roots: list[Path]) -> set[str]:
    """Every `group=<name>` option: the YAML files of <root>/<group>/ for each
    config root (conf/ and the search path's), and for recipe every recipe file."""
    names = {p.stem for root in roots for p in (root / group).glob("*.yaml")}
    if group == "recipe":
        names |= {choice.name for choice in available()}
    return names


def shown_options(group: str, roots: list[Path]) -> str:
    """The options as the user types them, for help and errors: the path
    shorthand's own option (`file`, `local`) is reached by giving a path."""
    shown = ", ".join(sorted(group_options(group, roots) - {PATH_GROUPS.get(group)}))
    return shown + (" (or a path)" if group in PATH_GROUPS else "")


def search_path_dirs(argv: list[str]) -> list[Path]:
    """Folders added with `hydra.searchpath=[file://...]`: their groups count too."""
    dirs = []
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "hydra.searchpath":
            entries = value.strip("[]").split(",")
            dirs += [Path(e.strip().strip("'\"").removeprefix("file://")) for e in entries
                     if e.strip().strip("'\"").startswith("file://")]
    return dirs


# Hydra's command-line flags (its hydra/_internal/utils.py parser): switches,
# flags that take the next argument (--cfg: one of its choices), --info with an optional one.
HYDRA_SWITCHES = ("--help", "-h", "--hydra-help", "--version", "--resolve", "--run", "-r", "--multirun", "-m",
                  "--shell-completion", "-sc")
HYDRA_VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun")
# The values Hydra's --cfg and --info take (the flags that show one job)
CFG_CHOICES = ("job", "hydra", "all")
INFO_CHOICES = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def class_takes(values: dict, key: str, gathered: bool = True) -> bool:
    """Whether the class a setting on the path of `key` names (`_target_`)
    takes it: one of its fields, which its YAML may leave at the default
    (load.only_with_server), or (`gathered`) any key where it gathers the ones
    it does not name in a mapping field its YAML leaves out (ScenarioFile.overrides)."""
    node, parts = values, key.split(".")
    for i, part in enumerate(parts[:-1]):
        node = node.get(part) if isinstance(node, dict) else None
        fields = target_fields(node.get("_target_")) if isinstance(node, dict) else {}
        gathers = gathered and any(kind is dict and name not in node for name, kind in fields.items())
        if parts[i + 1] in fields or gathers:
            return True
    return False


def holds_list(values: dict, key: str) -> bool:
    """Whether the setting `key` of the composed config `values` holds a list:
    its value, or the field of the class its parent names (`_target_`), where
    the YAML leaves it at the default."""
    node, parts = values, key.split(".")
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        return False
    return isinstance(node.get(parts[-1]), list) or target_fields(node.get("_target_")).get(parts[-1]) is list


def target_fields(target) -> dict:
    """{field name: its type, dict for any mapping, list for a list (or None)}
    of the dataclass `target` (module.Class) names; {} where it names none that imports."""
    import dataclasses
    import importlib
    import typing
    module, _, name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        hints = typing.get_type_hints(cls)
    except Exception:   # no such class here: the job's own check names it
        return {}
    if not dataclasses.is_dataclass(cls):
        return {}
    return {f.name: _kind(hints.get(f.name)) for f in dataclasses.fields(cls) if f.init}


def _kind(hint) -> type:
    """dict for a mapping type, list for a list type (`list[int] | None` too), else object."""
    import types
    import typing
    if hint is dict or typing.get_origin(hint) is dict:
        return dict
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return list if any(a is list or typing.get_origin(a) is list for a in args) else object


def one_job_per_choice(overrides: list[str], roots) -> list[list[str]]:
    """Command lines of single jobs covering every option a sweep gives a
    group (`engine=vllm,hf`: one with each); other sweeps at their first value.
    The groups chosen decide which keys a job's config has."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    firsts, choices = [], []   # (index, values) of each group sweep
    for arg in overrides:
        parsed = None
        try:
            parsed = None if arg.startswith("-") else OverridesParser.create().parse_override(arg)
            values = sweep_values(parsed, roots) if parsed and parsed.is_sweep_override() else []
        except (HydraException, TypeError, ValueError):   # unreadable: Hydra says so; interval(): no values
            values = []
        if parsed and parsed.is_sweep_override() and not values:
            continue   # interval(): a sweeper's range of a key the config has, no value to compose with
        if not values:
            firsts.append(arg)
            continue
        firsts.append(f"{parsed.get_key_element()}={values[0]}")
        if is_group(parsed.key_or_group.replace(".", "/"), roots):
            choices.append((len(firsts) - 1, [f"{parsed.get_key_element()}={v}" for v in values[1:]]))
    return [firsts] + [[*firsts[:i], value, *firsts[i + 1:]] for i, values in choices for value in values]


def sweep_values(parsed, roots) -> list[str]:
    """The values the parsed sweep override `parsed` runs: a group's glob()
    is its options that match."""
    from hydra.core.override_parser.types import Glob
    group = parsed.key_or_group.replace(".", "/")
    if isinstance(parsed.value(), Glob) and is_group(group, roots):
        return parsed.value().filter(sorted(group_options(group, roots)))
    return list(parsed.sweep_string_iterator())
