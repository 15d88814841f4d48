#!/usr/bin/env bash
# GPU check of the CUDA backend, in two halves because the GPU machine has
# no Go:
#
#   bench/pytorch/gpu-check.sh build   # here: test and bench binaries into devbin/
#   bench/pytorch/gpu-check.sh run     # on the GPU machine, from the repo root
#
# run: every kernel against the CPU device (tensor/cuda GPU tests), training
# steps of a small GPT against the CPU's losses (train), the NCCL
# GPU tests, GEMM throughput per precision, then `hpcrun bench step --device
# cuda` and the same GPT-2 124M step in PyTorch eager, side by side.
# BSZ, SEQ, STEPS set the step's shape (default 8 x 1024, 5 steps).
set -u
cd "$(dirname "$0")/../.."
BIN=devbin

if [ "${1:-}" = build ]; then
	set -e
	mkdir -p "$BIN"
	go test -c -ldflags="-s -w" -o "$BIN/cuda.test" ./tensor/cuda
	go test -c -ldflags="-s -w" -o "$BIN/nccl.test" ./nccl
	go test -c -ldflags="-s -w" -o "$BIN/train.test" ./train
	go build -ldflags="-s -w" -o "$BIN/hpcrun" ./cmd/hpcrun
	ls -l "$BIN"
	exit 0
fi
if [ "${1:-}" != run ]; then
	echo "usage: $0 build|run" >&2
	exit 2
fi

# CUDA libraries: the toolkit's, else those of pip's nvidia-* wheels (what
# PyTorch ships), found through the python3 that holds torch.
dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
	[ -d "$d" ] && dirs="$dirs:$d"
done
site=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || true)
if [ -n "$site" ]; then
	for f in $(find "$site/nvidia" -name 'libcublas.so*' -o -name 'libnvrtc.so*' -o -name 'libcublasLt.so*' 2>/dev/null); do
		dirs="$dirs:$(dirname "$f")"
	done
fi
export HPCRUN_CUDA_LIB_PATH="${HPCRUN_CUDA_LIB_PATH:-}$dirs"
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}$dirs"
echo "== CUDA library path: $HPCRUN_CUDA_LIB_PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null

fail=0
step() { echo; echo "== $*"; "$@" || { echo "== FAILED: $*"; fail=1; }; }

step "$BIN/cuda.test" -test.v -test.count=1 -test.run 'GPU|Unavailable'
step "$BIN/train.test" -test.v -test.count=1 -test.run 'GPU|OpenDevice'
step "$BIN/nccl.test" -test.count=1 -test.run 'NCCL|GPU' -test.v
step "$BIN/cuda.test" -test.run XXX -test.bench GPUGemm -test.benchtime 50x

BSZ=${BSZ:-8} SEQ=${SEQ:-1024} STEPS=${STEPS:-5}
out=${OUT:-/tmp}
for prec in fp32 bf16; do
	torchdt=$prec
	step sh -c "$BIN/hpcrun --json bench step --device cuda --precision $prec --model gpt2-124m --bsz $BSZ --seq $SEQ --steps $STEPS > $out/hpcrun-$prec.json && cat $out/hpcrun-$prec.json"
	for attn in naive sdpa; do
		step python3 bench/pytorch/gpt2_step.py --bsz "$BSZ" --seq "$SEQ" --steps "$STEPS" --dtype "$torchdt" --attn "$attn" --hpcrun-json "$out/hpcrun-$prec.json"
	done
done
echo
[ $fail = 0 ] && echo "== gpu-check: all passed" || echo "== gpu-check: FAILURES above"
exit $fail
