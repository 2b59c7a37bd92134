"""The config groups on disk: which `group=<name>` options exist, under conf/
and the folders a command line adds with `hydra.searchpath`. Shared by the
command-line checks (config), Hydra's errors (hydra_errors) and --help."""
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
