#!/usr/bin/env bash
# GPU check of the CUDA backend, in two halves because the GPU machine has
# no Go:
#
#   bench/pytorch/gpu-check.sh build   # here: test and bench binaries into devbin/
#   bench/pytorch/gpu-check.sh run     # on the GPU machine, from the repo root
#
# build: CGO_ENABLED=0 binaries (purego needs no cgo), so they ask nothing
# of the GPU machine's glibc beyond dlopen and start on RHEL 8 or Ubuntu
# 20.04 clusters; together they must stay under 64 MiB.
#
# run: every kernel against the CPU device (tensor/cuda GPU tests), training
# steps of a small GPT against the CPU's losses (train), the NCCL GPU tests,
# GEMM throughput per precision, then `hpcrun bench step --device cuda` and
# the same GPT-2 124M step in PyTorch eager, side by side. Where nvidia-smi
# sees a GPU, a GPU test that skips (a library that did not load, say) is a
# failure, not a pass; the two-rank tests (*TwoRanks: dp2 ZeRO-1, NCCL
# point-to-point) need two GPUs and may skip on one. BSZ, SEQ, STEPS set the step's shape (default
# 8 x 1024, 5 steps); GPU_CHECK_BIN names the binaries' folder (devbin).
set -u
cd "$(dirname "$0")/../.."
BIN=${GPU_CHECK_BIN:-devbin}

if [ "${1:-}" = build ]; then
	set -e
	mkdir -p "$BIN"
	export CGO_ENABLED=0
	flags=(-trimpath -ldflags="-s -w")
	go test -c "${flags[@]}" -o "$BIN/cuda.test" ./tensor/cuda
	go test -c "${flags[@]}" -o "$BIN/nccl.test" ./nccl
	go test -c "${flags[@]}" -o "$BIN/train.test" ./train
	go build "${flags[@]}" -o "$BIN/hpcrun" ./cmd/hpcrun
	ls -l "$BIN"
	total=$(du -cb "$BIN/cuda.test" "$BIN/nccl.test" "$BIN/train.test" "$BIN/hpcrun" | tail -1 | cut -f1)
	echo "== $BIN: $total bytes"
	if [ "$total" -ge $((64 << 20)) ]; then
		echo "== $BIN holds $total bytes: more than 64 MiB" >&2
		exit 1
	fi
	exit 0
fi
if [ "${1:-}" != run ]; then
	echo "usage: $0 build|run" >&2
	exit 2
fi

# CUDA libraries: the toolkit's, else those of pip's nvidia-* wheels (what
# PyTorch ships: cuBLAS, NVRTC, NCCL, the CUDA runtime), found through the
# python3 that holds torch.
dirs=()
add_dir() {
	local d
	for d in "${dirs[@]}"; do [ "$d" = "$1" ] && return; done
	dirs+=("$1")
}
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
	[ -d "$d" ] && add_dir "$d"
done
site=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || true)
if [ -n "$site" ] && [ -d "$site/nvidia" ]; then
	while IFS= read -r f; do
		add_dir "$(dirname "$f")"
	done < <(find "$site/nvidia" \( -name 'libcublas.so*' -o -name 'libcublasLt.so*' -o -name 'libnvrtc.so*' \
		-o -name 'libnvrtc-builtins.so*' -o -name 'libnccl.so*' -o -name 'libcudart.so*' \) 2>/dev/null | sort)
fi
libpath=$(IFS=:; echo "${dirs[*]}")
# The Go binaries alone get the library path (never python3, whose torch
# brings its own libraries), and never with an empty element (an empty
# element means the current directory).
golib=$libpath
if [ -n "${LD_LIBRARY_PATH:-}" ]; then
	golib=${golib:+$golib:}$LD_LIBRARY_PATH
fi
gocuda=$libpath
if [ -n "${HPCRUN_CUDA_LIB_PATH:-}" ]; then
	gocuda=$HPCRUN_CUDA_LIB_PATH${gocuda:+:$gocuda}
fi
gobin() {
	if [ -n "$golib" ]; then
		env LD_LIBRARY_PATH="$golib" HPCRUN_CUDA_LIB_PATH="$gocuda" "$@"
	else
		env HPCRUN_CUDA_LIB_PATH="$gocuda" "$@"
	fi
}
echo "== CUDA library path for the Go binaries: ${golib:-(none)}"

gpu=0
gpus=0
if nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null; then
	gpu=1
	gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
else
	echo "== nvidia-smi sees no GPU: GPU tests may skip"
fi

fail=0
step() { echo; echo "== $*"; "$@" || { echo "== FAILED: $*"; fail=1; }; }

# gputest runs the TestGPU* tests of one binary (and the NVRTC compile of
# every kernel for sm_70, sm_80 and sm_90); with a GPU present, a skip or
# an empty match fails, except that the two-rank tests (named *TwoRanks:
# NCCL wants one GPU a rank) may skip where fewer than two GPUs are seen.
gputest() {
	local bin=$1 out rc skips
	echo
	echo "== $bin -test.run ^(TestGPU|TestNVRTCCompilesKernels)"
	out=$(mktemp)
	HPCRUN_REQUIRE_NVRTC=1 gobin "$bin" -test.v -test.count=1 -test.run '^(TestGPU|TestNVRTCCompilesKernels)' 2>&1 | tee "$out"
	rc=${PIPESTATUS[0]}
	skips=$(grep -- '--- SKIP' "$out")
	if [ "$gpus" -lt 2 ]; then
		skips=$(grep -v 'TwoRanks' <<<"$skips")
	fi
	if [ "$rc" != 0 ]; then
		echo "== FAILED: $bin"
		fail=1
	elif [ $gpu = 1 ] && [ -n "$skips" ]; then
		echo "== FAILED: $bin: GPU tests skipped on a machine with a GPU:"
		echo "$skips"
		fail=1
	elif [ $gpu = 1 ] && grep -q 'no tests to run' "$out"; then
		echo "== FAILED: $bin: no GPU test ran"
		fail=1
	fi
	rm -f "$out"
}

gputest "$BIN/cuda.test"
gputest "$BIN/train.test"
gputest "$BIN/nccl.test"
step gobin "$BIN/cuda.test" -test.run '^$' -test.bench GPUGemm -test.benchtime 50x

BSZ=${BSZ:-8} SEQ=${SEQ:-1024} STEPS=${STEPS:-5}
out=${OUT:-/tmp}
for prec in fp32 bf16; do
	step gobin sh -c "\"$BIN/hpcrun\" --json bench step --device cuda --precision $prec --model gpt2-124m --bsz $BSZ --seq $SEQ --steps $STEPS > \"$out/hpcrun-$prec.json\" && cat \"$out/hpcrun-$prec.json\""
	for attn in naive sdpa; do
		step python3 bench/pytorch/gpt2_step.py --bsz "$BSZ" --seq "$SEQ" --steps "$STEPS" --dtype "$prec" --attn "$attn" --hpcrun-json "$out/hpcrun-$prec.json"
	done
done
echo
if [ $fail = 0 ]; then
	echo "== gpu-check: all passed"
else
	echo "== gpu-check: FAILURES above"
fi
exit $fail
