#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for trying the cluster path
# (hydra/launcher=slurm_local) on a workstation and for the tests.
#
#   bash scripts/slurm_local.sh install   # apt-get slurm-wlm slurmdbd mariadb-server (root, once)
#   eval "$(bash scripts/slurm_local.sh start)"   # start (idempotent); prints `export SLURM_CONF=...`
#   bash scripts/slurm_local.sh status    # exit 0 when every daemon runs and the node is up
#   bash scripts/slurm_local.sh stop      # scancel every job, then stop the daemons it started
#
# Everything (configs, PIDs, state, spool, database, logs) lives under one
# directory, $QB_SLURM_DIR (default .cache/slurm/). Daemons run in the
# foreground under setsid (no systemd, no cgroups) and only stop by the PIDs
# recorded there. MariaDB, slurmdbd, slurmctld and slurmd all talk over
# 127.0.0.1; MariaDB listens on 127.0.0.1 only. Without accounting (MariaDB +
# slurmdbd) a cancelled or timed-out job stays UNKNOWN to submitit and a sweep
# waits forever, so accounting is always on.
# Ports: QB_SLURM_PORT (slurmctld, default 6817; slurmd +1, slurmdbd +2) and
# QB_SLURM_DB_PORT (MariaDB, default 3307).
# GPUs: the node offers QB_SLURM_GPUS GPUs as Slurm gres (`--gres=gpu:N`,
# hydra.launcher.gpus_per_node). Default: the host's NVIDIA devices
# (/dev/nvidia0, ...), bound to their device files so Slurm sets each job's
# CUDA_VISIBLE_DEVICES; on a host without one, one stand-in GPU (see
# gres_conf), so that a GPU request is scheduled and runs on a CPU machine
# too (tests/scripts/test_slurm_local.py checks it). QB_SLURM_GPUS=0: no GPUs.
# `start` restarts a running cluster whose configuration changed (e.g. GPUs added).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(mkdir -p "${QB_SLURM_DIR:-$ROOT/.cache/slurm}" && cd "${QB_SLURM_DIR:-$ROOT/.cache/slurm}" && pwd)
ETC=$DIR/etc RUN=$DIR/run LOG=$DIR/log
CTLD_PORT=${QB_SLURM_PORT:-6817}
SLURMD_PORT=$((CTLD_PORT + 1)) DBD_PORT=$((CTLD_PORT + 2))
DB_PORT=${QB_SLURM_DB_PORT:-3307}
CLUSTER=quantbench
NODE=$(hostname -s)
USER_NAME=$(id -un)
PACKAGES=(slurm-wlm slurmdbd mariadb-server)
DAEMONS=(mariadb slurmdbd slurmctld slurmd)   # start order; stop goes backwards
DEVICES=()
for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && DEVICES+=("$d"); done
GPUS=${QB_SLURM_GPUS:-$(( ${#DEVICES[@]} > 0 ? ${#DEVICES[@]} : 1 ))}
export SLURM_CONF=$ETC/slurm.conf

say() { echo "slurm_local: $*" >&2; }
die() { echo "slurm_local: error: $*" >&2; exit 1; }

# --- install -----------------------------------------------------------------
missing_binaries() {
    local b out=()
    for b in slurmctld slurmd slurmdbd sbatch sacct sacctmgr mariadbd mariadb-install-db; do
        command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || out+=("$b")
    done
    echo "${out[*]}"
}

install() {
    local missing; missing=$(missing_binaries)
    if [ -z "$missing" ]; then say "Slurm, slurmdbd and MariaDB are installed"; return 0; fi
    if [ "$(id -u)" != 0 ]; then
        die "missing $missing; as root run: apt-get install -y ${PACKAGES[*]} (or bash scripts/slurm_local.sh install)"
    fi
    command -v apt-get >/dev/null || die "missing $missing and no apt-get here; install Slurm 22.05+, slurmdbd and MariaDB by hand"
    say "installing ${PACKAGES[*]} (missing: $missing)"
    # Package scripts must not start the system-wide services: the cluster runs from $DIR.
    bash "$ROOT/scripts/apt_install.sh" --no-service-start slurm_local "${PACKAGES[@]}" || exit 1
    missing=$(missing_binaries)
    [ -z "$missing" ] || die "still missing after apt-get: $missing"
    say "installed"
}

# --- processes -------------------------------------------------------------
pid_of() { cat "$RUN/$1.pid" 2>/dev/null || true; }

# A recorded PID counts only while it is still the daemon this script started
# (its command name, and our directory in its command line or environment):
# a recycled PID is never signalled.
alive() {
    local pid; pid=$(pid_of "$1")
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    local comm; comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    case "$comm" in "$1"|"$1"d|mysqld) ;; *) return 1 ;; esac
    { tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF "$DIR" && return 0
    { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF"
}

launch() {  # launch <name> <command...>: in its own session, PID recorded
    local name=$1; shift
    setsid "$@" </dev/null >>"$LOG/$name.out" 2>&1 &
    echo $! >"$RUN/$name.pid"
}

wait_for() {  # wait_for <seconds> <what> <log> <command...>
    local seconds=$1 what=$2 log=$3; shift 3
    local end=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then
            say "$what not ready after ${seconds}s; last lines of $log:"
            tail -n 15 "$log" >&2 2>/dev/null || true
            exit 1
        fi
        sleep 0.2
    done
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

check_port() {  # a port someone else listens on is a clear error, not a daemon crash loop
    port_free "$1" || die "port $1 (for $2) is taken by another program; pick others with $3=<port>"
}

mysql_root() { mariadb --no-defaults --socket="$RUN/mysqld.sock" -uroot "$@"; }

# --- configuration -----------------------------------------------------------
write_configs() {
    mkdir -p "$ETC" "$RUN" "$LOG" "$DIR/state" "$DIR/spool" "$DIR/mysql"
    local cpus mem_mb
    cpus=$(nproc)
    mem_mb=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.75}' /proc/meminfo)
    [ -s "$ETC/db.password" ] || { (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$ETC/db.password"); }
    case "$GPUS" in ''|*[!0-9]*) die "QB_SLURM_GPUS=$GPUS is not a count; set QB_SLURM_GPUS=0, 1, 2, ..." ;; esac
    local gres_types="" node_gres=""
    if [ "$GPUS" -gt 0 ]; then  # accounted too: sacct -o AllocTRES shows a job's gres/gpu
        gres_types=$'GresTypes=gpu\nAccountingStorageTRES=gres/gpu' node_gres=" Gres=gpu:$GPUS"
    fi
    cat >"$ETC/slurm.conf.new" <<EOF
# Written by scripts/slurm_local.sh: a single-node cluster under $DIR.
ClusterName=$CLUSTER
SlurmctldHost=$NODE($ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$USER_NAME
SlurmdUser=$USER_NAME
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
EnforcePartLimits=ALL
SchedulerParameters=batch_sched_delay=0
$gres_types
KillWait=5
MailProg=/bin/true
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$RUN/slurmctld.daemon.pid
SlurmdPidFile=$RUN/slurmd.daemon.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$ADDR
AccountingStoragePort=$DBD_PORT
JobCompType=jobcomp/none
# Every daemon binds to the (loopback) address the host name resolves to, not 0.0.0.0.
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
NodeName=$NODE NodeAddr=$ADDR CPUs=$cpus RealMemory=$mem_mb$node_gres State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    gres_conf >"$ETC/gres.conf.new"
    (umask 077; cat >"$ETC/slurmdbd.conf" <<EOF
# Written by scripts/slurm_local.sh. slurmdbd refuses a config others can read.
AuthType=auth/none
DbdHost=localhost
DbdPort=$DBD_PORT
CommunicationParameters=NoInAddrAny
SlurmUser=$USER_NAME
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$ETC/db.password")
StorageLoc=slurm_acct_db
PidFile=$RUN/slurmdbd.daemon.pid
LogFile=$LOG/slurmdbd.log
EOF
    )
    chmod 600 "$ETC/slurmdbd.conf"
}

# gres.conf, which slurmd reads from slurm.conf's folder: the host's GPU
# device files, or stand-ins where it has none. Slurm 22.05 does not take a
# GPU by count alone: slurmd drops it ("Removing file-less GPU gpu:(null) from
# final GRES list") and the node is marked INVALID ("gres/gpu count reported
# lower than configured"); a File that is not a character or block device is
# an error too. So each stand-in is a link to /dev/null in $DIR/dev: with
# TaskPlugin=task/none nothing is bound to it, and a job still gets its GPU
# count (SLURM_GPUS_ON_NODE) and index (CUDA_VISIBLE_DEVICES) from Slurm.
gres_conf() {
    echo "# Written by scripts/slurm_local.sh: $GPUS GPU(s) (QB_SLURM_GPUS to change)."
    [ "$GPUS" -gt 0 ] || return 0
    local i files=()
    if [ "${#DEVICES[@]}" -gt 0 ]; then
        # the devices this host (or container) has, which need not start at nvidia0
        [ "${#DEVICES[@]}" -ge "$GPUS" ] || die "QB_SLURM_GPUS=$GPUS, but this host has ${#DEVICES[@]} NVIDIA GPU(s); set QB_SLURM_GPUS=${#DEVICES[@]} or less"
        files=("${DEVICES[@]:0:GPUS}")
    else
        echo "# No NVIDIA device here: stand-ins, see gres_conf in scripts/slurm_local.sh."
        mkdir -p "$DIR/dev"
        for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DIR/dev/gpu$i"; files+=("$DIR/dev/gpu$i"); done
    fi
    for i in "${files[@]}"; do echo "NodeName=$NODE Name=gpu File=$i"; done
}

# Puts the configs write_configs wrote in place; true when slurm.conf or
# gres.conf differ from the ones there before (the running daemons' ones).
configs_changed() {
    local f changed=1
    for f in slurm.conf gres.conf; do
        cmp -s "$ETC/$f.new" "$ETC/$f" || changed=0
        mv "$ETC/$f.new" "$ETC/$f"
    done
    return $changed
}

# --- start / stop / status ----------------------------------------------------
start_mariadb() {
    alive mariadb && return 0
    check_port "$DB_PORT" MariaDB QB_SLURM_DB_PORT
    if [ ! -d "$DIR/mysql/mysql" ]; then
        mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user="$USER_NAME" \
            --auth-root-authentication-method=socket --auth-root-socket-user="$USER_NAME" \
            --skip-test-db >"$LOG/mariadb-install.log" 2>&1 \
            || { tail -n 15 "$LOG/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    fi
    launch mariadb "$(command -v mariadbd || echo /usr/sbin/mariadbd)" --no-defaults --datadir="$DIR/mysql" \
        --socket="$RUN/mysqld.sock" --port="$DB_PORT" --bind-address=127.0.0.1 \
        --pid-file="$RUN/mariadb.daemon.pid" --log-error="$LOG/mariadb.log" --user="$USER_NAME" \
        --skip-log-bin --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900
    wait_for 60 MariaDB "$LOG/mariadb.log" mysql_root -e 'SELECT 1'
    local pw; pw=$(cat "$ETC/db.password")
    mysql_root -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pw';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

start_slurmdbd() {
    alive slurmdbd && return 0
    check_port "$DBD_PORT" slurmdbd QB_SLURM_PORT
    launch slurmdbd "$(command -v slurmdbd || echo /usr/sbin/slurmdbd)" -D
    wait_for 60 slurmdbd "$LOG/slurmdbd.log" sacctmgr -n list cluster
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
}

start_slurmctld() {
    alive slurmctld && return 0
    check_port "$CTLD_PORT" slurmctld QB_SLURM_PORT
    launch slurmctld "$(command -v slurmctld || echo /usr/sbin/slurmctld)" -D
    wait_for 60 slurmctld "$LOG/slurmctld.log" scontrol ping
}

node_up() { [ -n "$(sinfo -h -n "$NODE" -t idle,mix,alloc -o %N 2>/dev/null)" ]; }

start_slurmd() {
    if ! alive slurmd; then
        check_port "$SLURMD_PORT" slurmd QB_SLURM_PORT
        launch slurmd "$(command -v slurmd || echo /usr/sbin/slurmd)" -D -N "$NODE"
    fi
    wait_for 60 "node $NODE" "$LOG/slurmd.log" node_up
}

start() {
    [ -z "$(missing_binaries)" ] || die "Slurm is not installed (missing $(missing_binaries)); run: bash scripts/slurm_local.sh install (as root)"
    # The daemons bind to the address the host name resolves to: only loopback is safe with auth/none.
    ADDR=$(getent ahostsv4 "$NODE" | awk 'NR == 1 {print $1}')
    case "$ADDR" in 127.*) ;; *) die "host name $NODE resolves to ${ADDR:-nothing}, not a loopback address, and the daemons (auth/none) would listen there; add '127.0.1.1 $NODE' to /etc/hosts" ;; esac
    local t0=$SECONDS
    write_configs
    if configs_changed && alive slurmctld; then
        # Node resources (GPUs) are read when the daemons start: a cluster from an
        # earlier version of this script restarts the two that read these files.
        say "configuration changed ($ETC/slurm.conf, gres.conf); restarting slurmctld and slurmd"
        stop_daemon slurmd
        stop_daemon slurmctld
    fi
    if all_up; then
        say "already running ($DIR)"
    else
        start_mariadb
        start_slurmdbd
        start_slurmctld
        start_slurmd
        say "cluster $CLUSTER up in $((SECONDS - t0))s: partition debug, node $NODE ($(nproc) CPUs, $GPUS GPUs); logs in $LOG"
    fi
    printf 'export SLURM_CONF=%q\n' "$SLURM_CONF"   # %q: a path with a space stays one word under eval
}

all_up() {
    local d
    for d in "${DAEMONS[@]}"; do alive "$d" || return 1; done
    node_up
}

stop_daemon() {
    local name=$1 pid i
    alive "$name" || { rm -f "$RUN/$name.pid"; return 0; }
    pid=$(pid_of "$name")
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 100); do alive "$name" || break; sleep 0.1; done
    if alive "$name"; then say "$name ($pid) ignored SIGTERM; killing it"; kill -KILL "$pid" 2>/dev/null || true; fi
    rm -f "$RUN/$name.pid"
    say "stopped $name ($pid)"
}

stop() {
    if alive slurmctld; then
        local jobs i
        jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
        if [ -n "${jobs// }" ]; then
            say "cancelling jobs: $jobs"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            for i in $(seq 150); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
        fi
    fi
    local n
    for ((n = ${#DAEMONS[@]} - 1; n >= 0; n--)); do stop_daemon "${DAEMONS[n]}"; done
}

status() {
    local d rc=0
    for d in "${DAEMONS[@]}"; do
        if alive "$d"; then say "$d: running (pid $(pid_of "$d"))"; else say "$d: stopped"; rc=3; fi
    done
    if alive slurmctld; then
        sinfo >&2 || true
        node_up || rc=3
    fi
    [ $rc = 0 ] && printf 'export SLURM_CONF=%q\n' "$SLURM_CONF"
    return $rc
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: bash scripts/slurm_local.sh install|start|stop|status (state in \$QB_SLURM_DIR, default .cache/slurm)" >&2; exit 2 ;;
esac
