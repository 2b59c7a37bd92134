"""The per-point folder: the artifact_dir suffix that keeps apart the points
of a sweep over an input the default folder (<model>/<recipe>) does not name
(docs/sweeps.md)."""
import re
import sys
from pathlib import Path

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


def check_forced_sweep(config_name: str, argv: list[str]) -> None:
    """`-m seed=0,1 force=true` into one folder: each point would replace the
    one before, the last silently winning. Refused before any job, in one
    line naming a folder per point, unless the points' folders all differ.
    Left to Hydra: a command line it will refuse anyway, another sweeper or
    primary config, whose points this cannot list; and --cfg, --info,
    --help, which only print."""
    from hydra._internal.utils import get_args_parser
    args = get_args_parser().parse_args(argv)
    if not args.multirun or not any(o.lstrip("+").startswith("force=") for o in args.overrides) or _prints(args) or (
            args.config_path or args.config_name or args.config_dir
            or any(o.lstrip("+").startswith("hydra/sweeper=") for o in args.overrides)):
        return
    try:
        swept, points = _sweep_points(args.overrides)
        shared = _shared_folder(config_name, points)
        if shared is None:
            return
        names = swept_names(swept)
        fix = FOLDER + suffix(names) if names else None
        if fix is None or _shared_folder(config_name, [p + [f"artifact_dir={fix}"] for p in points]) is not None:
            fix = None
    except Exception:   # a bad override: Hydra's own check says which, in one line (hydra_errors)
        return
    (folder, first, second) = shared
    each = f"a folder per point, e.g. artifact_dir='{fix}'" if fix else "each point an artifact_dir of its own"
    print(f"error: with force=true, the sweep's points {first} and {second} share {folder}, so each would "
          f"replace the one before it; give {each}, or drop force=true", file=sys.stderr)
    raise SystemExit(2)


def _prints(args) -> bool:
    """Hydra only prints for this command line: a config, its info, help."""
    return bool(args.cfg or args.info or args.help or args.hydra_help or args.shell_completion)


def _sweep_points(overrides: list[str]) -> tuple[list[str], list[list[str]]]:
    """(the keys the sweep varies, each point's overrides), as Hydra's basic sweeper lists them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parsed = OverridesParser.create().parse_overrides(overrides)
    [points] = BasicSweeper.split_arguments(parsed, None)
    return [o.key_or_group for o in parsed if o.is_sweep_override()], points


def _shared_folder(config_name: str, points: list[list[str]]) -> tuple[Path, str, str] | None:
    """(a folder, two points that write it) where two points one of which
    forces write one artifact_dir; None where none does."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from quantize.common.paths import CONF_DIR, resolve
    seen: dict[Path, list[str]] = {}
    composed: dict[tuple[str, ...], object] = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        # The points differ in swept keys only: one search path (hydra.searchpath) for all.
        _, repo = GlobalHydra.instance().config_loader()._parse_overrides_and_create_caching_repo(
            config_name, points[0])
        for point in points:
            config = _point_config(config_name, point, repo, composed)
            folder = resolve(OmegaConf.select(config, "artifact_dir")).resolve()
            if folder in seen and (config.get("force") or seen[folder][1]):
                return folder, _shown(seen[folder][0], points), _shown(point, points)
            seen.setdefault(folder, [point, bool(config.get("force"))])
    return None


def _point_config(config_name: str, point: list[str], repo, composed: dict):
    """`point`'s config, as Hydra composes it: its config groups' choices
    composed once for all the points that share them (composing costs a
    tenth of a second or more), its values set on a copy as Hydra sets them."""
    import copy

    from hydra import compose
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.defaults_list import Overrides
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parsed = OverridesParser.create().parse_overrides(point)
    values = [o for o in Overrides(repo, parsed).config_overrides if not o.is_hydra_override()]
    groups = tuple(o.input_line for o in parsed if all(o is not v for v in values))
    if groups not in composed:
        composed[groups] = compose(config_name, overrides=list(groups))
    config = copy.deepcopy(composed[groups])
    ConfigLoaderImpl._apply_overrides_to_config(values, config)
    return config


def _shown(point: list[str], points: list[list[str]]) -> str:
    """The point as the overrides that set it apart from the others."""
    varying = [o for o in point if any(o not in other for other in points)]
    return "(" + " ".join(varying or point) + ")"
