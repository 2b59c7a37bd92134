"""The `recipe=` options both stages accept, in one place. A recipe is an
option because its llm-compressor YAML is in `recipes/` (the option's name is
the file's stem), or because a preset `conf/recipe/<name>.yaml` points at a
recipe file and describes it. Names are free: any file stem is an option.

`available()` is the one list: the CLIs resolve `recipe=<name>` and list the
choices in their error from it, and the tests quantize every recipe in it."""
from dataclasses import dataclass
from pathlib import Path

from quantize.common.paths import CONF_DIR, RECIPES_DIR, folder_name
from quantize.common.resolvers import register_resolvers

PRESETS_DIR = CONF_DIR / "recipe"
# The preset behind `recipe=<path to yaml>`, not an option of its own.
FILE_OPTION = "file"
# The unquantized recipe: the report's baseline for every speed-up and recovery.
BASELINE = "original"


@dataclass(frozen=True)
class RecipeChoice:
    """One recipe option: its name (the artifact folder's), the recipe file
    and a one-line description for the manifest."""
    name: str
    path: str
    description: str = ""

    @classmethod
    def from_config(cls, values: dict) -> "RecipeChoice":
        """From the `recipe` group's plain values (name, path, description)."""
        return cls(name=folder_name("recipe.name", values["name"]), path=str(values["path"]),
                   description=str(values.get("description") or ""))


def available() -> list[RecipeChoice]:
    """Every `recipe=<name>` option, sorted by name: the presets, then each
    recipes/*.yaml without a preset of its name (as a preset-less option: no description)."""
    presets = sorted(PRESETS_DIR.glob("*.yaml"))
    taken = {p.stem for p in presets}
    choices = [_preset(p) for p in presets if p.stem != FILE_OPTION]
    choices += [RecipeChoice(p.stem, str(p)) for p in sorted(RECIPES_DIR.glob("*.yaml")) if p.stem not in taken]
    return sorted(choices, key=lambda c: c.name)


def find(name: str) -> RecipeChoice | None:
    """The option `recipe=<name>` selects; None when there is none."""
    return next((c for c in available() if c.name == name), None)


def has_preset(name: str) -> bool:
    """conf/recipe/ holds a file of this name: Hydra finds the option there."""
    return (PRESETS_DIR / f"{name}.yaml").is_file()


def _preset(path: Path) -> RecipeChoice:
    """A conf/recipe/ preset, its `${qb_root:}` paths resolved; named by its file."""
    from omegaconf import OmegaConf
    register_resolvers()
    values = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return RecipeChoice.from_config({**values, "name": path.stem})
