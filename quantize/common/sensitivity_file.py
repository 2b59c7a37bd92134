"""The per-layer sensitivity file: what `python -m quantize.sensitivity` writes
and what the proposer, the recipe search and the report read.

One cell per quantizable Linear module of each decoder layer: the KL divergence
(nats per scored token) of the model with only that module quantized, against
the original, on held-out text. A file is keyed by the model's weights (their
fingerprint) and the scheme, so a stale file never ranks another model's layers.

    <results_dir>/sensitivity/<model name>/<scheme key>-<weights hash>/sensitivity.json (+ .csv, .png)
"""
import csv
import io
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quantize.common import atomic
from quantize.common.errors import UserError

KIND = "quantbench.sensitivity"
VERSION = 1
FILE = "sensitivity.json"
CSV_COLUMNS = ["rank", "layer", "group", "kl", "params", "modules"]
# Every Linear but the output head: the shipped recipes' coverage, which a
# scheme key leaves unsaid; other coverage adds -m<hash> to the key.
USUAL_MODULES = {"targets": ["Linear"], "ignore": ["lm_head"]}
OTHER_MODULES_KEY = re.compile(r"-m[0-9a-f]{6}$")


@dataclass(frozen=True)
class Cell:
    """One module group of one decoder layer, quantized alone."""
    layer: int
    group: str              # the module's name inside its layer, e.g. "self_attn.q_proj"
    modules: list[str]      # full module names, as llm-compressor's `ignore` takes them
    kl: float               # nats per scored token, against the original
    params: int             # weights in the group (for the size a kept-dense group costs)


@dataclass(frozen=True)
class Sensitivity:
    model_name: str
    model_path: str
    weights_hash: str       # quantize.common.fingerprint of the model's weight files
    recipe: str             # the recipe whose scheme was applied
    scheme_key: str         # e.g. "w4a16-g64-asym"
    scheme: dict            # the scheme's weights/activations args, as the recipe gives them
    text: dict              # held-out text: source, books, num_windows, window_len, scored_tokens
    cells: list[Cell]
    baseline_kl: float | None = None   # every group quantized at once (same fake-quant), if measured
    wall_s: float | None = None
    created: str = ""
    versions: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)

    def ranked(self) -> list[Cell]:
        """Most sensitive first (highest KL); ties keep layer order."""
        return sorted(self.cells, key=lambda c: (-c.kl, c.layer, c.group))

    def most_sensitive_modules(self, k: int) -> list[str]:
        """The module names of the k most sensitive cells: what to keep dense."""
        if not 0 <= k <= len(self.cells):
            raise UserError(f"cannot keep {k} groups dense: the sensitivity file has {len(self.cells)}; "
                            f"choose 0..{len(self.cells)}")
        return [m for cell in self.ranked()[:k] for m in cell.modules]

    def kept_dense(self, k: int) -> list[Cell]:
        """The cells to keep dense for k: the k most sensitive, each with the
        other shards of its fused matrix (q/k/v, gate/up, MLA's q_a/kv_a) and,
        for a routed expert, every expert Linear of its MoE block, which vLLM
        loads with a single scheme, so a recipe that keeps only one of them
        dense does not serve. Most sensitive first, each cell once."""
        from quantize.common.recipe_edit import expert_siblings, fused_siblings
        self.most_sensitive_modules(k)   # k in range, or one line saying which k are
        by_name = {(c.layer, c.group): c for c in self.cells}
        kept: dict[tuple[int, str], Cell] = {}
        for cell in self.ranked()[:k]:
            of_layer = [c.group for c in self.cells if c.layer == cell.layer]
            for group in [cell.group, *fused_siblings(cell.group), *expert_siblings(cell.group, of_layer)]:
                if (cell.layer, group) in by_name:
                    kept.setdefault((cell.layer, group), by_name[(cell.layer, group)])
        return list(kept.values())

    def modules(self) -> dict | None:
        """The modules the scheme covered, {"targets", "ignore"} sorted: as the
        file records them; a file that records none covered the usual ones
        unless its key says otherwise; None when that is unknown. A file of a
        recipe with another `ignore` list (a proposed one) has other cells and
        another baseline: it does not stand for a recipe of other coverage."""
        recorded = self.scheme if isinstance(self.scheme, dict) else {}
        if "targets" in recorded or "ignore" in recorded:
            return modules_of(recorded.get("targets") or [], recorded.get("ignore") or [])
        return None if OTHER_MODULES_KEY.search(self.scheme_key) else USUAL_MODULES

    def layers(self) -> list[int]:
        return sorted({c.layer for c in self.cells})

    def groups(self) -> list[str]:
        """Group names in the order they first appear (the layer's own order)."""
        return list(dict.fromkeys(c.group for c in self.cells))


def modules_of(targets, ignore) -> dict:
    """A scheme's coverage as files and keys compare it (order is no matter)."""
    return {"targets": sorted(_as_list(targets)), "ignore": sorted(_as_list(ignore))}


def _as_list(entries) -> list[str]:
    return [entries] if isinstance(entries, str) else [str(e) for e in entries or []]


def folder_for(results_dir: Path, model_name: str, scheme_key: str, weights_hash: str) -> Path:
    return Path(results_dir) / "sensitivity" / model_name / f"{scheme_key}-{weights_hash[:12]}"


def find(results_dir: Path) -> list[Path]:
    """Every sensitivity file under a results store, in a stable order."""
    return sorted((Path(results_dir) / "sensitivity").glob(f"*/*/{FILE}"))


def readable(paths: list[Path]):
    """(path, Sensitivity) of each file; a damaged one is named on stderr and
    passed over, so that it blocks no other model's or scheme's use."""
    for path in paths:
        try:
            yield path, read(path)
        except UserError as e:
            print(f"warning: skipped: {e}", file=sys.stderr)


def write(folder: Path, sensitivity: Sensitivity) -> Path:
    """sensitivity.json and sensitivity.csv, each written atomically; returns the JSON's path."""
    record = {"kind": KIND, "version": VERSION, **asdict(sensitivity)}
    atomic.write_text(folder / "sensitivity.csv", to_csv(sensitivity))
    path = folder / FILE
    atomic.write_json(path, record)
    return path


def to_csv(sensitivity: Sensitivity) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for rank, cell in enumerate(sensitivity.ranked(), 1):
        writer.writerow([rank, cell.layer, cell.group, f"{cell.kl:.6g}", cell.params, " ".join(cell.modules)])
    return out.getvalue()


def read(path: str | Path) -> Sensitivity:
    """A sensitivity file (or the folder holding one) -> Sensitivity; one line if it is not one."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE
    fix = "run `python -m quantize.sensitivity recipe=<name>` to write one"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no sensitivity file at {path}; {fix}") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not a readable sensitivity file ({e}); {fix}") from None
    if not isinstance(record, dict) or record.get("kind") != KIND:
        raise UserError(f"{path} is not a sensitivity file (no kind: {KIND}); {fix}")
    if record.get("version") != VERSION:
        raise UserError(f"{path} has sensitivity file version {record.get('version')}, this quantbench reads "
                        f"{VERSION}; rerun the sensitivity to rewrite it")
    record = {k: v for k, v in record.items() if k not in ("kind", "version")}
    try:
        cells = [Cell(**c) for c in record.pop("cells")]
        found = Sensitivity(cells=cells, **record)
    except (KeyError, TypeError) as e:
        raise UserError(f"{path} is a damaged sensitivity file ({e}); {fix}") from None
    wrong = _mistyped(found)
    if wrong:
        raise UserError(f"{path} is a damaged sensitivity file ({wrong}); {fix}")
    return found


# The fields the readers compute with, and the types they need.
FIELD_TYPES = {"model_name": str, "weights_hash": str, "scheme_key": str, "scheme": dict, "text": dict}
CELL_TYPES = {"layer": int, "group": str, "modules": list, "kl": (int, float), "params": int}


def _mistyped(found: Sensitivity) -> str | None:
    """What in the file is of the wrong type, in words; None when nothing."""
    def wrong(value, kind) -> bool:
        return isinstance(value, bool) or not isinstance(value, kind)
    for name, kind in FIELD_TYPES.items():
        if wrong(getattr(found, name), kind):
            return f"{name} is {getattr(found, name)!r}"
    if found.baseline_kl is not None and wrong(found.baseline_kl, (int, float)):
        return f"baseline_kl is {found.baseline_kl!r}"
    for index, cell in enumerate(found.cells):
        for name, kind in CELL_TYPES.items():
            if wrong(getattr(cell, name), kind):
                return f"cells[{index}].{name} is {getattr(cell, name)!r}"
        if not all(isinstance(m, str) for m in cell.modules):
            return f"cells[{index}].modules holds {cell.modules!r}"
    return None
