"""Synthetic sensitivity files over a real model's module names: the proposer
reads them as it reads what `python -m quantize.sensitivity` writes."""
from pathlib import Path

from quantize.common import fingerprint, sensitivity_file
from quantize.common.checkpoint import read_header, weight_files
from quantize.common.sensitivity_file import Cell, Sensitivity

W4_G64_ASYM = {"weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64}}


def linear_weights(model_dir: Path) -> dict[str, list[int]]:
    """Decoder-layer Linear module name -> its weight's shape."""
    out = {}
    for path in weight_files(model_dir):
        header, _ = read_header(path)
        out |= {name.removesuffix(".weight"): t["shape"] for name, t in header.items()
                if name.startswith("model.layers.") and name.endswith("_proj.weight")}
    return out


def cells_with_kl(model_dir: Path, kl_of) -> list[Cell]:
    """One cell per decoder-layer Linear; `kl_of(layer, group)` gives its KL (nats)."""
    cells = []
    for module, shape in linear_weights(model_dir).items():
        layer = int(module.split(".")[2])
        group = module.split(".", 3)[3]
        cells.append(Cell(layer=layer, group=group, modules=[module], kl=float(kl_of(layer, group)),
                          params=shape[0] * shape[1]))
    return cells


def write_sensitivity(results_dir: Path, model_dir: Path, cells: list[Cell], baseline_kl: float | None = None,
                      scheme: dict = W4_G64_ASYM, scheme_key: str = "w4a16-g64-asym",
                      model_name: str | None = None, weights_hash: str | None = None,
                      created: str = "2026-11-27T00:00:00Z") -> Path:
    weights_hash = weights_hash or fingerprint.compute(weight_files(model_dir)).sha256
    name = model_name or Path(model_dir).name
    sensitivity = Sensitivity(model_name=name, model_path=str(model_dir), weights_hash=weights_hash,
                              recipe="w4a16_gptq", scheme_key=scheme_key, scheme=scheme,
                              text={"source": "synthetic"}, cells=cells, baseline_kl=baseline_kl,
                              created=created)
    folder = sensitivity_file.folder_for(results_dir, name, scheme_key, weights_hash)
    return sensitivity_file.write(folder, sensitivity)
