#!/usr/bin/env bash
# Fail fast, in one line, when the disk cannot hold an install:
#   bash scripts/check_disk.sh <GiB needed> <what for> [<dir>, default .]
# A pip install that runs out of space stops half-way with a long traceback and
# leaves a broken venv; this says so before anything is written.
set -euo pipefail
need_gib=$1; what=$2; dir=${3:-.}
# A venv under a folder not made yet: the disk is the nearest existing ancestor's.
while [ ! -e "$dir" ]; do dir=$(dirname "$dir"); done
read -r free_kib mount < <(df -Pk "$dir" | awk 'NR == 2 { print $4, $6 }')
free_gib=$((free_kib / 1024 / 1024))
if [ "$free_gib" -lt "$need_gib" ]; then
    echo "setup: $what needs about $need_gib GiB free but $mount has $free_gib GiB;" \
         "free some space (old clones' .venv*/ and .cache/, /tmp/torchinductor_*) and rerun" >&2
    exit 1
fi
