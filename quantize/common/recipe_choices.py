"""The `recipe=` options both stages accept, in one place: a recipe is a
`recipe=<name>` choice because its llm-compressor YAML is in `recipes/` (the
name is the file's stem) or because `conf/recipe/<name>.yaml` points at a
recipe file and describes it. The quantize CLI's choices, its error listing
them and the tests' list of shipped recipes all come from `available()`."""
from dataclasses import dataclass


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
        return cls(name=str(values["name"]), path=str(values["path"]),
                   description=str(values.get("description") or ""))
