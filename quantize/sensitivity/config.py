"""The sensitivity stage's settings as typed objects: the entry point
converts the composed Hydra config once into a SensitivityConfig."""
from dataclasses import dataclass

from quantize.common import hf_load
from quantize.common.errors import UserError
from quantize.common.paths import check_writable_dir, folder_setting
from quantize.common.recipe_choices import RecipeChoice
from quantize.common.settings import flag, integer, names
from quantize.config import ModelChoice


@dataclass(frozen=True)
class TextConfig:
    """The held-out text: `source` = austen (the `books`) or a local .txt file."""
    source: str
    books: list[str]
    num_windows: int
    window_len: int

    @classmethod
    def from_config(cls, values: dict) -> "TextConfig":
        text = cls(source=str(values["source"]), books=names("text.books", values.get("books"), example="persuasion"),
                   num_windows=integer("text.num_windows", values["num_windows"], 4),
                   window_len=integer("text.window_len", values["window_len"], 128))
        if text.num_windows < 1 or text.window_len < 2:
            raise UserError(f"text.num_windows={text.num_windows}, text.window_len={text.window_len}: "
                            "set at least 1 window of at least 2 tokens")
        if text.source == "austen" and not text.books:
            raise UserError("text.books is empty; name at least one held-out book, e.g. text.books=[persuasion]")
        return text


@dataclass(frozen=True)
class SensitivityConfig:
    """conf/sensitivity.yaml with its model and recipe groups."""
    model: ModelChoice
    recipe: RecipeChoice
    text: TextConfig
    results_dir: str
    force: bool = False

    @classmethod
    def from_config(cls, values: dict) -> "SensitivityConfig":
        """From the composed config as plain, resolved values (extensions.plain)."""
        check_writable_dir(folder_setting("results_dir", values["results_dir"]), "results_dir=<a writable directory>")
        hf_load.check_setting(values.get("trust_remote_code"))
        return cls(model=ModelChoice.from_config(values["model"]),
                   recipe=RecipeChoice.from_config(values["recipe"]),
                   text=TextConfig.from_config(values["text"]), results_dir=str(values["results_dir"]),
                   force=flag("force", values.get("force", False)))
