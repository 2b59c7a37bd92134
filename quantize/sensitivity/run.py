"""model + recipe + held-out text -> the sensitivity file (JSON, CSV and
heat map), skipped when one for the same weights, scheme and text exists."""
import logging
import time
from datetime import datetime, timezone
from pathlib import Path

from quantize import pipeline, recipe as recipes
from quantize.common import fingerprint, moe, sensitivity_file
from quantize.common.checkpoint import weight_files
from quantize.common.dtypes import checkpoint_dtype, compute_dtype
from quantize.common.errors import UserError
from quantize.common.heldout import held_out_text, windows
from quantize.common.model_config import context_length
from quantize.common.paths import resolve
from quantize.common.progress import duration
from quantize.common.provenance import hardware, sha256_bytes, versions
from quantize.common.sensitivity_plot import draw_heatmap
from quantize.sensitivity import measure, scheme as schemes
from quantize.sensitivity.config import SensitivityConfig, TextConfig

log = logging.getLogger("quantbench.sensitivity")
SHOWN = 10  # most sensitive cells printed at the end


def run(config: SensitivityConfig) -> Path:
    """Measure (or find) the sensitivity file; return its JSON's path."""
    start = time.perf_counter()
    model_dir, model_config = pipeline._model(config.model.path, config.model.revision)
    _check_positions(config, model_config)
    recipe = recipes.load(config.recipe)
    scheme = schemes.from_recipe(recipe)
    if set(recipe.modifiers) != {"QuantizationModifier"}:
        log.info("recipe %s runs %s; sensitivity applies its weight scheme by round-to-nearest only "
                 "(no calibration, smoothing or pruning)", recipe.name, ", ".join(recipe.modifiers))
    text = held_out_text(config.text.source, config.text.books, key="text.source")
    text_record = _text_record(config.text, text)
    weights_hash = fingerprint.compute(weight_files(model_dir)).sha256
    folder = sensitivity_file.folder_for(resolve(config.results_dir), config.model.name, scheme.key, weights_hash)
    existing = _existing(folder, text_record, scheme.as_dict())
    if existing and not config.force:
        print(f"sensitivity of {config.model.name} under {scheme.key} on this text is already measured: "
              f"{existing} (force=true remeasures)")
        return existing
    tokenizer = pipeline._load_tokenizer(model_dir)
    wins = windows(tokenizer, text, config.text.num_windows, config.text.window_len, group="text")
    cells, baseline = _measure(model_dir, scheme, wins)
    result = sensitivity_file.Sensitivity(
        model_name=config.model.name, model_path=str(model_dir), weights_hash=weights_hash, recipe=recipe.name,
        scheme_key=scheme.key, scheme=scheme.as_dict(), text=text_record, cells=cells, baseline_kl=baseline,
        wall_s=round(time.perf_counter() - start, 1),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), versions=versions(), hardware=hardware())
    draw_heatmap(result, folder / "sensitivity.png")  # before the JSON: a JSON means a complete folder
    path = sensitivity_file.write(folder, result)
    _summary(result, folder)
    return path


def _check_positions(config: SensitivityConfig, model_config: dict) -> None:
    """A window longer than the model's positions scores positions it never
    serves, and the file would still steer propose and search."""
    length, positions = config.text.window_len, context_length(model_config)
    if positions is not None and length > positions:
        raise UserError(f"text.window_len={length} is longer than the {positions} positions model "
                        f"{config.model.name} covers (its config.json); pass text.window_len={positions} or less")


def _text_record(text_config: TextConfig, text: str) -> dict:
    """The held-out text as the file records it: a rerun on other text remeasures."""
    source = text_config.source if text_config.source == "austen" else str(resolve(text_config.source))
    return {"source": source, "books": list(text_config.books) if source == "austen" else [],
            "num_windows": text_config.num_windows, "window_len": text_config.window_len,
            "scored_tokens": text_config.num_windows * (text_config.window_len - 1),
            "sha256": sha256_bytes(text.encode())}


def _existing(folder: Path, text_record: dict, scheme_record: dict) -> Path | None:
    """The file already measured for this model and scheme on the same text, if any."""
    path = folder / sensitivity_file.FILE
    if not path.is_file():
        return None
    try:
        found = sensitivity_file.read(path)
    except UserError as e:
        log.warning("remeasuring: %s", e)
        return None
    if found.text != text_record or found.scheme != scheme_record:
        log.info("remeasuring: %s was measured on other text or with another scheme", path)
        return None
    return path


def _measure(model_dir: Path, scheme: schemes.WeightScheme,
             wins: list[list[int]]) -> tuple[list[sensitivity_file.Cell], float]:
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = compute_dtype(checkpoint_dtype(model_dir), "auto", device)
    model = load_as_quantized(model_dir).to(device=device, dtype=dtype).eval()
    log.info("computing in %s on %s: %d windows x %d tokens", dtype, device, len(wins), len(wins[0]))
    groups = measure.groups(model, scheme)
    return measure.measure(measure.LayerwiseModel(model, wins), groups, scheme.weights)


def load_as_quantized(model_dir: Path):
    """The model with the Linear modules quantize quantizes: a MoE's fused
    3-D expert weights split into one Linear per expert, else the experts
    would be no cell at all."""
    model = pipeline._load_model(model_dir)
    if moe.is_moe(model.config.to_dict()):
        moe.linearize(model)
    return model


def _summary(result: sensitivity_file.Sensitivity, folder: Path) -> None:
    print(f"sensitivity of {result.model_name} under {result.scheme_key} ({len(result.cells)} cells, "
          f"{result.text['scored_tokens']} scored tokens) in {duration(result.wall_s)}:")
    for name in (sensitivity_file.FILE, "sensitivity.csv", "sensitivity.png"):
        print(f"  {folder / name}")
    print(f"every cell quantized at once: KL {result.baseline_kl:.4g} nats/token")
    print(f"{SHOWN} most sensitive cells (KL, nats/token):")
    for cell in result.ranked()[:SHOWN]:
        print(f"  layer {cell.layer:>3}  {cell.group:<24} {cell.kl:.4g}")
