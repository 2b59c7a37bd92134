#!/usr/bin/env bash
# Fail fast, in one line, when a disk cannot hold an install:
#   bash scripts/check_disk.sh <what for> <GiB> <folder> [<GiB> <folder> ...]
# Each folder is one the install writes that much into (the venv, pip's cache,
# TMPDIR, the model's cache); folders on one file system add up. A pip install
# that runs out of space stops half-way with a long traceback and leaves a
# broken venv; this says so before anything is written.
set -euo pipefail
what=$1; shift
if [ $# -eq 0 ] || [ $(($# % 2)) -ne 0 ]; then
    echo "check_disk: usage: check_disk.sh <what for> <GiB> <folder> [<GiB> <folder> ...]" >&2
    exit 2
fi
declare -A need=() free=() folders=()
mounts=()
while [ $# -gt 0 ]; do
    gib=$1 dir=$2; shift 2
    # A folder not made yet: the disk is the nearest existing ancestor's (df follows a symlink).
    at=$dir
    while [ ! -e "$at" ]; do at=$(dirname "$at"); done
    read -r free_kib mount < <(df -Pk "$at" | awk 'NR == 2 { print $4, $6 }')
    if [ -z "${need[$mount]+set}" ]; then
        mounts+=("$mount"); need[$mount]=0; free[$mount]=$free_kib; folders[$mount]=""
    fi
    need[$mount]=$(awk -v a="${need[$mount]}" -v b="$gib" 'BEGIN { print a + b }')
    folders[$mount]+="${folders[$mount]:+, }$dir $gib GiB"
done
for mount in "${mounts[@]}"; do
    if awk -v n="${need[$mount]}" -v f="${free[$mount]}" 'BEGIN { exit !(f < n * 1024 * 1024) }'; then
        echo "setup: $what needs about ${need[$mount]} GiB free on $mount (${folders[$mount]})" \
             "but it has $(awk -v f="${free[$mount]}" 'BEGIN { printf "%.1f", f / 1024 / 1024 }') GiB;" \
             "free some space (old clones' .venv*/ and .cache/, /tmp/torchinductor_*) and rerun" >&2
        exit 1
    fi
done
