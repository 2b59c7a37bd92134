"""The quantize stage's settings as typed objects: `quantize/cli.py` converts
the composed Hydra config once into a `QuantizeConfig`, and everything below
it (pipeline, calibration, recipe) takes these instead of a DictConfig."""
from dataclasses import dataclass, field
from pathlib import Path

from quantize.calibration import CalibrationConfig
from quantize.common import hf_load, hub
from quantize.common.credentials import redact_values
from quantize.common.dtypes import requested_dtype
from quantize.common.errors import UserError
from quantize.common.manifest import FILE as MANIFEST_FILE
from quantize.common.paths import check_output_dir, folder_name, folder_setting
from quantize.common.recipe_choices import RecipeChoice
from quantize.common.sanity_rules import SanityConfig
from quantize.common.settings import flag, integer
from quantize.common.tracking import Tracker, from_group as tracker_from_group


@dataclass(frozen=True)
class ModelChoice:
    """The `model` group: a name (the artifact folder's), a local checkpoint
    folder or a Hugging Face hub id, and a hub id's revision (None: main)."""
    name: str
    path: str
    revision: str | None = None

    @classmethod
    def from_config(cls, values: dict) -> "ModelChoice":
        path = str(values["path"])
        return cls(name=folder_name("model.name", values["name"]), path=path,
                   revision=hub.check_revision(path, values.get("revision")))


@dataclass(frozen=True)
class QuantizeConfig:
    """conf/quantize.yaml with its model, recipe and calibration groups (the
    comments there say what each setting does)."""
    model: ModelChoice
    recipe: RecipeChoice
    calibration: CalibrationConfig
    artifact_dir: str
    seed: int = 0
    force: bool = False
    calibration_dtype: str | None = "auto"
    verify: str | bool | None = "tensors"
    memory_check: bool = True
    disk_check: bool = True
    # The accuracy sanity gates (conf/sanity/default.yaml); None: no check.
    sanity: SanityConfig | None = None
    # Where each artifact is also logged (conf/tracking/); None: tracking=none.
    tracker: Tracker | None = field(default=None, compare=False)
    # The whole composed config as plain values, as the manifest records it:
    # a URL's password (a database tracking.uri) redacted; the tracker has the real one.
    composed: dict = field(default_factory=dict, compare=False)
    # In a multirun, the override keys it sweeps: a folder-per-point advice names each.
    swept: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_config(cls, values: dict, swept: tuple[str, ...] = ()) -> "QuantizeConfig":
        """From the composed config as plain, resolved values (extensions.plain),
        and the keys the multirun it is a job of sweeps."""
        folder_setting("artifacts_dir", values.get("artifacts_dir", "artifacts"))
        check_replaceable(check_output_dir(folder_setting("artifact_dir", values["artifact_dir"]),
                                           "artifacts_dir=<a directory> (or artifact_dir=<a directory>)"))
        hf_load.check_setting(values.get("trust_remote_code"))
        return cls(
            model=ModelChoice.from_config(values["model"]),
            recipe=RecipeChoice.from_config(values["recipe"]),
            calibration=CalibrationConfig.from_config(values["calibration"]),
            artifact_dir=str(values["artifact_dir"]), seed=integer("seed", values.get("seed", 0), minimum=0),
            force=flag("force", values.get("force", False)),
            calibration_dtype=_checked_dtype(values.get("calibration_dtype", "auto")),
            verify=values.get("verify", "tensors"), memory_check=flag("memory_check", values.get("memory_check", True)),
            disk_check=flag("disk_check", values.get("disk_check", True)), sanity=_sanity(values.get("sanity")),
            tracker=tracker_from_group(values.get("tracking")),
            composed=redact_values(values), swept=tuple(swept))


def _sanity(values: dict | None) -> SanityConfig | None:
    """The sanity group; None when it is switched off (sanity.enabled=false)."""
    config = SanityConfig.from_config(values)
    return config if config.enabled else None


def _checked_dtype(requested):
    """calibration_dtype as given, once it names a floating dtype (or auto)."""
    requested_dtype(requested, "calibration_dtype")
    return requested


def check_replaceable(out: Path) -> None:
    """A build replaces the folder at `out` whole (staging, then a swap), so
    only an artifact (its manifest.json) or an empty folder may be there:
    never a model, this project, or a model's other artifacts (artifact_dir=
    one level too high), which force=true would delete too."""
    if out.is_dir() and not (out / MANIFEST_FILE).exists() and any(out.iterdir()):
        raise UserError(f"artifact_dir={out} holds files but no {MANIFEST_FILE}: it is not an artifact, and building "
                        "there would replace everything in it; pass artifact_dir=<a new or empty folder>")
