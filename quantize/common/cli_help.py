"""`--help` for every entry point, built from its config file conf/<name>.yaml:
the purpose and two examples (its `hydra.help` header and footer), its groups
with their options (its defaults list, followed into the configs it includes),
and its keys with their defaults and the comment on each key's line.

Hydra's own help composes the config first, so a required key (`recipe: ???`)
fails it, and it lists every group under conf/, other stages' included."""
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

from quantize.common.conf_groups import search_path_dirs, shown_options
from quantize.common.paths import CONF_DIR

HELP_FLAGS = ("--help", "-h")
WIDTH = 100
NAME_COLUMN = 28
REQUIRED = "???"  # Hydra's mark of a value the command line must give
# `key: value  # what it is`, at any depth; the comment needs a space before its #
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_]\w*):(?P<rest>.*)$")
DEFAULTS_LINE = re.compile(r"^ *- *(?P<group>[\w/]+) *:[^#]*(#\s*(?P<about>.*))?$")
COMMENT = re.compile(r"(^|\s)#\s?(?P<text>.*)$")


@dataclass(frozen=True)
class Setting:
    """One line of the help: a group or a key, its default and what it is."""
    name: str
    default: object
    about: str
    options: str = ""   # a group's options, or those of a key naming files of conf/<config>/<key>/


def print_help_if_asked(config_name: str, argv: list[str]) -> bool:
    """With --help or -h among `argv`, print the help of conf/<config_name>.yaml
    and return True: the entry point then exits 0, whatever else argv holds."""
    if not any(arg in HELP_FLAGS for arg in argv):
        return False
    print(help_text(config_name, [CONF_DIR, *search_path_dirs(argv)]))
    return True


def help_text(config_name: str, roots: list[Path]) -> str:
    conf = load(config_name)
    about = conf.get("hydra", {}).get("help", {})
    groups, keys = group_settings(config_name, roots), key_settings(config_name, roots)
    return "\n".join([
        f"{about['app_name']}: {about['header'].strip()}", "",
        f"usage: {usage(about['app_name'], groups)}", "",
        "groups (group=option; the default after =):", *rows(groups), "",
        "keys (key=value; the default after =):", *rows(keys), "",
        "examples:", *(f"  {line}" for line in about["footer"].strip().splitlines()), "",
        "Hydra's flags work too: --cfg job prints the composed config, --hydra-help lists the others."])


def load(config_name: str) -> dict:
    return yaml.safe_load((CONF_DIR / f"{config_name}.yaml").read_text()) or {}


def usage(app_name: str, groups: list[Setting]) -> str:
    required = [f"{g.name}=<{g.name}>" for g in groups if g.default == REQUIRED]
    return " ".join([app_name, *required, "[group=option ...] [key=value ...]"])


def group_settings(config_name: str, roots: list[Path]) -> list[Setting]:
    """The groups of the config's defaults list, and of the configs it
    includes (capabilities includes evaluate's), in their order."""
    about = defaults_comments(CONF_DIR / f"{config_name}.yaml")
    settings = []
    for entry in load(config_name).get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            settings += group_settings(entry, roots)
        elif isinstance(entry, dict):
            (group, option), = entry.items()
            if not group.startswith(("override ", "hydra/")):
                settings.append(Setting(group, option, about.get(group, ""), shown_options(group, roots)))
    return settings


def key_settings(config_name: str, roots: list[Path]) -> list[Setting]:
    """The config's own keys (nested ones dotted), each with the comment on its line."""
    about = key_comments(CONF_DIR / f"{config_name}.yaml")
    settings = []
    for name, default in leaves(load(config_name)):
        choices = sorted({p.stem for root in roots for p in (root / config_name / name).glob("*.yaml")})
        settings.append(Setting(name, default, about.get(name, ""), ", ".join(choices)))
    return settings


def leaves(values: dict, prefix: str = ""):
    for key, value in values.items():
        if not prefix and key in ("defaults", "hydra"):
            continue
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def defaults_comments(path: Path) -> dict[str, str]:
    """group -> the comment on its line of the defaults list."""
    found = {}
    for line in block_lines(path, "defaults"):
        match = DEFAULTS_LINE.match(line)
        if match and match["about"]:
            found[match["group"]] = match["about"].strip()
    return found


def key_comments(path: Path) -> dict[str, str]:
    """Dotted key -> the comment on its line (the lines above a key say why, at length)."""
    found, parents = {}, []   # parents: (indent, key) of the mappings the line sits in
    for line in path.read_text().splitlines():
        match = KEY_LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        parents = [(i, k) for i, k in parents if i < indent]
        name = ".".join([k for _, k in parents] + [match["key"]])
        parents.append((indent, match["key"]))
        comment = COMMENT.search(match["rest"])
        if comment and not name.startswith(("defaults", "hydra")):
            found[name] = comment["text"].strip()
    return found


def block_lines(path: Path, key: str) -> list[str]:
    """The lines of top-level `key:`'s block."""
    lines, inside = [], False
    for line in path.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            inside = line.startswith(f"{key}:")
        elif inside:
            lines.append(line)
    return lines


def rows(settings: list[Setting]) -> list[str]:
    """name=default, then what it is in a column (on the next line where the
    name is too long); the options below, wrapped."""
    out = []
    for setting in settings:
        left = f"  {setting.name}" + (" (required)" if setting.default == REQUIRED else f"={shown(setting.default)}")
        if len(left) < NAME_COLUMN - 1:
            out.append(f"{left:<{NAME_COLUMN}}{setting.about}".rstrip())
        else:
            out += [left, f"{'':<{NAME_COLUMN}}{setting.about}".rstrip()]
        if setting.options:
            out += textwrap.wrap(f"one of: {setting.options}", WIDTH, initial_indent=" " * NAME_COLUMN,
                                 subsequent_indent=" " * (NAME_COLUMN + 2), break_on_hyphens=False)
    return out


def shown(value) -> str:
    """A default as it would be typed on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(shown(v) for v in value) + "]"
    return str(value)
