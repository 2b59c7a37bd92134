"""What is being evaluated: a quantbench artifact (with manifest) or any plain
Hugging Face checkpoint (GPTQ/AWQ/compressed-tensors/dense), with an identity
that every result row carries."""
import json
from dataclasses import dataclass, field
from pathlib import Path

from evaluate.capabilities import classify
from quantize.common.errors import UserError
from quantize.common.paths import resolve
from quantize.common import manifest as manifest_mod
from quantize.common.manifest import Manifest
from quantize.common.checkpoint import check_weight_files, weight_files
from quantize.common.provenance import sha256_files


@dataclass
class Target:
    path: Path
    artifact_id: str
    model_name: str
    recipe: str
    quant_format: str
    model_bytes: int
    max_context: int | None
    config: dict = field(repr=False)
    manifest: Manifest | None = field(default=None, repr=False)

    def as_row(self) -> dict:
        return {
            "artifact_id": self.artifact_id, "artifact_path": str(self.path),
            "model_name": self.model_name, "recipe": self.recipe,
            "quant_format": self.quant_format, "model_bytes": self.model_bytes,
            "manifest": self.manifest.row_fields() if self.manifest else None,
        }

    @property
    def format(self):
        """What an engine needs to know to decide whether it can serve this."""
        return classify(self.config, sparse_24=bool(self.manifest and self.manifest.holds_2_4))


def load(cfg) -> Target:
    return from_path(_target_dir(cfg))


def from_path(path: Path) -> Target:
    """An artifact or plain checkpoint directory, checked before any engine sees it."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UserError(f"{path} is not a model checkpoint (no config.json); pass model=<artifact dir> "
                        "from `python -m quantize`, a model preset, or recipe=<name>")
    weights = weight_files(path)
    if not weights:
        raise UserError(f"{path} has no *.safetensors weights; only safetensors checkpoints are served")
    try:
        config = json.loads(config_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{config_file} is corrupt (not valid JSON: {e}); re-copy or re-create the checkpoint") from None
    manifest = manifest_mod.read(path, fix=f"rebuild the artifact with `python -m quantize ... force=true` "
                                        f"or delete {path / 'manifest.json'} to serve it as a plain checkpoint")
    check_weight_files(weights)
    q = config.get("quantization_config") or {}
    common = dict(path=path, config=config, manifest=manifest,
                  model_bytes=sum(p.stat().st_size for p in weights),
                  max_context=config.get("max_position_embeddings"))
    if manifest:
        return Target(artifact_id=manifest.artifact_id, model_name=manifest.model.name,
                      recipe=manifest.recipe.name, quant_format=manifest.quant_format, **common)
    # A plain checkpoint: its identity is the hash of its weights.
    return Target(artifact_id=sha256_files(weights)[:16], model_name=path.name,
                  recipe="original" if not q else "external",
                  quant_format=q.get("format") or q.get("quant_method") or "dense", **common)


def _target_dir(cfg) -> Path:
    if cfg.get("recipe"):
        name = cfg.recipe.name
        path = resolve(cfg.artifacts_dir) / cfg.model.name / name
        if not (path / manifest_mod.FILE).is_file():
            raise UserError(f"no complete artifact at {path}; run `python -m quantize "
                            f"recipe={name}` first (or pass model=<artifact dir>)")
        return path
    path = resolve(cfg.model.path)
    if not path.exists():
        raise UserError(f"model {path} does not exist; pass model=<artifact dir> or a preset from conf/model/")
    return path

