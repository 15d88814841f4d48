#!/bin/bash
# zero-memlimit.sh — under a memory limit of the operating system, a model
# that ZeRO-1 cannot fit trains at ZeRO-3 on 4 ranks.
#
# Usage (as root, where the cgroup v1 memory controller is writable):
#   scripts/zero-memlimit.sh [HPCRUN] [MiB a rank]
#
# It runs `hpcrun run --nproc 4` (a GPT of 8 blocks of dim 512, 25M
# parameters) twice in one memory cgroup limited to 4 x MiB (default 225): at
# --zero 1 each rank holds the weights, gradients and a quarter of the Adam
# moments (about 320 MiB of resident memory a rank) and the kernel's OOM
# killer stops the run; at --zero 3 the blocks' weights, gradients and
# moments are sharded over the 4 ranks (about 150 MiB a rank) and it
# completes. Exit status 0 when both happen as said.
set -euo pipefail
hpcrun=${1:-hpcrun}
per=${2:-225}
cg=/sys/fs/cgroup/memory/hpcrun-zero-memlimit-$$
if ! mkdir "$cg" 2>/dev/null; then
	echo "zero-memlimit: cannot make a memory cgroup under /sys/fs/cgroup/memory (cgroup v1, as root)" >&2
	exit 2
fi
runs=$(mktemp -d)
trap 'rmdir "$cg" 2>/dev/null; rm -rf "$runs"' EXIT
echo $((4 * per * 1024 * 1024)) >"$cg/memory.limit_in_bytes"
echo 1 >"$cg/memory.use_hierarchy" 2>/dev/null || true
run() {
	echo 0 >"$cg/memory.max_usage_in_bytes"
	bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "$hpcrun" run --nproc 4 --model gpt --layers 8 --dim 512 --heads 8 \
		--seq 32 --bsz 1 --steps 3 --zero "$1" --data synthetic --runs-dir "$runs" --ckpt-every -1 --force >"$runs/zero$1.out" 2>&1
}
status=0
if run 1; then
	echo "zero 1: trained within $((4 * per)) MiB for 4 ranks; want it stopped by the limit" >&2
	status=1
else
	echo "zero 1: stopped by the limit ($(grep -m1 -o 'rank [0-9]* (signal: killed)' "$runs/zero1.out" || echo 'see its output'))"
fi
if run 3; then
	echo "zero 3: trained within $((4 * per)) MiB for 4 ranks (peak $(($(cat "$cg/memory.max_usage_in_bytes") / 1048576)) MiB)"
else
	echo "zero 3: failed within $((4 * per)) MiB:" >&2
	tail -5 "$runs/zero3.out" >&2
	status=1
fi
exit $status
