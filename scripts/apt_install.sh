#!/usr/bin/env bash
# Installs Debian packages for a setup step, as root:
#
#   bash scripts/apt_install.sh [--no-service-start] <name> <package>...
#
# Two setups on one host (a developer's `make setup` and a CI clone's, or two
# users) used to run apt-get at once, and the second failed on dpkg's lock
# (rc 100). So installs of this project wait for each other (flock on
# QB_APT_LOCK, default /var/lock/quantbench-apt.lock), and apt-get waits up to
# 10 min for dpkg's own lock held by anything else (unattended upgrades).
# The package lists are refreshed only when an install fails without them (a
# fresh image lacks them; stale ones 404). --no-service-start: the packages'
# scripts must not start system-wide services (policy-rc.d, inside the lock so
# that a concurrent install cannot remove it early). The log, one per call, is
# named on failure; the exit status is apt-get's.
set -euo pipefail
no_start=""
if [ "${1:-}" = --no-service-start ]; then no_start=1; shift; fi
[ $# -ge 2 ] || { echo "usage: $0 [--no-service-start] <name> <package>..." >&2; exit 2; }
name=$1; shift
lock=${QB_APT_LOCK:-/var/lock/quantbench-apt.lock}
APT=(apt-get -o DPkg::Lock::Timeout=600)

# `9>&-`: apt, dpkg and the daemons package scripts may start must not inherit
# the lock, or a daemon would hold it after this script exits.
install() { DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq --no-install-recommends "$@" >>"$log" 2>&1 9>&-; }

mkdir -p "$(dirname "$lock")"
exec 9>"$lock"
if ! flock -n 9; then
    echo "$name: waiting for another install of this project to finish ($lock)" >&2
    flock -w 1800 9 || { echo "$name: error: another install held $lock for 30 min; see who: fuser $lock" >&2; exit 1; }
fi
log=$(mktemp "${TMPDIR:-/tmp}/$name-apt.XXXXXX.log")
policy=/usr/sbin/policy-rc.d made_policy=""
trap '[ -z "$made_policy" ] || rm -f $policy' EXIT
trap 'exit 130' INT; trap 'exit 143' TERM   # so that the EXIT trap runs when interrupted too
if [ -n "$no_start" ] && [ ! -e $policy ]; then
    printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy && made_policy=1
fi
rc=0
install "$@" || { "${APT[@]}" update -qq >>"$log" 2>&1 9>&- && install "$@"; } || rc=$?
if [ $rc != 0 ]; then
    echo "$name: error: apt-get install $* failed (rc $rc); see $log" >&2
    exit $rc
fi
rm -f "$log"
