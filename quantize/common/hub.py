"""`model=org/name`: a Hugging Face hub repo, downloaded where the hub is
reachable, safetensors weights only.

A value is a hub id when no local path of that name exists and it has the
hub's `owner/name` form. The download takes the configs and tokenizer files
first, then exactly the weight files the checkpoint's safetensors index names
(or `model.safetensors`), at the same commit: never `*.bin`/`*.pt` pickles,
GGUF copies, or a second consolidated copy of the weights, and never `*.py`
(quantbench never runs code from a model folder: hf_load). Files land in the
Hugging Face cache (HF_HOME), so a model downloaded once also loads offline.
`model.revision` (a branch, tag or commit) picks the commit; unset, main's.
The snapshot folder is named by the commit it holds, which the manifest records."""
import json
import re
import shlex
from pathlib import Path

from quantize.common.errors import UserError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Everything a checkpoint needs besides its weights: config, generation config,
# safetensors index, tokenizer (json, sentencepiece, tiktoken, BPE merges),
# chat template.
META_PATTERNS = ["*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def is_repo_id(value: str) -> bool:
    """`owner/name` that is not a path on this machine."""
    value = str(value)
    return bool(REPO_ID.match(value)) and ".." not in value and not Path(value).expanduser().exists()


def local_dir(path: str, revision: str | None = None) -> Path:
    """model.path's folder on this machine: a hub id's snapshot at `revision`
    (downloaded where needed), else the folder itself."""
    from quantize.common.paths import resolve
    return download(path, revision) if is_repo_id(path) else resolve(path)


def check_revision(path: str, revision) -> str | None:
    """`model.revision` as given (None: main), once it can pick a commit of `path`:
    a local folder has no revisions, and an empty or non-text one names none."""
    if revision is None:
        return None
    if isinstance(revision, (int, float)) and not isinstance(revision, bool):
        # typed bare: 1.10 reads 1.1, 1_000 reads 1000, 1234e56 (a commit) reads 1.234e+59; what was
        # typed is lost, so the hint cannot show it (a bare 2024 reads back the same, but is refused alike)
        raise UserError(f"model.revision: Hydra read it as a number ({revision}); quote it as you typed it: "
                        "model.revision='\"<as typed>\"'")
    if not isinstance(revision, str) or not revision.strip() or any(c.isspace() for c in revision):
        raise UserError(f"model.revision={revision!r} is not a revision; pass a branch, tag or commit "
                        "of the hub repo, e.g. model.revision=main")
    if not is_repo_id(path):
        raise UserError(f"model.revision={revision}: model {path} is a local folder, which has no revisions; "
                        "drop model.revision, or pass model=<hub owner/name>")
    return revision


def revision_arg(revision: str) -> str:
    """`model.revision=<revision>` for a printed command, shell-quoted: bare
    where Hydra reads it back as that text, else in Hydra's quotes (a bare
    1.0 is a number, which check_revision refuses)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    plain = f"model.revision={revision}"
    try:
        if OverridesParser.create().parse_override(plain).value() == revision:
            return shlex.quote(plain)
    except HydraException:
        pass
    quoted = '"' + revision.replace('"', '\\"') + '"'
    return f"model.revision='{quoted}'" if "'" not in quoted else shlex.quote(f"model.revision={quoted}")


def folder_name(name: str, revision: str | None) -> str:
    """The model's name as its artifacts' folder: `name@revision` for a
    revision given, '/' in a branch as '%2F' (and '%' as '%25': feat/x and
    feat-x, or feat%2Fx, are three folders); the name alone for main, as
    before revisions could be chosen."""
    return name if revision is None else f"{name}@{str(revision).replace('%', '%25').replace('/', '%2F')}"


def check_built_revision(revision: str | None, built: dict, commit: str | None, where: Path) -> None:
    """An artifact in `where` asked for at `revision` was built from it: the
    revision its quantize was given (`built`: the manifest's config.model),
    or, for a commit asked for, the commit its snapshot held. A branch's
    current commit is not compared: it may have moved since (offline, it
    cannot be known). Nothing recorded (a local folder, an older manifest):
    nothing to compare."""
    given = built.get("revision")
    if revision is None or given is None or str(given) == revision:
        return
    if commit and re.fullmatch(r"[0-9a-f]{7,40}", revision.lower()) and commit.startswith(revision.lower()):
        return
    raise UserError(f"model.revision={revision}: the artifact in {where} was built from model.revision={given} "
                    f"(commit {commit or 'unrecorded'}); rebuild it with `python -m quantize ... "
                    f"{revision_arg(revision)} force=true`, or evaluate it as {revision_arg(str(given))}")


def download(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot dir of `repo_id` at `revision` (None: main),
    downloaded or from the cache; a one-line UserError when the hub cannot
    be reached or has no such repo or revision."""
    try:
        meta = Path(_snapshot(repo_id, revision, META_PATTERNS))
        missing = [name for name in weight_names(meta) if not (meta / name).is_file()]
        if missing:  # cached ones are not asked for again: that would need the hub even when all is here
            _snapshot(repo_id, meta.name, missing)  # the same commit, even if the repo changed meanwhile
            if any(not (meta / name).is_file() for name in missing):   # read from a cache that lacks them
                from huggingface_hub.errors import LocalEntryNotFoundError
                raise LocalEntryNotFoundError(f"{', '.join(missing)} not in the cache")
        return meta
    except Exception as e:
        raise UserError(_explain(repo_id, e, revision)) from None


def commit(model_dir: Path) -> str | None:
    """The commit a hub snapshot folder holds (its name, in the cache's
    <repo>/snapshots/<commit> layout); None for any other folder."""
    model_dir = Path(model_dir)
    return model_dir.name if model_dir.parent.name == "snapshots" and \
        model_dir.parent.parent.name.startswith("models--") else None


def weight_names(snapshot: Path) -> list[str]:
    """The safetensors files the checkpoint's index lists, else the single file."""
    index = snapshot / INDEX
    if index.is_file():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return [SINGLE_FILE]


def cached_snapshot(repo_id: str) -> Path | None:
    """The snapshot folder (named by its commit) the id's main branch points
    to in this host's Hugging Face cache, which an offline load reads; None
    where the cache lacks it or cannot be read."""
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:
        return None


def main_commit(repo_id: str) -> str | None:
    """The commit the hub's main branch of `repo_id` is at now, which a
    download (download) takes; None where the hub is offline, cannot be
    reached or refuses (its download then reads the cache, or says why)."""
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE:
        return None
    try:
        return _hub_commit(repo_id, None)
    except Exception:
        return None


def _hub_commit(repo_id: str, revision: str | None) -> str:
    """The commit `revision` (None: main) of `repo_id` is at on the hub, asked
    within HF_HUB_ETAG_TIMEOUT (10 s unless set), as the hub's own metadata
    requests are: snapshot_download asks without a limit, so a hub that takes
    the connection but never answers held it forever (httpx.TimeoutException
    here: unreachable)."""
    from huggingface_hub import HfApi, constants
    return HfApi().repo_info(repo_id, revision=revision, timeout=constants.HF_HUB_ETAG_TIMEOUT).sha


def _snapshot(repo_id: str, revision: str | None, patterns: list[str]) -> str:
    """The snapshot folder at `revision`: downloaded, or the cache's where the
    hub is offline, unreachable or answers an error (an outage, a refused
    token). The cache is asked directly then: given a full commit,
    snapshot_download lists the hub's files unless the cache holds that
    commit's file list (trees/), which caches filled file by file, by older
    hub versions or copied from another host lack. A hub that does not answer
    within HF_HUB_ETAG_TIMEOUT counts as unreachable (_hub_commit)."""
    import httpx
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RevisionNotFoundError
    if not constants.HF_HUB_OFFLINE:
        try:
            _hub_commit(repo_id, revision)   # bounded: answered, the hub is there for the download's own requests
            return snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
        except (httpx.ConnectError, httpx.TimeoutException, OfflineModeIsEnabled):
            pass   # unreachable: the cache decides, as for a branch (snapshot_download's own fallback)
        except RevisionNotFoundError as answered:
            if not (revision and re.fullmatch(r"[0-9a-f]{40}", revision)):
                raise
            # a commit squashed or force-pushed away on the hub never changed: a cached copy serves,
            # unless it lacks a file asked for by name (no download can bring it now)
            folder = _cached_or_refusal(repo_id, revision, patterns, answered)
            if any(not Path(folder, p).is_file() for p in patterns if not any(c in p for c in "*?[")):
                raise answered from None
            return folder
        except HfHubHTTPError as answered:   # as snapshot_download does for a branch
            return _cached_or_refusal(repo_id, revision, patterns, answered)
    return snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True)


def _cached_or_refusal(repo_id: str, revision: str | None, patterns: list[str], answered: Exception) -> str:
    """The cache's snapshot once the hub answered an error; where the cache
    lacks it, a refusal of the repo (not found, gated, 401) or of the revision
    is the hub's answer, as it names the fix (a login), else the cache's miss."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=True)
    except LocalEntryNotFoundError:
        status = getattr(getattr(answered, "response", None), "status_code", None)
        if isinstance(answered, (RepositoryNotFoundError, RevisionNotFoundError)) or status == 401:
            raise answered from None
        raise


def _explain(repo_id: str, e: Exception, revision: str | None = None) -> str:
    from huggingface_hub import constants, errors
    local = f"no local dir {repo_id} exists"
    if isinstance(e, errors.RevisionNotFoundError):
        return (f"model {repo_id}: the Hugging Face hub repo has no revision {revision}; pass a branch, tag "
                "or commit it has as model.revision, or drop model.revision for main")
    if isinstance(e, errors.RepositoryNotFoundError):  # also gated and private repos
        return (f"model {repo_id}: {local} and the Hugging Face hub has no repo {repo_id} you may read; "
                "check the name, or `hf auth login` for a gated or private repo")
    if isinstance(e, errors.LocalEntryNotFoundError):
        why = ("the hub is offline here (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE
               else "the Hugging Face hub cannot be reached")
        at = f" at revision {revision}" if revision else ""
        return (f"model {repo_id}: {local}, it is not in the Hugging Face cache{at}, and {why}; download it where "
                f"the hub is reachable (hf download {repo_id}{f' --revision {revision}' if revision else ''} "
                f"--include '*.safetensors' '*.json' "
                f"'tokenizer*' --local-dir DIR) and pass model=DIR{' without model.revision (DIR holds that revision)' if revision else ''}")
    said = " ".join(str(e).split())[:200]
    return (f"model {repo_id}: download from the Hugging Face hub failed ({type(e).__name__}: {said}); "
            "pass model=<local checkpoint dir>")
