"""What is being evaluated: a quantbench artifact (with manifest) or any plain
Hugging Face checkpoint (GPTQ/AWQ/compressed-tensors/dense), with an identity
that every result row carries."""
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from evaluate import completeness
from evaluate.formats import classify
from evaluate.results import Row
from quantize.common.errors import UserError
from quantize.common.paths import resolve
from quantize.common import fingerprint, hf_load, manifest
from quantize.common.fingerprint import WeightsFingerprint
from quantize.common.manifest import Manifest
from quantize.common import model_config
from quantize.common.model_config import context_length
from quantize.common.recipe_choices import BASELINE
from quantize.common.checkpoint import check_weight_files, planned_quantization_config, weight_files
from quantize.common.provenance import sha256_files
from quantize.common.settings import shown

log = logging.getLogger(__name__)

# verify= (conf/evaluate.yaml): how the weights are checked before any engine starts.
VERIFY_MODES = ("fingerprint", "full")

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
    # A recipe not quantized yet (see `planned`): the error to give if the
    # engine could serve it; None for a checkpoint on disk.
    not_built: UserError | None = field(default=None, repr=False)
    base_model: Path | None = field(default=None, repr=False)  # what it would be quantized from
    # A plain checkpoint: the id rows recorded for it before ids covered config.json (see as_recorded)
    id_before_config: str | None = field(default=None, repr=False)

    @property
    def built(self) -> bool:
        return self.not_built is None

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


class NotBuilt(UserError):
    """recipe=<name> names an artifact that is not (completely) on disk."""


@dataclass(frozen=True)
class TargetConfig:
    """What to open: model.path itself, or with a recipe the artifact
    `python -m quantize` writes to <artifacts_dir>/<model name>/<recipe name>."""
    model_name: str | None
    model_path: str | None
    recipe_name: str | None = None     # None: no recipe=, model_path is evaluated
    recipe_path: str | None = None     # the recipe YAML, to plan an artifact not built yet
    artifacts_dir: str = "artifacts"
    verify: str | None = "fingerprint"  # VERIFY_MODES, or None: trust the files as they are


def verify_mode(value) -> str | None:
    """The `verify` setting as a mode, None for no check; any other value is one line naming the choices."""
    if value is False or value is None or value == "none":
        return None
    if value in VERIFY_MODES:
        return value
    raise UserError(f"verify={shown(value)}: pass verify=fingerprint (sizes, headers and sampled blocks of the "
                    "weights against the manifest), verify=full (every byte) or verify=false")


def load(config: TargetConfig) -> Target:
    opened = from_path(_target_dir(config), name=config.model_name)
    if config.verify:
        started = time.perf_counter()
        check_weights(opened, config.verify)
        log.info("weights of %s checked (verify=%s) in %.2f s", opened.path, config.verify,
                 time.perf_counter() - started)
    return opened


def check_weights(opened: Target, mode: str) -> None:
    """The weights are the ones the manifest describes and hold every
    parameter the config implies. A manifest with a fingerprint: the files
    must match it (then they are what quantize saved from the whole model, so
    complete). An older manifest: the weight bytes it records must match.
    No fingerprint (older manifest, plain checkpoint): the tensor names are
    compared with the architecture's parameters."""
    weights = weight_files(opened.path)
    recorded = opened.manifest.weights_fingerprint if opened.manifest else None
    if recorded is not None:
        _check_fingerprint(opened, recorded, weights, full=mode == "full")
        return
    if opened.manifest:
        _check_recorded_bytes(opened, weights, full=mode == "full")
    missing = completeness.missing_parameters(opened.path)
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise UserError(f"{opened.path} lacks {len(missing)} parameter(s) its config.json implies: "
                        f"{', '.join(missing[:5])}{more}; re-copy or re-create the checkpoint "
                        "(verify=false skips this check)")


def _check_fingerprint(opened: Target, recorded: WeightsFingerprint, weights: list[Path], full: bool) -> None:
    actual = fingerprint.compute(weights, full=full and recorded.full_sha256 is not None)
    differences = actual.differences(recorded) if actual.sha256 != recorded.sha256 else []
    if not differences and actual.full_sha256 not in (None, recorded.full_sha256):
        differences = ["the SHA-256 of every byte differs"]
    if full and recorded.full_sha256 is None:
        log.warning("manifest.json of %s records no full weight hash: verify=full checked the fingerprint only",
                    opened.path)
    if differences:
        raise UserError(_mismatch(opened, _owner_of(opened.path, actual, recorded), "; ".join(differences[:2])))


def _check_recorded_bytes(opened: Target, weights: list[Path], full: bool) -> None:
    """A manifest from before fingerprints records only the weights' total bytes."""
    recorded = (opened.manifest.bytes_on_disk or {}).get("weights")
    actual = sum(p.stat().st_size for p in weights)
    if full:
        log.warning("manifest.json of %s predates weight fingerprints: verify=full has no hash to compare, "
                    "only the weight bytes were checked (rebuild with force=true to record one)", opened.path)
    if recorded is not None and actual != recorded:
        raise UserError(_mismatch(opened, "other weights",
                                  f"they hold {actual} bytes, the manifest records {recorded}"))


def _owner_of(path: Path, actual: WeightsFingerprint, recorded: WeightsFingerprint) -> str:
    """Whose weights these are: a sibling artifact's whose manifest records
    this fingerprint, else other weights, by fingerprint."""
    for other in sorted(path.parent.glob(f"*/{manifest.FILE}")):
        try:
            found = manifest.read(other.parent)
        except UserError:
            continue
        if other.parent != path and found.weights_fingerprint and found.weights_fingerprint.sha256 == actual.sha256:
            return f"those of artifact {found.artifact_id} ({other.parent})"
    return f"other weights (fingerprint {actual.short}, the manifest records {recorded.short})"


def _mismatch(opened: Target, weights: str, why: str) -> str:
    m = opened.manifest
    return (f"{opened.path}: manifest.json names artifact {m.artifact_id} ({m.model.name}/{m.recipe.name}), "
            f"but the weights beside it are {weights}: {why}; rebuild the artifact with `python -m quantize "
            f"... force=true`, or delete {opened.path / manifest.FILE} to evaluate them as a plain checkpoint")


def planned(config: TargetConfig, not_built: NotBuilt) -> Target | None:
    """The artifact `python -m quantize` would build for recipe=<name>: the
    model's config.json with the quantization_config llm-compressor resolves
    from the recipe. Enough for an engine to say whether it could serve it, so
    a recipe it cannot serve here gets that answer, not "quantize first".
    None when it cannot tell (no model on disk, a recipe that does not load)."""
    model_dir = resolve(config.model_path)
    try:
        planned_config = model_config.read(model_dir)
        q = planned_quantization_config(resolve(config.recipe_path))
    except Exception:  # quantize reports these itself, in its own words
        return None
    if q:
        planned_config["quantization_config"] = q
    return Target(path=artifact_dir(config), artifact_id=None, model_name=str(config.model_name),
                  recipe=str(config.recipe_name), quant_format="not built", model_bytes=0,
                  max_context=context_length(planned_config), config=planned_config,
                  not_built=not_built, base_model=model_dir)


def from_path(path: Path, name: str | None = None) -> Target:
    """An artifact or plain checkpoint directory, checked before any engine sees it.
    A plain checkpoint is named `name` (the model choice's: a preset's name is
    the one quantize gives the artifacts built from it, so the report finds
    their original), else after its folder."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UserError(f"{path} is not a model checkpoint (no config.json); pass model=<artifact dir> "
                        "from `python -m quantize`, a model preset, or recipe=<name>")
    hf_load.refuse_model_code(path)
    weights = weight_files(path)
    if not weights:
        raise UserError(f"{path} has no *.safetensors weights; only safetensors checkpoints are served")
    config = model_config.read(path)
    recorded = manifest.read(path, fix=f"rebuild the artifact with `python -m quantize ... force=true` "
                                        f"or delete {path / 'manifest.json'} to serve it as a plain checkpoint")
    check_weight_files(weights)
    q = config.get("quantization_config") or {}
    common = dict(path=path, config=config, manifest=recorded,
                  model_bytes=sum(p.stat().st_size for p in weights),
                  max_context=context_length(config))
    if recorded:
        return Target(artifact_id=recorded.artifact_id, model_name=recorded.model.name,
                      recipe=recorded.recipe.name, quant_format=recorded.quant_format, **common)
    # A plain checkpoint: its identity is the hash of its weights and config.json.
    weights_sha256 = sha256_files(weights)
    return Target(artifact_id=manifest.checkpoint_id(weights_sha256, config), model_name=name or path.name,
                  recipe=BASELINE if not q else "external",
                  quant_format=q.get("format") or q.get("quant_method") or "dense",
                  id_before_config=manifest.checkpoint_id_before_config(weights_sha256), **common)


def as_recorded(opened: Target, rows: list[Row]) -> Target:
    """A plain checkpoint measured before its id covered config.json keeps
    the id the store's rows record for it (its weights' hash), so an old
    store's runs still count: rows of this very folder under that id,
    measured after its config.json last changed (an edit since is a new model)."""
    if opened.id_before_config is None:
        return opened
    measured = [_when(r.timestamp) for r in rows
                if r.artifact_id == opened.id_before_config and r.artifact_path == str(opened.path)]
    measured = [t for t in measured if t is not None]
    edited = datetime.fromtimestamp((opened.path / "config.json").stat().st_mtime, timezone.utc)
    if not measured or edited > min(measured):
        return opened
    log.info("%s keeps the id %s its rows in this store record (measured before ids covered config.json)",
             opened.path, opened.id_before_config)
    return replace(opened, artifact_id=opened.id_before_config)


def _when(timestamp: str | None) -> datetime | None:
    try:
        when = datetime.fromisoformat(timestamp or "")
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)  # rows write UTC


def refuse_model_code(config: TargetConfig) -> None:
    """The folder to evaluate, when it is there, names no code to run: checked
    before the results store is touched, so a refusal leaves nothing behind
    (from_path checks again, for every other caller)."""
    path = artifact_dir(config) if config.recipe_name is not None else resolve(config.model_path)
    if (path / "config.json").is_file():
        hf_load.refuse_model_code(path)


def _target_dir(config: TargetConfig) -> Path:
    if config.recipe_name is not None:
        path = artifact_dir(config)
        if not (path / manifest.FILE).is_file():
            raise NotBuilt(f"no complete artifact at {path}; run `python -m quantize "
                           f"recipe={config.recipe_name}` first (or pass model=<artifact dir>)")
        return path
    path = resolve(config.model_path)
    if not path.exists():
        raise UserError(f"model {path} does not exist; pass model=<artifact dir> or a preset from conf/model/")
    return path


def artifact_dir(config: TargetConfig) -> Path:
    """Where `python -m quantize` writes the artifact `config` names."""
    return resolve(config.artifacts_dir) / str(config.model_name) / str(config.recipe_name)
