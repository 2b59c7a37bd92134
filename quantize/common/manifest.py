"""The artifact manifest (`manifest.json`): what an artifact is, how it was
made and how it identifies itself. Written last by `python -m quantize` (its
presence means "complete"), read by both stages; this module is its one home:
schema, identity, writing and reading."""
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from quantize.common.atomic import write_json
from quantize.common.errors import UserError
from quantize.common.fingerprint import WeightsFingerprint
from quantize.common.provenance import artifact_versions, sha256_json

FILE = "manifest.json"
SCHEMA = 1


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str | None = None
    weights_sha256: str | None = None
    architecture: str | None = None
    max_position_embeddings: int | None = None


@dataclass(frozen=True)
class RecipeInfo:
    name: str
    source: str | None = None
    sha256: str | None = None
    modifiers: list = field(default_factory=list)
    description: str = ""


@dataclass(frozen=True)
class Scheme:
    """One config group of the checkpoint: the quantization arguments of its
    weights and activations (num_bits, type, symmetric, strategy, group_size,
    dynamic: those config.json states)."""
    weights: dict
    activations: dict | None = None

    def to_dict(self) -> dict:
        return {"weights": self.weights, "activations": self.activations}


@dataclass(frozen=True)
class Quantization:
    """The manifest's `quantization`: what the checkpoint's config.json says
    (checkpoint.quantization_summary). Its JSON holds `ignore` only for a
    quantized checkpoint and `kv_cache` only when the recipe quantizes the KV
    cache, as manifests always have."""
    method: str | None = None             # "compressed-tensors"; None for a dense checkpoint
    format: str | None = None             # pack-quantized, int-quantized, float-quantized, ... or "dense"
    schemes: tuple[Scheme, ...] = ()
    ignore: list | None = None            # modules left unquantized
    kv_cache: dict | None = None          # the KV-cache scheme's arguments
    extra: dict = field(default_factory=dict)  # keys of newer writers, kept as they are

    def to_dict(self) -> dict:
        out = {"method": self.method, "format": self.format, "schemes": [s.to_dict() for s in self.schemes]}
        out |= {k: v for k, v in (("ignore", self.ignore), ("kv_cache", self.kv_cache)) if v is not None}
        return out | self.extra

    @classmethod
    def from_dict(cls, data: dict | None) -> "Quantization":
        data = data or {}
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        schemes = tuple(Scheme(s.get("weights") or {}, s.get("activations")) for s in data.get("schemes") or ())
        known = {k: v for k, v in data.items() if k in names - {"schemes"}}
        return cls(**known, schemes=schemes, extra={k: v for k, v in data.items() if k not in names})


@dataclass(frozen=True)
class Manifest:
    artifact_id: str
    model: ModelInfo
    recipe: RecipeInfo
    quantization: Quantization
    schema: int = SCHEMA
    created_at: str | None = None
    calibration: dict | None = None
    seed: int | None = None
    calibration_dtype: str | None = None
    moe: dict | None = None
    checks: dict = field(default_factory=dict)       # what was verified on the saved checkpoint
    bytes_on_disk: dict = field(default_factory=dict)  # total, weights
    timings_s: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)        # the composed Hydra config
    command: str | None = None                        # the command that builds it again (jobs.job_command)
    # The saved weight files' fingerprint, which evaluate checks the files
    # against; None in manifests written before it existed.
    weights_fingerprint: WeightsFingerprint | None = None
    # How many modules oneshot changed: {"total", "quantized"[, "pruned"]}
    # (pipeline.count_changed_modules); None for the baseline and older manifests.
    modules_changed: dict | None = None
    extra: dict = field(default_factory=dict)         # keys of newer writers, kept as they are

    @property
    def quant_format(self) -> str:
        return self.quantization.format or "dense"

    @property
    def sparsity(self) -> dict | None:
        return (self.checks or {}).get("sparsity")

    @property
    def holds_2_4(self) -> bool:
        """Every pruned layer of the saved weights holds the 2:4 pattern."""
        return bool((self.sparsity or {}).get("all_layers_hold_pattern"))

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out["model"], out["recipe"] = dataclasses.asdict(self.model), dataclasses.asdict(self.recipe)
        out["quantization"] = self.quantization.to_dict()
        # Newer than schema 1: older manifests read and write back unchanged.
        for newer in ("command", "weights_fingerprint", "modules_changed"):
            if out[newer] is None:
                del out[newer]
        if self.weights_fingerprint is not None:
            out["weights_fingerprint"] = self.weights_fingerprint.to_dict()
        return out | self.extra

    @classmethod
    def from_dict(cls, data: dict) -> "Manifest":
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        known["model"] = _typed(ModelInfo, data["model"])
        known["recipe"] = _typed(RecipeInfo, data["recipe"])
        known["quantization"] = Quantization.from_dict(data["quantization"])
        if data.get("weights_fingerprint"):
            known["weights_fingerprint"] = WeightsFingerprint.from_dict(data["weights_fingerprint"])
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    def row_fields(self) -> dict:
        """The manifest fields a result row repeats (the rest stays in the artifact)."""
        keep = ("artifact_id", "created_at", "model", "recipe", "calibration", "seed",
                "quantization", "bytes_on_disk", "modules_changed")
        full = self.to_dict()
        out = {k: full.get(k) for k in keep}
        if self.sparsity:
            out["sparsity"] = {k: self.sparsity[k] for k in ("measured_sparsity", "all_layers_hold_pattern")}
        if full.get("suspect"):  # quantize's sanity check: the report reads it from the rows anywhere
            out["suspect"] = full["suspect"]
        return out


def _typed(cls, data: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


# Fields every reader relies on.
REQUIRED = ("artifact_id", "model", "recipe", "quantization")


def artifact_id(*, model_weights_sha256: str, recipe_sha256: str, calibration_sha256: str | None,
                calibration_dtype: str | None, seed: int | None, versions: dict | None) -> str:
    """Hash of everything that determines an artifact's bytes: same inputs,
    same id, so a rerun is skipped. `versions` None for the baseline (saved,
    not computed); else only the libraries that change the bytes count."""
    return sha256_json({
        "model_weights_sha256": model_weights_sha256,
        "recipe_sha256": recipe_sha256,
        "calibration_sha256": calibration_sha256,
        "calibration_dtype": calibration_dtype,
        "seed": seed,
        "versions": artifact_versions(versions) if versions is not None else None,
    })[:16]


def write(artifact_dir: Path, manifest: Manifest) -> None:
    """Write last, atomically: its presence marks the artifact complete."""
    write_json(Path(artifact_dir) / FILE, manifest.to_dict())


def read(artifact_dir: Path, fix: str = "delete it and rerun `python -m quantize`") -> Manifest | None:
    """The artifact's manifest, None when there is none; a manifest that is
    not one (truncated, hand-edited) is a one-line error naming `fix`."""
    path = Path(artifact_dir) / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path} is corrupt (not valid JSON: {e.msg}, char {e.pos}); {fix}") from None
    missing = [k for k in REQUIRED if not isinstance(data, dict) or k not in data]
    if missing or not isinstance(data.get("model"), dict) or not isinstance(data.get("recipe"), dict) \
            or "name" not in data["model"] or "name" not in data["recipe"]:
        raise UserError(f"{path} is not a quantbench manifest (missing {', '.join(missing) or 'model/recipe'}); {fix}")
    return Manifest.from_dict(data)
