"""model + recipe + calibration -> artifact directory (checkpoint, recipe.yaml,
manifest.json), written atomically and skipped when already complete."""
import dataclasses
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from quantize import awq_check, calibration, recipe as recipes, sanity, smoothquant_check, verify
from quantize.common import disk, file_lock, fingerprint, hf_load, hub, manifest, moe, point_folders, sanity_rules
from quantize.common.atomic import build_turn, staging_dir
from quantize.common.checkpoint import (check_complete, check_weight_files, ignore_unquantized,
                                        linear_subclasses_as_linear, quantization_summary, weight_files)
from quantize.common.dtypes import compute_dtype, config_dtype
from quantize.common.errors import UserError
from quantize.common.jobs import job_command
from quantize.common.manifest import Manifest, ModelInfo, RecipeInfo
from quantize.common import model_config as model_configs
from quantize.common.model_config import context_length, is_quantized
from quantize.common.paths import resolve
from quantize.common.provenance import artifact_versions, dir_bytes, hardware, sha256_files, versions
from quantize.config import QuantizeConfig

log = logging.getLogger("quantbench.quantize")


@dataclass(frozen=True)
class Inputs:
    """What one artifact is built from, and the id they hash to."""
    config: QuantizeConfig
    model_dir: Path
    model_config: dict  # its config.json, read once
    recipe: recipes.RecipeFile
    calib: calibration.CalibrationSet | None
    identity: dict
    artifact_id: str


class Timer:
    def __init__(self):
        self.phases: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        log.info("%s ...", name)
        start = time.perf_counter()
        yield
        self.phases[name] = round(time.perf_counter() - start, 3)
        log.info("%s done in %.1f s", name, self.phases[name])


def run(config: QuantizeConfig) -> Path:
    """Quantize per the stage's typed config; return the artifact directory,
    logged to the tracker (tracking=) when there is one, also when it was complete already."""
    out = _quantize(config)
    if config.tracker:
        config.tracker.log_artifact(out)
    return out


def _quantize(config: QuantizeConfig) -> Path:
    """The artifact of `config`: skipped when complete, else built under its build lock."""
    timer = Timer()
    check = verify.mode(config.verify)
    model_dir, model_config = _model(config.model.path, config.model.revision)
    recipe = recipes.load(config.recipe)
    needs_data = not recipe.is_baseline and _check_recipe(config, recipe, model_dir, model_config)
    out = resolve(config.artifact_dir)
    # Before minutes of calibration: an output dir with a corrupt manifest is
    # only replaced when asked to.
    existing = _complete_manifest(config, out)
    if existing is None and config.memory_check:  # a build follows: will the model fit?
        _check_memory(config, model_dir, model_config, recipe)
    if existing is None and config.disk_check:  # ... and will the artifact?
        _check_disk(model_dir, recipe, out)

    with timer.phase("load tokenizer and calibration"):
        tokenizer = _load_tokenizer(model_dir)
        calib = calibration.build(config.calibration, tokenizer, config.seed) if needs_data else None
    identity = _identity(config, model_dir, model_config, recipe, calib,
                         _calibration_dtype(config, model_config, recipe))
    inputs = Inputs(config, model_dir, model_config, recipe, calib, identity, manifest.artifact_id(**identity))
    if existing:
        return _skipped(existing, inputs, out)
    # One build of an artifact at a time: a second quantize of it waits here,
    # then finds it complete and skips it.
    with build_turn(out, f"artifact {inputs.artifact_id}") as hold:
        existing = _complete_manifest(config, out)
        if existing:
            return _skipped(existing, inputs, out, hold)
        if hold.waited:
            log.info("artifact %s: waited %.1f s for %s, which left it unbuilt: building it", inputs.artifact_id,
                     hold.waited_s, hold.holder)
        with disk.room_to_write(out, f"artifact {inputs.artifact_id}"):
            _build(inputs, tokenizer, out, timer, check)
    return out


def _check_recipe(config: QuantizeConfig, recipe: recipes.RecipeFile, model_dir: Path, model_config: dict) -> bool:
    """A quantizing recipe's checks, the calibration's quick ones first
    (llm-compressor imports for ~5 s); returns whether it needs calibration data."""
    calibration.check(config.calibration)
    needs_data = recipes.check_with_llmcompressor(recipe)
    if needs_data:
        calibration.check_held_out(config.calibration, config.sanity)
        _check_positions(config, model_config)
    else:
        log.info("recipe %s needs no calibration data: no text is read, and calibration.* and seed "
                 "are not part of its artifact id", recipe.name)
    smoothquant_check.check(recipe, model_dir)
    awq_check.check(recipe, model_dir)
    return needs_data


def _check_positions(config: QuantizeConfig, model_config: dict) -> None:
    """Calibration windows longer than the model's positions crash oneshot
    (learned positions) or calibrate on positions the model never serves (RoPE)."""
    seq, positions = config.calibration.max_seq_len, context_length(model_config)
    if positions is not None and seq > positions:
        raise UserError(f"calibration.max_seq_len={seq} is longer than the {positions} positions model "
                        f"{config.model.name} covers (its config.json); pass calibration.max_seq_len={positions} "
                        "or less")


def _complete_manifest(config: QuantizeConfig, out: Path) -> Manifest | None:
    """The manifest of the artifact at `out`, None when there is none or force=true rebuilds it."""
    return None if config.force else manifest.read(out, fix=f"pass force=true to rebuild {out}")


def _skipped(existing: Manifest, inputs: Inputs, out: Path, hold: file_lock.Hold | None = None) -> Path:
    """A complete artifact of these inputs is skipped, under the id its
    manifest records; one of other inputs is one line: it is never replaced
    unasked."""
    other, keys = _other_inputs(existing, inputs, out)
    if other:
        suffix = per_point_suffix(keys, existing.calibration, inputs.calib.spec if inputs.calib else None,
                                  inputs.config.swept)
        each = (f"a folder per point, e.g. artifact_dir='{point_folders.FOLDER}{suffix}'"
                if suffix else "artifact_dir=<new dir>")
        raise UserError(f"{out} holds artifact {existing.artifact_id} built from {other}; "
                        f"pass force=true to replace it, or {each} to keep both")
    by = f", built by {hold.holder} while this process waited {hold.waited_s:.1f} s" if hold and hold.waited else ""
    log.info("artifact %s is complete at %s%s: skipping (force=true rebuilds)", existing.artifact_id, out, by)
    return out


# The inputs artifact_id hashes, as the refusal names them; the last two only
# from id schemes 2 and 3 on (recorded as None before).
INPUT_NAMES = {"model_weights_sha256": "model weights", "recipe_sha256": "recipe",
               "calibration_sha256": "calibration tokens", "seed": "seed", "calibration_dtype": "calibration_dtype",
               "model_config_sha256": "model config.json",
               "model_files_sha256": "model tokenizer/chat template/generation config"}


def per_point_suffix(keys: list[str], then: dict | None, now: dict | None, swept=()) -> str | None:
    """The suffix naming each differing input (`keys`) in a per-point
    artifact_dir, from the calibration settings recorded (`then`) and asked
    (`now`), and each input the multirun sweeps (`swept`: its override keys),
    so that one folder pattern keeps every point apart; None where no suffix
    tells the points apart: another recipe or model, other books, two files of
    one basename, or the same settings giving other tokens (an edited file)."""
    if not keys or any(k not in point_folders.DIR_SUFFIX and k != "calibration_sha256" for k in keys):
        return None
    names = set(keys) - {"calibration_sha256"}
    if "calibration_sha256" in keys:
        own = _calibration_names(then or {}, now or {})
        if own is None or not (own or "seed" in keys):   # the seed alone changes the tokens
            return None
        names |= own
    also = point_folders.swept_names(swept)
    return None if also is None else point_folders.suffix(names | also)


def _calibration_names(then: dict, now: dict) -> set[str] | None:
    """The calibration settings that differ, as keys of point_folders.DIR_SUFFIX
    (empty: none differs); None where one differs that no folder name holds."""
    changed = {k for k in then.keys() | now.keys() if k not in ("num_tokens", "sha256") and then.get(k) != now.get(k)}
    if "name" in changed:
        changed -= _named_with(then, now)
    names = {f"calibration.{k}" for k in changed}
    if names - point_folders.DIR_SUFFIX.keys() or (
            "text_field" in changed and not all(point_folders.is_field_name(v.get("text_field")) for v in (then, now))):
        return None
    return names


def _named_with(then: dict, now: dict) -> set[str]:
    """The differing settings another name stands for: another preset brings
    all its own, but a file's name is only its path's basename, so a
    text_field set beside it (a sweep over both) is named too."""
    if then.get("source") == now.get("source") == "file":
        return {"path"}
    return (then.keys() | now.keys()) - {"name", "num_samples", "max_seq_len"}


def _other_inputs(existing: Manifest, inputs: Inputs, out: Path) -> tuple[str | None, list[str]]:
    """What differs between the inputs `existing` was built from and these,
    and the keys of those inputs; None: nothing. A manifest of id scheme 1
    hashed no config.json: the artifact's own config.json is compared with the
    model's instead."""
    if manifest.id_as_recorded(existing, inputs.identity) != existing.artifact_id:
        differing = _differing_inputs(existing, inputs)
        shown = "; ".join(text for _, text in differing)
        return (f"other inputs ({shown})" if shown else "other inputs"), [key for key, _ in differing]
    if existing.id_scheme is None:
        differing = manifest.config_differences(_saved_config(out), inputs.model_config)
        if differing:
            return f"a config.json with other {', '.join(differing[:5])}", ["model_config_sha256"]
    return None, []


def _differing_inputs(existing: Manifest, inputs: Inputs) -> list[tuple[str, str]]:
    """(key, "name: recorded -> now") of each hashed input that differs from
    what the manifest records, hashes cut to 12 characters."""
    model, recipe, now = existing.model, existing.recipe, inputs.identity
    recorded = {"model_weights_sha256": model.weights_sha256, "recipe_sha256": recipe.sha256,
                "calibration_sha256": (existing.calibration or {}).get("sha256"), "seed": existing.seed,
                "calibration_dtype": existing.calibration_dtype, "model_config_sha256": model.config_sha256,
                "model_files_sha256": model.files_sha256}
    if now["calibration_sha256"] is None and now["versions"] is not None and existing.calibration:
        now = now | {k: recorded[k] for k in ("calibration_sha256", "seed")}  # they stand (id_as_recorded)
    paths = {"model_weights_sha256": (model.path, str(inputs.model_dir)),
             "recipe_sha256": (recipe.source, str(inputs.recipe.path))}
    out = []
    for key, name in INPUT_NAMES.items():
        if recorded[key] == now[key] or (recorded[key] is None and key.startswith("model_")):
            continue
        then_from, now_from = paths.get(key, (None, None))
        where = f" ({then_from} -> {now_from})" if then_from != now_from else ""
        out.append((key, f"{name} {_short(recorded[key])} -> {_short(now[key])}{where}"))
    if now["versions"] is not None:
        then, current = artifact_versions(existing.versions or {}), artifact_versions(now["versions"])
        out += [("versions", f"{name} {then[name]} -> {v}") for name, v in current.items() if then[name] != v]
    return out


def _short(value) -> str:
    """A sha256 cut to 12 characters; other values as they are."""
    return value[:12] if isinstance(value, str) and len(value) == 64 else str(value)


def _saved_config(artifact_dir: Path) -> dict:
    """The artifact's config.json; {} when unreadable (evaluate names that in one line)."""
    try:
        return model_configs.read(artifact_dir)
    except (OSError, UserError):
        return {}


def _build(inputs: Inputs, tokenizer, out: Path, timer: Timer, check: str | None) -> None:
    """Load the model, quantize it into a staging dir, verify and describe
    it; the manifest last, then the dir takes `out`'s name."""
    recipe, config = inputs.recipe, inputs.config
    with timer.phase("load model"):
        model = _load_model(inputs.model_dir)
        if not recipe.is_baseline and moe.is_moe(model.config.to_dict()):
            moe.linearize(model)  # before the dtype cast below, so the experts get it too
    recipes.check_group_sizes(recipe, model)

    with staging_dir(out) as tmp:
        changed, measured = _quantize_and_save(model, tokenizer, inputs, tmp, timer)
        del model
        checks = {}
        if check:
            with timer.phase(f"verify ({check}: the saved checkpoint)"):
                checks = verify.check(tmp, check, recipe.prunes)
        described = dataclasses.replace(_manifest(inputs, tmp, timer, checks), modules_changed=changed)
        if measured is not None:
            # the family the report judges by: 2:4 as the saved weights hold it, not as the recipe meant
            described = _judged(described, measured, config.sanity, described.holds_2_4)
        manifest.write(tmp, described)  # last: its presence means "complete"
    log.info("artifact %s written to %s (%.1f MB)", inputs.artifact_id, out, described.bytes_on_disk["total"] / 1e6)
    if "suspect" in described.extra:
        log.warning("artifact %s at %s is SUSPECT: %s (kept for inspection; the report will not rank it)",
                    inputs.artifact_id, out, described.extra["suspect"]["reason"])


def _judged(described: Manifest, measured: dict, config: sanity_rules.SanityConfig, sparse_24: bool) -> Manifest:
    """The manifest with checks.sanity and, below the format's floor, `suspect`;
    sanity.strict=true fails the job instead (nothing is written). `sparse_24`:
    the saved weights hold 2:4 (the verify step's measure)."""
    suspect = (None if "skipped" in measured
               else sanity_rules.judge(measured, described.quantization.to_dict(), sparse_24, config))
    checks = {**described.checks, "sanity": measured}
    if suspect and config.strict:
        raise UserError(f"the quantized model fails the sanity check: {suspect['reason']} (measured on "
                        f"{measured['scored_tokens']} held-out tokens); check the recipe, or pass "
                        "sanity.strict=false to keep the artifact for inspection")
    extra = {**described.extra, "suspect": suspect} if suspect else described.extra
    return dataclasses.replace(described, checks=checks, extra=extra)


def _quantize_and_save(model, tokenizer, inputs: Inputs, tmp: Path,
                       timer: Timer) -> tuple[dict | None, dict | None]:
    """The checkpoint, its recipe.yaml and tokenizer into `tmp`: the baseline
    as loaded, else after oneshot in the calibration dtype. Returns how many
    modules oneshot changed (count_changed_modules; None for the baseline)
    and the sanity check's numbers (None for the baseline or sanity.enabled=false)."""
    recipe, changed, measured = inputs.recipe, None, None
    if recipe.is_baseline:
        with timer.phase("save"):
            model.save_pretrained(tmp, safe_serialization=True)
            (tmp / "recipe.yaml").write_text(recipe.text)
    else:
        import torch
        saved_dtype, calib_dtype = model.dtype, inputs.identity["calibration_dtype"]
        what = "calibrate + quantize" if inputs.calib is not None else "quantize, no calibration data"
        with timer.phase(f"oneshot ({what} in {calib_dtype})"):
            model.to(getattr(torch, calib_dtype))
            zeros_before = _linear_zeros(model) if recipe.prunes else None
            base = _sanity_before(model, tokenizer, inputs.config.sanity)
            # a data-free recipe's id leaves the seed out: one seed for all its builds
            _oneshot(model, tokenizer, recipe, inputs.calib, inputs.identity["seed"] or 0)
            changed = count_changed_modules(model, zeros_before)
            _check_changed(changed, model, recipe, inputs.config.model.name)
            if base:  # before saving: save_pretrained compresses the modules in place
                measured = _sanity_after(base, model)
            model.to(saved_dtype)  # the artifact keeps the checkpoint's dtype
        with timer.phase("save"):
            with linear_subclasses_as_linear(model):
                model.save_pretrained(tmp, save_compressed=True)
            ignore_unquantized(tmp, model)  # a module left unquantized beside another class (Falcon's lm_head)
            # llm-compressor's own dump holds !!python/tuple tags that safe
            # YAML loaders reject: keep the exact source recipe instead.
            (tmp / "recipe.yaml").write_text(recipe.text)
    tokenizer.save_pretrained(tmp)
    hf_load.refuse_model_code(tmp)  # as refused in the input: no artifact names code (auto_map) to run
    return changed, measured


def _sanity_before(model, tokenizer, config: sanity_rules.SanityConfig | None) -> sanity.Measure | None:
    """The base model's logits on the sanity windows, before oneshot changes it."""
    if config is None:
        return None
    try:
        return sanity.Measure.before(model, tokenizer, config)
    except SANITY_FORWARD_ERRORS as e:
        return sanity.Measure.failed(e)


# A forward pass the check cannot make (an architecture transformers runs only
# in generation, a dispatch llm-compressor left behind) skips the check with a
# WARNING: the artifact is checked again when evaluate measures its accuracy.
SANITY_FORWARD_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError)


def _sanity_after(base: sanity.Measure, model) -> dict:
    """checks.sanity: the quantized model against the base (or why it was skipped)."""
    try:
        measured = base.compare(model)
    except SANITY_FORWARD_ERRORS as e:
        measured = sanity.Measure.failed(e).compare(model)
    if "skipped" in measured:
        log.warning("sanity check skipped: %s", measured["skipped"])
    else:
        log.info("sanity: top-1 agreement %.3f, KL %.4f nats/token vs the base on %d held-out tokens (%.1f s)",
                 measured["top1_agreement"], measured["kl_divergence"], measured["scored_tokens"],
                 measured["wall_s"])
    return measured


def _model_dir(path, revision: str | None = None) -> Path:
    return _model(path, revision)[0]


def _model(path, revision: str | None = None) -> tuple[Path, dict]:
    """The checkpoint folder of `model=` (a hub id's at `revision`) and its
    config.json, checked before anything loads."""
    from quantize.common.assets import SMOLLM2_DIR, ensure_default_model
    model_dir = hub.local_dir(str(path), revision)
    if model_dir == SMOLLM2_DIR and not model_dir.exists():
        ensure_default_model()
    if not (model_dir / "config.json").is_file():
        raise UserError(f"model {model_dir} is not a Hugging Face checkpoint (no config.json); "
                        "pass model=<preset> (see conf/model/), model=<local checkpoint dir> or model=<hub owner/name>")
    model_config = model_configs.read(model_dir)
    hf_load.refuse_model_code(model_dir)
    if is_quantized(model_config):  # "original" would be it, and a recipe would quantize it twice
        raise UserError(f"model {model_dir} is already quantized (its config.json has a quantization_config); "
                        "pass model=<its full-precision checkpoint>, the one it was quantized from")
    if not weight_files(model_dir):
        raise UserError(f"model {model_dir} has no *.safetensors weights; only safetensors "
                        "checkpoints are loaded (convert .bin weights first)")
    check_weight_files(weight_files(model_dir))
    return model_dir, model_config


def _load_tokenizer(model_dir: Path):
    return hf_load.tokenizer(model_dir)


def _load_model(model_dir: Path):
    """The model as transformers loads it; a checkpoint lacking any of the
    architecture's parameters (transformers would initialise them at random)
    is refused before calibration."""
    model, info = hf_load.causal_lm(model_dir, dtype="auto", use_safetensors=True, output_loading_info=True)
    # Parameters only: a missing buffer (e.g. rotary frequencies) is computed at init, not random.
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    check_complete(model_dir, [k for k in info["missing_keys"] if k in parameters], model.config.to_dict())
    return model


def _check_memory(config: QuantizeConfig, model_dir: Path, model_config: dict, recipe: recipes.RecipeFile) -> None:
    """From the safetensors headers, before the tokenizer, the calibration set
    and the weight hash: a model too big for this machine's free memory fails
    in milliseconds, instead of in an OOM kill minutes later."""
    from quantize.common import memory_check
    # The model is loaded in its checkpoint's dtype, then cast to the calibration dtype.
    held = memory_check.wider(str(config_dtype(model_config)).removeprefix("torch."),
                              _calibration_dtype(config, model_config, recipe))
    hessians = any(m in memory_check.HESSIAN_MODIFIERS for m in recipe.modifiers)
    gpu = not recipe.is_baseline and memory_check.on_gpu()  # the baseline is only loaded and saved
    need = memory_check.check(model_dir, held, on_gpu=gpu, hessians=hessians)
    log.info("memory: %s in %s%s fits", memory_check.gib(need.weight_bytes), held,
             f", largest layer {memory_check.gib(need.gpu_need)} on the GPU" if gpu else "")


def _check_disk(model_dir: Path, recipe: recipes.RecipeFile, out: Path) -> None:
    """From the safetensors headers and the recipe's weight scheme, before
    anything loads: an artifact its disk cannot hold fails now, not when
    save_pretrained meets a full disk."""
    from quantize.propose.size import expected_bytes
    need = expected_bytes(model_dir, recipe.path, recipe.data)
    disk.check(out, need, f"artifact {out}")
    log.info("disk: the artifact's %s fits on the disk of %s", disk.size(need), out)


def _calibration_dtype(config: QuantizeConfig, model_config: dict, recipe: recipes.RecipeFile) -> str | None:
    """Name of the dtype oneshot runs in (see quantize/common/dtypes.py)."""
    if recipe.is_baseline:
        return None
    return str(compute_dtype(config_dtype(model_config), config.calibration_dtype)).removeprefix("torch.")


def _identity(config: QuantizeConfig, model_dir: Path, model_config: dict, recipe: recipes.RecipeFile,
              calib: calibration.CalibrationSet | None, calibration_dtype: str | None) -> dict:
    """Everything that determines an artifact's bytes (manifest.artifact_id hashes it); `calib`
    None: the baseline or a data-free recipe, whose bytes no calibration or seed changes."""
    return {
        "model_weights_sha256": sha256_files(weight_files(model_dir)),
        "model_config_sha256": manifest.config_sha256(model_config),
        "model_files_sha256": sha256_files(p for name in manifest.MODEL_FILES if (p := model_dir / name).is_file()),
        "recipe_sha256": recipe.sha256,
        "calibration_sha256": calib.sha256 if calib else None,
        "calibration_dtype": calibration_dtype,
        "seed": config.seed if calib else None,
        "versions": None if recipe.is_baseline else versions(),
    }


def _oneshot(model, tokenizer, recipe, calib, seed: int) -> None:
    import torch
    from llmcompressor import oneshot

    from quantize.compat import allow_awq_without_accelerator
    if "AWQModifier" in recipe.modifiers:
        allow_awq_without_accelerator()
    torch.manual_seed(seed)
    data = {} if calib is None else {  # None: a recipe whose modifiers all run without data
        "dataset": calib.to_dataset(), "num_calibration_samples": len(calib.samples),
        "max_seq_length": max(len(s) for s in calib.samples), "shuffle_calibration_samples": False}
    try:
        oneshot(
            model=model,
            tokenizer=tokenizer,
            # its text as read once, not its file: the manifest's recipe and id are that text's,
            # and a file edited during a sweep would otherwise be applied unrecorded
            recipe=recipe.text,
            **data,
        )
    except (ValueError, TypeError, KeyError) as e:
        # llm-compressor reports recipe/model mismatches (no matching layers,
        # unresolvable mappings) as these; anything else is a real crash.
        msg = " ".join(str(e).split())[:300]
        raise UserError(f"llm-compressor could not apply recipe {recipe.path.name} to this model: {msg}") from e


def _linear_zeros(model) -> dict[str, int]:
    """Exact-zero weights of each Linear, to see afterwards which ones pruning changed."""
    import torch
    return {name: int((m.weight == 0).sum()) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def count_changed_modules(model, zeros_before: dict[str, int] | None) -> dict:
    """How many modules oneshot changed, for the manifest's modules_changed:
    `quantized`, those carrying a compressed-tensors quantization scheme
    (Linears; attention modules for a KV-cache scheme); with `zeros_before`
    (a pruning recipe), `pruned`, the Linears holding more exact-zero weights
    than before (a quantizer that rounds weights to zero adds to it); `total`,
    the modules in either."""
    from compressed_tensors.quantization.utils import is_module_quantized
    quantized = {name for name, m in model.named_modules() if is_module_quantized(m)}
    counts = {"quantized": len(quantized)}
    changed = set(quantized)
    if zeros_before is not None:
        pruned = {name for name, zeros in _linear_zeros(model).items() if zeros > zeros_before.get(name, zeros)}
        counts["pruned"] = len(pruned)
        changed |= pruned
    return {"total": len(changed)} | counts


def _check_changed(changed: dict, model, recipe: recipes.RecipeFile, model_name: str) -> None:
    """A recipe whose targets/ignore select nothing leaves the model dense:
    saved under the recipe's name it would pass for a quantized artifact."""
    if changed["total"]:
        return
    import torch
    example = next((name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)), None)
    raise UserError(f"recipe {recipe.name} matched no module of {model_name}: check targets/ignore "
                    f"in {recipe.path} against the model's module names (e.g. {example})")


def _manifest(inputs: Inputs, tmp: Path, timer: Timer, checks: dict) -> Manifest:
    config, model_dir, recipe, calib, identity = (inputs.config, inputs.model_dir, inputs.recipe, inputs.calib,
                                                  inputs.identity)
    weights = weight_files(tmp)
    model_config = inputs.model_config
    quantization = quantization_summary(tmp)
    return Manifest(
        artifact_id=inputs.artifact_id,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model=ModelInfo(
            name=config.model.name, path=str(model_dir), weights_sha256=identity["model_weights_sha256"],
            architecture=(model_config.get("architectures") or [None])[0],
            max_position_embeddings=model_config.get("max_position_embeddings"),
            config_sha256=identity["model_config_sha256"], files_sha256=identity["model_files_sha256"],
            revision=hub.commit(model_dir) if hub.is_repo_id(config.model.path) else None),
        recipe=RecipeInfo(name=recipe.name, source=str(recipe.path), sha256=recipe.sha256,
                          modifiers=recipe.modifiers, description=config.recipe.description),
        calibration=calib.describe() if calib else None,
        seed=identity["seed"],
        calibration_dtype=identity["calibration_dtype"],
        quantization=quantization,
        moe=moe.describe(model_config, quantization.ignore or []),
        checks=checks,
        bytes_on_disk={"total": dir_bytes(tmp), "weights": sum(p.stat().st_size for p in weights)},
        timings_s={**timer.phases, "total": round(sum(timer.phases.values()), 3)},
        versions=versions(),
        hardware=hardware(),
        config=config.composed,
        command=job_command("quantize", drop=("force",)),  # rerun: skipped while complete
        weights_fingerprint=fingerprint.compute(weights, full=True),  # evaluate checks the files against it
        id_scheme=manifest.ID_SCHEME,
    )
