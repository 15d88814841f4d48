#!/bin/bash
# slurm-local.sh — a real one-node Slurm on this machine, for hpcrun's tests.
#
# Usage (as root):  scripts/slurm-local.sh up|down|status
#
#   up      install Debian's slurmctld, slurmd, slurm-client and munge if missing,
#           write the config, start munged, slurmctld and slurmd, and wait until
#           sinfo shows the node idle. Running it again is harmless.
#   down    stop slurmd, slurmctld and munged (the ones this script started).
#   status  print sinfo; exit 1 when the cluster is down.
#
# The node declares 8 CPUs whatever the machine has (4 tasks run on 2 cores) and
# 4 GPUs backed by plain files, so scripts asking for --gres=gpu:N run unchanged.
# Accounting is off; finished jobs stay visible to `scontrol show job` for
# MinJobAge seconds. State, logs and pid files live in $HPCRUN_SLURM_DIR
# (default /var/lib/hpcrun-slurm); the config is written to /etc/slurm/slurm.conf
# and /etc/slurm/gres.conf, which the Slurm commands read by default, and only
# when those files are absent or were written by this script.
set -euo pipefail

STATE=${HPCRUN_SLURM_DIR:-/var/lib/hpcrun-slurm}
ETC=/etc/slurm
MARK="# written by hpcrun scripts/slurm-local.sh"
CPUS=${HPCRUN_SLURM_CPUS:-8}
GPUS=4
PKGS=(slurmctld slurmd slurm-client munge)

die() { echo "slurm-local: $*" >&2; exit 1; }
log() { echo "slurm-local: $*" >&2; }

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
	exit 2
}

need_root() {
	[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons): sudo $0 $1"
}

host() { hostname -s; }

# pid_alive FILE: the pid in FILE names a running process.
pid_alive() {
	[ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
	local missing=() p
	for p in "${PKGS[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing ${missing[*]} (waiting for the dpkg lock if apt is busy)"
	export DEBIAN_FRONTEND=noninteractive
	local apt=(apt-get -o DPkg::Lock::Timeout=900 -q -y)
	"${apt[@]}" install --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
		"${apt[@]}" update >/dev/null
		"${apt[@]}" install --no-install-recommends "${missing[@]}" >/dev/null
	}
}

# write_if_ours FILE: replace FILE with stdin unless it exists and is not ours.
write_if_ours() {
	local f=$1 tmp
	if [ -e "$f" ] && ! grep -qF "$MARK" "$f"; then
		die "$f exists and was not written by this script; move it away to use the local test cluster"
	fi
	tmp=$(mktemp "$f.XXXXXX")
	cat >"$tmp"
	chmod 644 "$tmp"
	mv -f "$tmp" "$f"
}

write_config() {
	local h
	h=$(host)
	mkdir -p "$ETC" "$STATE/ctld" "$STATE/d" "$STATE/log"
	for i in $(seq 0 $((GPUS - 1))); do : >>"$STATE/fakegpu$i"; done
	write_if_ours "$ETC/slurm.conf" <<EOF
$MARK
ClusterName=hpcrun-local
SlurmctldHost=$h(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
KillWait=5
InactiveLimit=0
GresTypes=gpu
NodeName=$h NodeAddr=127.0.0.1 CPUs=$CPUS Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=$h Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
	write_if_ours "$ETC/gres.conf" <<EOF
$MARK
NodeName=$h Name=gpu File=$STATE/fakegpu[0-$((GPUS - 1))]
EOF
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
	munge_ok && return 0
	if [ ! -s /etc/munge/munge.key ]; then
		mkdir -p /etc/munge
		if command -v mungekey >/dev/null; then
			mungekey --create --keyfile=/etc/munge/munge.key
		else
			dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
		fi
	fi
	chown munge:munge /etc/munge /etc/munge/munge.key
	chmod 700 /etc/munge
	chmod 600 /etc/munge/munge.key
	mkdir -p /run/munge /var/lib/munge /var/log/munge
	chown munge:munge /run/munge /var/lib/munge /var/log/munge
	chmod 755 /run/munge
	runuser -u munge -- /usr/sbin/munged
	for _ in $(seq 50); do munge_ok && return 0; sleep 0.2; done
	die "munged did not start (see /var/log/munge/munged.log)"
}

start_daemons() {
	if ! pid_alive "$STATE/slurmctld.pid"; then
		/usr/sbin/slurmctld || die "slurmctld did not start (see $STATE/log/slurmctld.log)"
	fi
	for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
	scontrol ping >/dev/null 2>&1 || die "slurmctld does not answer (see $STATE/log/slurmctld.log)"
	if ! pid_alive "$STATE/slurmd.pid"; then
		/usr/sbin/slurmd || die "slurmd did not start (see $STATE/log/slurmd.log)"
	fi
}

wait_idle() {
	local h state
	h=$(host)
	for i in $(seq 150); do
		state=$(sinfo -h -N -n "$h" -o '%T' 2>/dev/null | head -1)
		case "$state" in
		idle | mixed | allocated) return 0 ;;
		drain* | down* | inval* | fail*)
			# Left over from an earlier bad config or restart: put it back.
			[ $((i % 10)) = 1 ] && scontrol update nodename="$h" state=resume >/dev/null 2>&1 || true
			;;
		esac
		sleep 0.2
	done
	sinfo -N -l >&2 || true
	die "node $h is not idle after 30 s (state '${state:-none}'; see $STATE/log/slurmd.log)"
}

up() {
	need_root up
	install_packages
	write_config
	start_munge
	start_daemons
	wait_idle
	sinfo
}

stop_pidfile() {
	local f=$1 name=$2 pid
	pid_alive "$f" || { rm -f "$f"; return 0; }
	pid=$(cat "$f")
	kill "$pid"
	for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || { rm -f "$f"; return 0; }; sleep 0.2; done
	log "$name (pid $pid) did not stop in 10 s; sending KILL"
	kill -9 "$pid" 2>/dev/null || true
	rm -f "$f"
}

down() {
	need_root down
	stop_pidfile "$STATE/slurmd.pid" slurmd
	stop_pidfile "$STATE/slurmctld.pid" slurmctld
	stop_pidfile /run/munge/munged.pid munged
	log "stopped"
}

status() {
	if ! command -v sinfo >/dev/null || ! pid_alive "$STATE/slurmctld.pid"; then
		echo "slurm-local: down" >&2
		exit 1
	fi
	sinfo || { echo "slurm-local: down (slurmctld does not answer)" >&2; exit 1; }
}

case "${1:-}" in
up) up ;;
down) down ;;
status) status ;;
*) usage ;;
esac
