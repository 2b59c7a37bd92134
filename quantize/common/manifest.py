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
    config_sha256: str | None = None   # config_sha256 of its config.json; None in manifests of id scheme 1
    files_sha256: str | None = None    # of its MODEL_FILES; None in manifests of id schemes 1 and 2
    revision: str | None = None        # the hub commit its snapshot held (model=owner/name); None: a local folder


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
    # How artifact_id was computed (ID_SCHEMES); None: 1, in manifests written before scheme 2.
    id_scheme: int | None = None
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
        for newer in ("command", "weights_fingerprint", "modules_changed", "id_scheme"):
            if out[newer] is None:
                del out[newer]
        for newer in ("config_sha256", "files_sha256", "revision"):
            if out["model"][newer] is None:
                del out["model"][newer]
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
        if (self.checks or {}).get("sanity"):  # its numbers: the report judges them with its own floors
            out["sanity"] = self.checks["sanity"]
        return out


def _typed(cls, data: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


# Fields every reader relies on.
REQUIRED = ("artifact_id", "model", "recipe", "quantization")


# How an artifact id is computed. 1: the hash of the base weights, recipe,
# calibration tokens, calibration dtype, seed and the libraries that write the
# bytes. 2: and of the base config.json's fields (config_sha256): two
# checkpoints with one set of weights and another rope_theta are two models.
# 3: and of the files the artifact ships beside the weights, copied from the
# base (MODEL_FILES: tokenizer, chat template, generation config): a fixed eos
# token or chat template changes what evaluate serves, not the weights.
# A manifest keeps the id it records: its scheme says how to compute it again.
ID_SCHEME = 3
MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
               "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
               "generation_config.json")

# config.json fields that change no output, so no identity: where the file was
# loaded from and the library version that wrote it (the libraries that change
# an artifact's bytes count in its id through `versions`). Every other field,
# `architectures` too (it picks the head), counts: a field unknown here may
# change the computation, and a new id costs a rebuild, a wrong one wrong numbers.
CONFIG_OUTSIDE_IDENTITY = ("_name_or_path", "name_or_path", "transformers_version", "_commit_hash")


def config_sha256(config: dict) -> str:
    """Hash of a config.json's fields that can change what the model computes."""
    return sha256_json({k: v for k, v in config.items() if k not in CONFIG_OUTSIDE_IDENTITY})


def artifact_id(*, model_weights_sha256: str, recipe_sha256: str, calibration_sha256: str | None,
                calibration_dtype: str | None, seed: int | None, versions: dict | None,
                model_config_sha256: str | None = None, model_files_sha256: str | None = None) -> str:
    """Hash of everything that determines an artifact's bytes: same inputs,
    same id, so a rerun is skipped. `versions` None for the baseline (saved,
    not computed); else only the libraries that change the bytes count.
    `calibration_sha256` and `seed` None for the baseline and for a recipe
    that needs no calibration data (pipeline: oneshot gets none).
    `model_config_sha256` None: the id of scheme 1; `model_files_sha256`
    None: of scheme 2 or 1 (ID_SCHEME)."""
    inputs = {
        "model_weights_sha256": model_weights_sha256,
        "recipe_sha256": recipe_sha256,
        "calibration_sha256": calibration_sha256,
        "calibration_dtype": calibration_dtype,
        "seed": seed,
        "versions": artifact_versions(versions) if versions is not None else None,
    }
    if model_config_sha256 is not None:
        inputs["model_config_sha256"] = model_config_sha256
    if model_files_sha256 is not None:
        inputs["model_files_sha256"] = model_files_sha256
    return sha256_json(inputs)[:16]


def id_as_recorded(recorded: Manifest, identity: dict) -> str:
    """The id `identity` (artifact_id's arguments) gets under the scheme the
    `recorded` manifest was written with, to compare with the id it records."""
    scheme = recorded.id_scheme or 1
    newer = {"model_config_sha256": 2, "model_files_sha256": 3}   # the scheme that added each
    inputs = {k: v for k, v in identity.items() if scheme >= newer.get(k, 1)}
    if inputs["calibration_sha256"] is None and inputs["versions"] is not None and recorded.calibration:
        # A data-free recipe, built when its id still hashed the calibration and
        # seed it was given though they changed no byte: the recorded ones stand.
        inputs |= {"calibration_sha256": recorded.calibration.get("sha256"), "seed": recorded.seed}
    return artifact_id(**inputs)


def config_differences(saved: dict, base: dict) -> list[str]:
    """The identity fields (CONFIG_OUTSIDE_IDENTITY aside) that the config.json
    saved with an artifact and its base model's both hold, with other values;
    the quantization_config quantize adds aside. What a manifest of scheme 1
    can still tell about the config it was built from."""
    skip = set(CONFIG_OUTSIDE_IDENTITY) | {"quantization_config"}
    return sorted(k for k in saved.keys() & base.keys() if k not in skip and saved[k] != base[k])


def checkpoint_id(weights_sha256: str, config: dict) -> str:
    """The id of a plain checkpoint (no manifest): its weights and config.json."""
    return checkpoint_id_of(weights_sha256, config_sha256(config))


def checkpoint_id_of(weights_sha256: str, config_sha256: str) -> str:
    """checkpoint_id from the hashes a manifest records of its base model."""
    return sha256_json({"weights_sha256": weights_sha256, "config_sha256": config_sha256})[:16]


def checkpoint_id_before_config(weights_sha256: str) -> str:
    """A plain checkpoint's id as rows recorded it before ids covered config.json: its weights alone."""
    return weights_sha256[:16]


def write(artifact_dir: Path, manifest: Manifest) -> None:
    """Write last, atomically: its presence marks the artifact complete."""
    write_json(Path(artifact_dir) / FILE, manifest.to_dict())


def read(artifact_dir: Path, fix: str = "rebuild the artifact with `python -m quantize ... force=true` "
                                        "(or delete its whole folder)") -> Manifest | None:
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
