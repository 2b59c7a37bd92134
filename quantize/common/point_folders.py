"""The per-point folder: the artifact_dir suffix that keeps apart the points
of a sweep over an input the default folder (<model>/<recipe>) does not name
(docs/sweeps.md)."""
import re

FOLDER = "${artifacts_dir}/${model.name}/${recipe.name}"
# Each input a folder name can hold, by its config key, as the suffix naming
# it, in the order a suffix names them. Other calibration settings (books,
# path, dataset, …) are lists or paths: another preset's or file's come with
# its name, and alone they leave no suffix.
DIR_SUFFIX = {"seed": "-seed${seed}", "calibration_dtype": "-${calibration_dtype}",
              "calibration.name": "-${calibration.name}", "calibration.num_samples": "-n${calibration.num_samples}",
              "calibration.max_seq_len": "-len${calibration.max_seq_len}",
              "calibration.text_field": "-${calibration.text_field}"}
# A calibration file or preset swept by its path or group: its name tells them apart.
NAMED_BY = {"calibration": "calibration.name", "calibration.path": "calibration.name"}


def suffix(keys) -> str:
    """The suffix naming each of `keys` (keys of DIR_SUFFIX)."""
    return "".join(part for key, part in DIR_SUFFIX.items() if key in keys)


def swept_names(swept) -> set[str] | None:
    """The DIR_SUFFIX keys that name the inputs a sweep varies (`swept`: its
    override keys); None where it varies a calibration setting no folder name
    holds. Other keys leave the artifact's inputs as they are, or (model,
    recipe) are in the folder already."""
    names = set()
    for key in swept:
        key = NAMED_BY.get(key, key)
        if key in DIR_SUFFIX:
            names.add(key)
        elif key.startswith("calibration."):
            return None
    return names


def is_field_name(value) -> bool:
    """`value` is one record field a folder name can hold."""
    return isinstance(value, str) and re.fullmatch(r"[\w.-]+", value) is not None
