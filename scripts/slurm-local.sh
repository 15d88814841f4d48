#!/bin/bash
# slurm-local.sh — a real Slurm on this machine, for hpcrun's tests: one node,
# or several nodes that are separate hosts as far as the network can tell.
#
# Usage (as root):  scripts/slurm-local.sh up [--nodes N]|down|status
#
#   up      install Debian's slurmctld, slurmd, slurm-client and munge if missing,
#           write the config, start munged, slurmctld and the slurmds, and wait
#           until sinfo shows every node idle. Running it again is harmless; a
#           different --nodes rebuilds the cluster.
#   --nodes N   1 (default): one node, this machine. 2 to 4: compute nodes n1..nN,
#           each a network and UTS namespace (its own hostname, its own address
#           10.77.0.1<i> on the bridge hpcbr0 through a veth pair, its own slurmd
#           started with -N n<i>); slurmctld and munged stay on this machine
#           (10.77.0.1), the file system (the runs dir) is shared, as on a cluster.
#   down    stop every slurmd, slurmctld and munged this script started, and remove
#           the namespaces, links and /etc/hosts lines it made.
#   status  print sinfo; exit 1 when the cluster is down.
#
# A node declares 8 CPUs whatever the machine has (4 tasks run on 2 cores) and
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
NODES=1
BRIDGE=hpcbr0
NET=10.77.0
NETNS_PREFIX=hpcrun-
HOSTS_MARK="# hpcrun slurm-local node"

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

# node_names prints the compute nodes' names: this machine's, or n1..nN.
node_names() {
	if [ "$NODES" = 1 ]; then host; else seq -f 'n%g' 1 "$NODES"; fi
}

write_config() {
	local h ctld nodelines n i
	h=$(host)
	mkdir -p "$ETC" "$STATE/ctld" "$STATE/d" "$STATE/log"
	for i in $(seq 0 $((GPUS - 1))); do : >>"$STATE/fakegpu$i"; done
	if [ "$NODES" = 1 ]; then
		ctld=127.0.0.1
		nodelines="NodeName=$h NodeAddr=127.0.0.1 CPUs=$CPUS Gres=gpu:$GPUS State=UNKNOWN"
	else
		ctld=$NET.1
		nodelines=
		for i in $(seq "$NODES"); do
			[ -n "$nodelines" ] && nodelines+=$'\n'
			nodelines+="NodeName=n$i NodeAddr=$NET.1$i CPUs=$CPUS Gres=gpu:$GPUS State=UNKNOWN"
		done
	fi
	n=$(node_names | paste -sd, -)
	write_if_ours "$ETC/slurm.conf" <<EOF
$MARK
# nodes: $NODES
ClusterName=hpcrun-local
SlurmctldHost=$h($ctld)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
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
SlurmdTimeout=20
EnforcePartLimits=ALL
GresTypes=gpu
$nodelines
PartitionName=debug Nodes=$n Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
	write_if_ours "$ETC/gres.conf" <<EOF
$MARK
NodeName=$n Name=gpu File=$STATE/fakegpu[0-$((GPUS - 1))]
EOF
}

# configured_nodes prints the node count of the config in place (0: none).
configured_nodes() {
	local n
	n=$(sed -n 's/^# nodes: //p' "$ETC/slurm.conf" 2>/dev/null | head -1)
	if [ -n "$n" ]; then
		echo "$n"
	elif [ -e "$ETC/slurm.conf" ] && grep -qF "$MARK" "$ETC/slurm.conf"; then
		echo 1
	else
		echo 0
	fi
}

# make_nodes builds the bridge and one namespace per node, idempotently.
make_nodes() {
	local i ns
	if ! ip netns list 2>/dev/null | grep -qw "${NETNS_PREFIX}n1"; then
		ip netns add "${NETNS_PREFIX}probe" 2>/dev/null && ip netns del "${NETNS_PREFIX}probe" ||
			die "cannot create network namespaces here (ip netns add failed): use --nodes 1"
	fi
	if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
		ip link add "$BRIDGE" type bridge || die "cannot create the bridge $BRIDGE"
		ip addr add "$NET.1/24" dev "$BRIDGE"
	fi
	ip link set "$BRIDGE" up
	for i in $(seq "$NODES"); do
		ns=${NETNS_PREFIX}n$i
		if ! ip netns list | grep -qw "$ns"; then
			ip netns add "$ns"
			ip link add "hpcv$i" type veth peer name eth0 netns "$ns"
			ip link set "hpcv$i" master "$BRIDGE"
			ip -n "$ns" addr add "$NET.1$i/24" dev eth0
			ip -n "$ns" link set lo up
		fi
		ip link set "hpcv$i" up
		ip -n "$ns" link set eth0 up
	done
	# Every node (and this machine) resolves every node's name.
	sed -i "/$HOSTS_MARK/d" /etc/hosts
	for i in $(seq "$NODES"); do echo "$NET.1$i n$i $HOSTS_MARK" >>/etc/hosts; done
}

# remove_nodes undoes make_nodes.
remove_nodes() {
	local ns
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${NETNS_PREFIX}n" || true); do
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
		ip netns del "$ns" 2>/dev/null || true
	done
	ip -o link show 2>/dev/null | sed -n 's/^[0-9]*: \(hpcv[0-9]*\)@.*/\1/p' | xargs -r -n1 ip link del 2>/dev/null || true
	ip link del "$BRIDGE" 2>/dev/null || true
	if [ -e /etc/hosts ]; then sed -i "/$HOSTS_MARK/d" /etc/hosts; fi
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
	local n
	if ! pid_alive "$STATE/slurmctld.pid"; then
		/usr/sbin/slurmctld || die "slurmctld did not start (see $STATE/log/slurmctld.log)"
	fi
	for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
	scontrol ping >/dev/null 2>&1 || die "slurmctld does not answer (see $STATE/log/slurmctld.log)"
	for n in $(node_names); do
		mkdir -p "$STATE/d/$n"
		pid_alive "$STATE/slurmd-$n.pid" && continue
		if [ "$NODES" = 1 ]; then
			/usr/sbin/slurmd -N "$n" || die "slurmd did not start (see $STATE/log/slurmd-$n.log)"
		else
			# Its own network (nsenter: ip netns exec would remount /sys and hide
			# the cgroup tree slurmd wants) and its own hostname (unshare --uts):
			# the slurmd and every task it starts see themselves as host n<i>.
			nsenter --net="/run/netns/${NETNS_PREFIX}$n" unshare --uts sh -c "hostname $n && exec /usr/sbin/slurmd -N $n" ||
				die "slurmd of $n did not start (see $STATE/log/slurmd-$n.log)"
		fi
	done
}

wait_idle() {
	local h state i
	for h in $(node_names); do
		for i in $(seq 150); do
			state=$(sinfo -h -N -n "$h" -o '%T' 2>/dev/null | head -1)
			case "$state" in
			idle | mixed | allocated) break ;;
			drain* | down* | inval* | fail*)
				# Left over from an earlier bad config or restart: put it back.
				[ $((i % 10)) = 1 ] && scontrol update nodename="$h" state=resume >/dev/null 2>&1 || true
				;;
			esac
			sleep 0.2
		done
		case "$state" in idle | mixed | allocated) continue ;; esac
		sinfo -N -l >&2 || true
		die "node $h is not idle after 30 s (state '${state:-none}'; see $STATE/log/slurmd-$h.log)"
	done
}

up() {
	need_root up
	case "$NODES" in 1 | 2 | 3 | 4) ;; *) die "--nodes $NODES: use 1 to 4" ;; esac
	install_packages
	local had
	had=$(configured_nodes)
	if [ "$had" != 0 ] && { [ "$had" != "$NODES" ] || [ -e "$STATE/slurmd.pid" ]; }; then
		log "rebuilding the cluster: $had node(s) -> $NODES"
		stop_all
	fi
	[ "$NODES" = 1 ] || make_nodes
	local before
	before=$(cat "$ETC/slurm.conf" 2>/dev/null || true)
	write_config
	start_munge
	if [ "$before" != "$(cat "$ETC/slurm.conf")" ] && pid_alive "$STATE/slurmctld.pid"; then
		scontrol reconfigure >/dev/null 2>&1 || true
	fi
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

# stop_all stops every slurmd (whichever node count the config had) and
# slurmctld, and removes the nodes' namespaces.
stop_all() {
	local f
	for f in "$STATE"/slurmd*.pid; do
		[ -e "$f" ] && stop_pidfile "$f" "slurmd ${f##*/}"
	done
	stop_pidfile "$STATE/slurmctld.pid" slurmctld
	remove_nodes
}

down() {
	need_root down
	stop_all
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

cmd=${1:-}
[ $# -gt 0 ] && shift
while [ $# -gt 0 ]; do
	case $1 in
	--nodes) [ $# -ge 2 ] || die "--nodes needs a number"; NODES=$2; shift 2 ;;
	--nodes=*) NODES=${1#*=}; shift ;;
	*) die "unknown option $1 (see $0 without arguments)" ;;
	esac
done
case "$cmd" in
up) up ;;
down) down ;;
status) status ;;
*) usage ;;
esac
