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


def holds_list(values: dict, key: str, roots, config_name: str) -> bool:
    """Whether the setting `key` of the composed config `values` takes nothing
    but a list (load.levels), so that one value given is an item of it: the
    class its parent names (`_target_`) types it a list or tuple (and not str
    too); where no class types it, every file that sets it (its group's
    options, else the entry's config `config_name`) sets a list. A key taking
    one name or a list (calibration.text_field) is no list key because a preset
    sets a list."""
    node, parts = values, key.split(".")
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    kind = target_fields(node.get("_target_")).get(parts[-1]) if isinstance(node, dict) else None
    if kind is not None:
        return kind is list
    found = set_in_files(key, roots, config_name)
    found = [value for value in found if value is not None]   # null: unset, whatever the key takes
    return bool(found) and all(isinstance(value, list) for value in found)


_UNSET = object()   # a key a file does not set (None is a value it sets)


def set_in_files(key: str, roots, config_name: str) -> list:
    """The values the config files set `key` to: each option of the group it
    starts with, or the entry's own config `config_name` for a key of no group."""
    import yaml
    group, dot, inner = key.partition(".")
    if dot and is_group(group, roots):
        paths = [p for root in roots for p in sorted((root / group).glob("*.yaml"))]
    else:
        paths, inner = [root / f"{config_name}.yaml" for root in roots], key
    found = []
    for path in paths:
        try:
            node = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        for part in inner.split("."):
            node = node.get(part, _UNSET) if isinstance(node, dict) else _UNSET
        if node is not _UNSET:
            found.append(node)
    return found


def target_fields(target) -> dict:
    """{field name: its type, dict for any mapping, list for a list or tuple (or None), not str too}
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
    """dict for a mapping type; list for a list or tuple type that takes no str
    too (`list[int] | None`, not `list | str`); else object."""
    import types
    import typing
    if hint is dict or typing.get_origin(hint) is dict:
        return dict
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    sequence = any(a in (list, tuple) or typing.get_origin(a) in (list, tuple) for a in args)
    return list if sequence and str not in args else object


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
