"""`model.revision`: a hub id's branch, tag or commit, taken by the download,
recorded in the manifest, naming the artifact's folder; refused for a local
folder; the search's trials kept at the study's commit."""
import json
import os
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import last_line
from tests.quantize.common.test_big_models import FakeHub, one_line_error, quantize_offline
from quantize.common import hub
from quantize.config import ModelChoice


def hub_cache(root: Path, model: Path, refs: dict[str, str]) -> Path:
    """A Hugging Face cache under `root` holding some-org/tiny at each commit
    `refs` points to (name -> commit), as a download leaves it."""
    repo = root / "hub" / "models--some-org--tiny"
    for name, commit in refs.items():
        if not (repo / "snapshots" / commit).exists():
            shutil.copytree(model, repo / "snapshots" / commit)
        (repo / "refs" / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / name).write_text(commit)
    return repo


def test_a_revision_is_the_commit_quantized_recorded_and_its_own_folder(tiny_model, tmp_path, workdir):
    """model.revision did not exist: a hub id was always its main, so a repo
    changed during a sweep (or a rerun later) quantized another model under
    the same folder, and the manifest did not say which commit it was."""
    main, tagged = "a" * 40, "b" * 40
    repo = hub_cache(tmp_path / "hf", tiny_model, {"main": main, "v1": tagged})
    arts = tmp_path / "artifacts"
    proc = quantize_offline("recipe=original", "model=some-org/tiny", "model.revision=v1",
                            f"artifacts_dir={arts}", hf_home=tmp_path / "hf", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = json.loads((arts / "tiny@v1" / "original" / "manifest.json").read_text())
    assert recorded["model"]["path"] == str(repo / "snapshots" / tagged)
    assert recorded["model"]["revision"] == tagged            # the commit the tag resolved to
    assert recorded["config"]["model"]["revision"] == "v1"   # as asked
    proc = quantize_offline("recipe=original", "model=some-org/tiny", f"artifacts_dir={arts}",
                            hf_home=tmp_path / "hf", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = json.loads((arts / "tiny" / "original" / "manifest.json").read_text())   # main: the folder as before
    assert recorded["model"]["revision"] == main


def test_a_revision_for_a_local_folder_is_one_line(tiny_model, tmp_path, workdir):
    arts = tmp_path / "artifacts"
    proc = quantize_offline("recipe=original", f"model={tiny_model}", "model.revision=v1",
                            f"artifacts_dir={arts}", hf_home=tmp_path / "hf", cwd=workdir)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    line = last_line(proc.stderr)
    assert line.startswith("error: model.revision=v1:") and "local folder" in line and "drop model.revision" in line
    assert not arts.exists()


@pytest.mark.parametrize("revision", ["", " ", "a b", True, ["v1"]])
def test_a_revision_that_names_none_is_one_line(revision):
    message = one_line_error(lambda: ModelChoice.from_config({"name": "tiny", "path": "some-org/tiny",
                                                              "revision": revision}))
    assert message.startswith("model.revision=") and "not a revision" in message


def test_the_download_takes_the_revision_for_every_file(tmp_path, monkeypatch):
    fake = FakeHub(tmp_path)
    monkeypatch.setattr(hub, "_snapshot", fake)
    assert hub.local_dir("org/name", "v1") == fake.snapshot
    (_, first, _), (_, weights, _) = fake.calls
    assert first == "v1" and weights == "0123abcd"   # the weights at the commit v1 resolved to


def test_a_revision_the_repo_lacks_is_one_line(monkeypatch):
    import httpx
    from huggingface_hub.errors import RevisionNotFoundError
    url = "https://huggingface.co/api/models/org/name/revision/v9"

    def missing(*_):
        raise RevisionNotFoundError("404 Client Error: Revision Not Found",
                                    response=httpx.Response(404, request=httpx.Request("GET", url)))
    monkeypatch.setattr(hub, "_snapshot", missing)
    message = one_line_error(lambda: hub.download("org/name", "v9"))
    assert "has no revision v9" in message and "model.revision" in message


def test_evaluate_refuses_a_revision_for_a_local_folder(tmp_path):
    from evaluate.config import target_config
    from quantize.common.errors import UserError
    cfg = OmegaConf.create({"model": {"name": "m", "path": str(tmp_path), "revision": "v1"}, "recipe": None,
                            "artifacts_dir": "artifacts"})
    with pytest.raises(UserError, match=r"model.revision=v1: model .* is a local folder"):
        target_config(cfg)
    cfg.model.path = "some-org/tiny"
    assert target_config(cfg).model_path == "some-org/tiny"


def test_a_hub_studys_trials_stay_at_the_commit_it_resolved(tmp_path, monkeypatch):
    """Each trial's quantize downloaded the main branch of its own time: a
    repo changed mid-study mixed two models' trials in one front."""
    from huggingface_hub import constants
    from evaluate.search.sweeper import REVISION_KEY, _identity, _pinned
    from tests.evaluate.search.test_sweeper import cache_snapshot
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "main_commit", lambda repo_id: None)   # offline: the cache decides
    cache_snapshot(tmp_path / "hub", "org/tiny", "a" * 40, 1.0)
    identity = _identity({"model.path": "org/tiny", "seed": 0})
    assert _pinned(identity, "tiny") == (f"++model.revision={'a' * 40}", "++model.name=tiny")
    assert _pinned(_identity({"model.path": str(tmp_path / "nothing"), "seed": 0}), "x") == ()   # a local folder

    def download(repo_id, revision, patterns):   # the hub's v1 tag: commit c, other weights
        cache_snapshot(tmp_path / "hub", repo_id, "c" * 40, 2.0)
        return str(tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("c" * 40))
    monkeypatch.setattr(hub, "_snapshot", download)
    tagged = _identity({"model.path": "org/tiny", "seed": 0}, revision="v1")
    assert tagged[REVISION_KEY] == "c" * 40 and tagged["model weights"] != identity["model weights"]


def test_a_trials_quantize_takes_the_pinned_revision():
    from evaluate.search.config import SearchConfig
    from evaluate.search.trial import quantize_command
    config = SearchConfig.__new__(SearchConfig)
    values = {"model_path": "org/tiny", "model_name": "tiny", "model_revision": "a" * 40, "seed": 0,
              "quantize_overrides": []}
    for key, value in values.items():
        object.__setattr__(config, key, value)
    command = quantize_command(config, Path("/r.yaml"), Path("/a"))
    assert f"model.revision={'a' * 40}" in command and "model.name=tiny" in command


@pytest.mark.parametrize("hub_state", ["offline", "unreachable"])
def test_a_cached_commit_is_found_without_the_hub(tiny_model, tmp_path, monkeypatch, hub_state):
    """Given a full commit, snapshot_download lists the hub's files unless the
    cache holds that commit's list (trees/), which a cache filled file by
    file or copied lacks: every trial of an offline search (pinned to its
    commit) failed, where asking for main had read the cache."""
    from huggingface_hub import constants
    hub_cache(tmp_path / "hf", tiny_model, {"main": "a" * 40, "v1": "b" * 40})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    if hub_state == "offline":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    else:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)   # whatever an earlier job of this process left
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")   # nothing listens there
    for revision, commit in [("a" * 40, "a" * 40), ("b" * 40, "b" * 40), ("v1", "b" * 40), (None, "a" * 40)]:
        assert hub.download("some-org/tiny", revision).name == commit
    message = one_line_error(lambda: hub.download("some-org/tiny", "c" * 40))
    assert "not in the Hugging Face cache at revision " + "c" * 40 in message


@pytest.fixture
def hub_answering(monkeypatch):
    """The hub at a local stub that answers every request with `status`
    (an outage, a refused token), as HF_ENDPOINT points it there."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from huggingface_hub import constants
    servers = []

    def start(status: int):
        class Answer(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(status)
                if status == 401:   # the hub's answer for a private or gated repo without a token
                    self.send_header("X-Error-Code", "RepoNotFound")
                if status == 404:   # the hub's answer for a revision it does not have
                    self.send_header("X-Error-Code", "RevisionNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
            do_HEAD = do_GET

            def log_message(self, *_):
                pass
        server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)   # whatever an earlier job of this process left
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [503, 500, 401])
def test_a_cached_commit_is_found_when_the_hub_answers_an_error(tiny_model, tmp_path, monkeypatch, hub_answering,
                                                                status):
    """The cache was read only when the hub could not be reached: one that
    answered an error (an outage's 503, a refused token's 401) was read for
    a branch (snapshot_download's own fallback) but not for a full commit,
    so a search's trials, pinned to its commit, all failed while its start
    had read the cache."""
    from huggingface_hub import constants
    hub_cache(tmp_path / "hf", tiny_model, {"main": "a" * 40})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    hub_answering(status)
    for revision in ["a" * 40, None]:
        assert hub.download("some-org/tiny", revision).name == "a" * 40
    message = one_line_error(lambda: hub.download("some-org/tiny", "c" * 40))
    if status == 401:   # the cache lacks it: the hub's refusal names the fix
        assert "hf auth login" in message
    else:
        assert "not in the Hugging Face cache at revision " + "c" * 40 in message


def test_a_cached_commit_the_hub_no_longer_has_is_read_from_the_cache(tiny_model, tmp_path, monkeypatch,
                                                                      hub_answering):
    """A commit squashed or force-pushed away on the hub never changes: its
    complete cached copy is read, while a tag the hub lacks is refused."""
    from huggingface_hub import constants
    hub_cache(tmp_path / "hf", tiny_model, {"main": "a" * 40})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    hub_answering(404)
    assert hub.download("some-org/tiny", "a" * 40).name == "a" * 40
    for missing in ("v9", "c" * 40):
        assert f"has no revision {missing}" in one_line_error(lambda: hub.download("some-org/tiny", missing))
    hub_cache(tmp_path / "hf", tiny_model, {"v2": "d" * 40})
    (tmp_path / "hf" / "hub" / "models--some-org--tiny" / "snapshots" / ("d" * 40) / "model.safetensors").unlink()
    message = one_line_error(lambda: hub.download("some-org/tiny", "d" * 40))   # its weights are nowhere now
    assert f"has no revision {'d' * 40}" in message, message


def test_a_trials_quantize_at_a_cached_commit_runs_offline(tiny_model, tmp_path, workdir):
    arts = tmp_path / "artifacts"
    hub_cache(tmp_path / "hf", tiny_model, {"main": "a" * 40})
    proc = quantize_offline("recipe=original", "model=some-org/tiny", f"model.revision={'a' * 40}",
                            "model.name=tiny", f"artifacts_dir={arts}", hf_home=tmp_path / "hf", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((arts / "tiny" / "original" / "manifest.json").read_text())["model"]["revision"] == "a" * 40


def test_a_revision_the_cache_lacks_offline_says_to_drop_it_with_the_folder(tmp_path, monkeypatch):
    """The hint ended `--local-dir DIR) and pass model=DIR`: kept with
    model.revision, that folder was refused (a local folder has no revisions)."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    message = one_line_error(lambda: hub.download("some-org/tiny", "v2"))
    assert "--revision v2" in message and message.endswith("pass model=DIR without model.revision (DIR holds that revision)")
    with pytest.raises(Exception, match="drop model.revision"):   # what keeping it would have met
        hub.check_revision(str(tmp_path), "v2")
    assert one_line_error(lambda: hub.download("some-org/tiny")).endswith("pass model=DIR")   # main: nothing to drop


@pytest.mark.parametrize("typed", ["1.0", "1.10", "2e5", "1234e56", "1_000", "2024_01", "2024"])
def test_a_numeric_tag_says_to_quote_it(typed):
    """`model.revision=1.0` reached the check as the float Hydra parsed, and
    was refused as 'not a revision' without saying why or how to pass it;
    then the hint quoted the float's text (1.10 as "1.1", the short commit
    1234e56 as "1.234e+59": other revisions), and an int passed as its text
    (the tag 2024_01 as 202401)."""
    import shlex
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parse = OverridesParser.create().parse_override
    value = parse(f"model.revision={typed}").value()
    message = one_line_error(lambda: ModelChoice.from_config({"name": "tiny", "path": "some-org/tiny",
                                                              "revision": value}))
    assert f"Hydra read it as a number ({value}); quote it" in message
    hint = message.rpartition("quote it as you typed it: ")[2]
    assert hint == """model.revision='"<as typed>"'"""   # no other revision's text
    [passed] = shlex.split(hint.replace("<as typed>", typed))   # what the shell passes on
    assert hub.check_revision("some-org/tiny", parse(passed).value()) == typed


def test_a_searchs_numeric_tag_is_refused_at_start():
    """The sweeper took str() of the float: model.revision=1.10 resolved tag 1.1."""
    from evaluate.search.sweeper import SearchSettings
    from quantize.common.errors import UserError
    cfg = OmegaConf.create({"model": {"name": "tiny", "path": "some-org/tiny", "revision": 1.1}})
    with pytest.raises(UserError, match="Hydra read it as a number"):
        SearchSettings.from_cfg(cfg)
    cfg.model.revision = "1.10"
    assert SearchSettings.from_cfg(cfg).revision == "1.10"


def _trial_config(revision):
    from evaluate.search.config import SearchConfig
    config = SearchConfig.__new__(SearchConfig)
    for key, value in {"model_path": "org/tiny", "model_name": "tiny", "model_revision": revision, "seed": 0,
                       "quantize_overrides": []}.items():
        object.__setattr__(config, key, value)
    return config


def test_a_resumed_study_reuses_artifacts_built_before_trials_were_pinned():
    """Trials' commands now carry model.revision=<commit>, which the manifests
    of artifacts built before lack: a resumed study quantized each again."""
    from types import SimpleNamespace
    from evaluate.search.trial import built_by, quantize_command
    snapshots = "/hf/hub/models--org--tiny/snapshots"

    def manifest(command, path, revision=None):
        return SimpleNamespace(command="python -m quantize " + " ".join(command[3:]),
                               model=SimpleNamespace(path=path, revision=revision))
    before = quantize_command(_trial_config(None), Path("/r/w4.yaml"), Path("/a/tiny/w4"))
    pinned, other = "a" * 40, "b" * 40
    now = quantize_command(_trial_config(pinned), Path("/r/w4.yaml"), Path("/a/tiny/w4"))
    assert built_by(manifest(before, f"{snapshots}/{pinned}"), now, pinned)             # the commit it read
    assert built_by(manifest(before, f"{snapshots}/{pinned}", pinned), now, pinned)
    assert built_by(manifest(now, f"{snapshots}/{pinned}", pinned), now, pinned)
    assert not built_by(manifest(before, f"{snapshots}/{other}"), now, pinned)          # other weights
    assert not built_by(manifest(before, f"{snapshots}/{other}", other), now, pinned)
    assert not built_by(manifest(before, "/models/tiny"), now, pinned)                  # no commit to compare
    changed = quantize_command(_trial_config(pinned), Path("/r/w8.yaml"), Path("/a/tiny/w4"))
    assert not built_by(manifest(before, f"{snapshots}/{pinned}"), changed, pinned)     # another recipe
    assert built_by(manifest(before, "/models/tiny"), before, None)                     # unpinned: as before


def test_a_resumed_trial_does_not_quantize_an_artifact_built_before_pinning(tmp_path, monkeypatch):
    from types import SimpleNamespace
    from evaluate.search import trial
    config = _trial_config("a" * 40)
    for key, value in {"trial": SimpleNamespace(scheme="w4a16", keep_dense=()), "results_dir": tmp_path, "study": "s", "sensitivity": "none",
                       "artifacts_dir": tmp_path / "artifacts",
                       "space": SimpleNamespace(recipe=lambda *_: ("w4", "recipe text"))}.items():
        object.__setattr__(config, key, value)
    monkeypatch.setattr(trial.kept_dense, "kept", lambda *_: None)
    monkeypatch.setattr(trial.kept_dense, "linear_widths", lambda *_: None)
    recipe = (tmp_path / "search" / "s" / "recipes" / "w4.yaml").resolve()
    before = trial.quantize_command(_trial_config(None), recipe, (tmp_path / "artifacts" / "tiny" / "w4").resolve())
    built = SimpleNamespace(command="python -m quantize " + " ".join(before[3:]), artifact_id="x",
                            model=SimpleNamespace(path=f"/hf/models--org--tiny/snapshots/{'a' * 40}", revision=None))
    monkeypatch.setattr(trial.manifest, "read", lambda _: built)
    ran = []
    monkeypatch.setattr(trial, "_run_stage", lambda *args: ran.append(args))
    monkeypatch.setattr(trial, "check_servable", lambda *_: None)
    assert trial.build(config, 0, {}).manifest is built and ran == []


def test_two_revisions_never_share_a_folder():
    """'/' became '-': feat/x and feat-x both built into and read from tiny@feat-x."""
    from quantize.common import resolvers
    from evaluate.config import target_config
    from evaluate.target import artifact_dir
    resolvers.register_resolvers()
    folders = set()
    for revision in ["feat/x", "feat-x", "feat%2Fx", "feat%x", "refs/pr/1"]:
        cfg = OmegaConf.create({"model": {"name": "${model_name:${.path},${.revision}}", "path": "some-org/tiny",
                                          "revision": revision},
                                "recipe": {"name": "w4a16_rtn", "path": "x"}, "artifacts_dir": "artifacts"})
        folders.add(artifact_dir(target_config(cfg)).parent.name)
    assert folders == {"tiny@feat%2Fx", "tiny@feat-x", "tiny@feat%252Fx", "tiny@feat%25x", "tiny@refs%2Fpr%2F1"}


def test_evaluate_refuses_an_artifact_built_from_another_revision(tiny_model, tmp_path, workdir):
    """evaluate never compared the revision asked for with the artifact's:
    a folder another revision built into was measured as this one."""
    from evaluate.config import target_config
    from quantize.common.errors import UserError
    hub_cache(tmp_path / "hf", tiny_model, {"main": "a" * 40, "feat/x": "c" * 40, "feat-x": "d" * 40})
    arts = tmp_path / "artifacts"
    proc = quantize_offline("recipe=original", "model=some-org/tiny", "model.revision=feat/x",
                            "model.name=tiny@feat-x", f"artifacts_dir={arts}", hf_home=tmp_path / "hf", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]

    def target(revision):
        return target_config(OmegaConf.create({"model": {"name": "tiny@feat-x", "path": "some-org/tiny",
                                                          "revision": revision},
                                               "recipe": {"name": "original", "path": None},
                                               "artifacts_dir": str(arts)}))
    with pytest.raises(UserError, match=r"model.revision=feat-x: the artifact in .*tiny@feat-x/original was built "
                                        r"from model.revision=feat/x \(commit c{40}\); rebuild it"):
        target("feat-x")
    with pytest.raises(UserError, match=r"built from model.revision=feat/x"):
        target("d" * 12)
    assert target("feat/x").model_name == target("c" * 12).model_name == target("c" * 40).model_name == "tiny@feat-x"


def _cli_revision(words: list[str]):
    """model.revision as the real CLI composes it from these words (--cfg job)."""
    import subprocess
    import sys
    import yaml
    proc = subprocess.run([sys.executable, "-m", "quantize.sensitivity", "recipe=w4a16_rtn", *words, "--cfg", "job"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return yaml.safe_load(proc.stdout)["model"]["revision"]


@pytest.mark.parametrize("revision", ["1.10", "2024", "feat/x", "a,b"])
def test_a_printed_commands_revision_composes_back_as_given(revision):
    """propose printed model.revision=1.10 for the tag 1.10 (shlex adds no
    quotes), which Hydra reads as the number 1.1: its next command was
    refused; so was the rebuild evaluate suggests for an artifact of another
    revision."""
    import re
    import shlex
    from types import SimpleNamespace
    from quantize.common.errors import UserError
    from quantize.propose.run import _model_arg
    config = SimpleNamespace(model=SimpleNamespace(path="some-org/tiny", revision=revision,
                                                   name=hub.folder_name("tiny", revision)))
    words = shlex.split(_model_arg(config))
    assert words[0] == "model=some-org/tiny" and len(words) == 2
    assert _cli_revision(words) == revision
    with pytest.raises(UserError) as refused:
        hub.check_built_revision(revision, {"revision": "v1"}, None, Path("/a/tiny"))
    rebuild = re.search(r"`python -m quantize \.\.\. (.*) force=true`", str(refused.value))[1]
    assert _cli_revision(["model=some-org/tiny", *shlex.split(rebuild)]) == revision
    with pytest.raises(UserError) as refused:   # built from this revision, asked for another
        hub.check_built_revision("v1", {"revision": revision}, None, Path("/a/tiny"))
    evaluate_as = str(refused.value).rpartition("evaluate it as ")[2]
    assert _cli_revision(["model=some-org/tiny", *shlex.split(evaluate_as)]) == revision
