"""The proposer's settings as typed objects (conf/propose.yaml says what each does)."""
from dataclasses import dataclass

from quantize.common.errors import UserError
from quantize.common.paths import folder_setting, resolve
from quantize.common.recipe_choices import RecipeChoice
from quantize.common.settings import flag, is_integer, is_number, shown
from quantize.config import ModelChoice

TARGETS = ("max_size_mb", "max_kl", "kept_dense")
EXAMPLES = {"max_size_mb": "120", "max_kl": "0.05", "kept_dense": "12"}   # one value each takes, for error lines
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


@dataclass(frozen=True)
class Target:
    """What k is chosen for: a size (MB), a KL (nats per token), or k itself."""
    kind: str                 # one of TARGETS
    value: float

    @property
    def text(self) -> str:
        unit = {"max_size_mb": " MB", "max_kl": " nats per token"}.get(self.kind, "")
        return f"{self.kind}={self.value:g}{unit}"

    @classmethod
    def from_config(cls, values: dict) -> "Target":
        given = {k: values.get(k) for k in TARGETS if values.get(k) is not None}
        if len(given) != 1:
            said = f"got {', '.join(given)}" if given else "got none"
            raise UserError(f"give exactly one target: max_size_mb=<MB>, max_kl=<nats> or kept_dense=<k> ({said})")
        kind, value = next(iter(given.items()))
        if not is_number(value):
            raise UserError(f"{kind}={value!r} is not a number; e.g. {kind}={EXAMPLES[kind]}")
        if kind == "kept_dense" and value != int(value):
            raise UserError(f"kept_dense={shown(value)} is not a whole number of groups; e.g. kept_dense={EXAMPLES['kept_dense']}")
        if value < 0 or (kind == "max_size_mb" and value == 0):
            raise UserError(f"{kind}={shown(value)} must be {'positive' if kind == 'max_size_mb' else '0 or more'}")
        return cls(kind=kind, value=int(value) if kind == "kept_dense" else float(value))


@dataclass(frozen=True)
class ProposeConfig:
    model: ModelChoice
    recipe: RecipeChoice
    target: Target
    sensitivity: str = "auto"     # "auto" or a path to a sensitivity file (or its folder)
    name: str | None = None
    force: bool = False
    results_dir: str = "results"
    artifacts_dir: str = "artifacts"
    recipes_dir: str = "recipes"

    @classmethod
    def from_config(cls, values: dict) -> "ProposeConfig":
        name = values.get("name")
        typed = isinstance(name, str) or is_integer(name)    # name=true is no recipe called True
        if name is not None and (not typed or not str(name) or set(str(name)) - NAME_CHARS or str(name).startswith(".")):
            raise UserError(f"name={shown(name)!r} is not a recipe name; use letters, digits, _ - . (e.g. name=w4a16_keep12)")
        return cls(model=ModelChoice.from_config(values["model"]), recipe=RecipeChoice.from_config(values["recipe"]),
                   target=Target.from_config(values), sensitivity=str(values.get("sensitivity") or "auto"),
                   name=None if name is None else str(name), force=flag("force", values.get("force", False)),
                   results_dir=str(resolve(folder_setting("results_dir", values.get("results_dir", "results")))),
                   artifacts_dir=str(resolve(folder_setting("artifacts_dir", values.get("artifacts_dir", "artifacts")))),
                   recipes_dir=str(resolve(folder_setting("recipes_dir", values.get("recipes_dir", "recipes")))))
