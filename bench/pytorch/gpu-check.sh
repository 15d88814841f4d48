#!/usr/bin/env bash
# GPU check of the CUDA backend, in two halves because the GPU machine has
# no Go:
#
#   bench/pytorch/gpu-check.sh build          # here: test and bench binaries into devbin/
#   bench/pytorch/gpu-check.sh run [STAGE]... # on the GPU machine, from the repo root
#
# build: CGO_ENABLED=0 binaries (purego needs no cgo), so they ask nothing
# of the GPU machine's glibc beyond dlopen and start on RHEL 8 or Ubuntu
# 20.04 clusters; together they must stay under 64 MiB.
#
# run takes stages, each sized to end well inside 8 minutes on one H100
# (the GPU test machine takes runs of at most 10 minutes, 15 in all: pick
# the stages a session needs, e.g. BSZ=16 ... run step pytorch ncu for
# the speed goals at 16 x 1024, then kernels), each
# writing its full log and results under $OUT/<stage>/ (OUT: default
# /tmp/gpu-check) and its verdict to $OUT/<stage>/status; no stage
# depends on another's success (a failed `bench step` leaves PyTorch to
# run alone). Without a stage, run runs them all but ncu, in this order:
#
#   kernels  every CUDA kernel against the CPU device and the NVRTC compile
#            (tensor/cuda GPU tests), then GEMM throughput per precision
#   train    training steps of small models against the CPU's losses, the
#            layouts on one GPU (train GPU tests)
#   nccl     the NCCL backend's GPU tests
#   step     `hpcrun bench step --device cuda` of GPT-2 124M at fp32, tf32
#            and bf16 (the fused attention), bf16 unfused, and SmolLM-135M
#            (a Llama) at bf16
#   pytorch  the same steps in PyTorch eager (GPT-2: naive and sdpa
#            attention, fp32 and bf16; the Llama: sdpa, bf16), beside the
#            step stage's results when there are any
#   ncu      (only when named) Nsight Compute's GPU time of each kernel
#            (gpu__time_duration, kernels serialised, clocks not held at
#            base) over one GPT-2 124M step at bf16 and one at tf32 (the
#            fused attention), no
#            warm-up: $OUT/ncu/ncu-<prec>.csv, ncu's per-kernel summary
#            (each kernel's invocations and its time's average, minimum and
#            maximum); NCU names the ncu binary (default: ncu on PATH, else
#            /usr/local/cuda/bin/ncu)
#
# Where nvidia-smi sees a GPU, a GPU test that skips (a library that did
# not load, say) is a failure, not a pass; the multi-rank tests (*TwoRanks:
# dp2 ZeRO-1, NCCL point-to-point and abort; *FourRanks: every NCCL
# collective) run on the real NCCL where the machine has that many GPUs,
# and may skip where it has fewer (the run says so; make test runs them on
# simulated GPUs, package internal/cpusim). BSZ,
# SEQ, STEPS set the step's shape (default 8 x 1024, 5 steps);
# STAGE_LIMIT bounds each stage in seconds (default 420: a stage that runs
# out of time fails, and its commands not yet run say so);
# GPU_CHECK_BIN names the binaries' folder (devbin).
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
	echo "usage: $0 build | run [kernels|train|nccl|step|pytorch|ncu]..." >&2
	exit 2
fi
shift
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(kernels train nccl step pytorch)
for st in "${stages[@]}"; do
	case $st in
	kernels | train | nccl | step | pytorch | ncu) ;;
	*)
		echo "gpu-check: unknown stage $st (kernels, train, nccl, step, pytorch, ncu)" >&2
		exit 2
		;;
	esac
done
OUT=${OUT:-/tmp/gpu-check}
LIMIT=${STAGE_LIMIT:-420}
mkdir -p "$OUT"

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
# goenv runs a Go binary with that path (and the caller's other settings).
goenv=(env HPCRUN_CUDA_LIB_PATH="$gocuda")
[ -n "$golib" ] && goenv+=(LD_LIBRARY_PATH="$golib")
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
# left is how many seconds the running stage has left (it ends at
# stage_end, STAGE_LIMIT after it began); a command gets what is left.
left() { echo $((stage_end - SECONDS)); }

# step runs one command of a stage within the stage's time.
step() {
	echo
	echo "== $*"
	local t
	t=$(left)
	if [ "$t" -le 0 ]; then
		echo "== NOT RUN, the stage's ${LIMIT}s are spent: $*"
		fail=1
		return
	fi
	timeout --kill-after=10 "$t" "$@"
	local rc=$?
	if [ $rc != 0 ]; then
		[ $rc = 124 ] && echo "== TIMED OUT at the stage's ${LIMIT}s: $*"
		echo "== FAILED: $*"
		fail=1
	fi
}

# gputest runs the tests of one binary matching pattern; with a GPU
# present, a skip or an empty match fails, except that the multi-rank
# tests (named *TwoRanks and *FourRanks: NCCL wants one GPU a rank) may
# skip where fewer GPUs than their ranks are seen, which it says.
gputest() {
	local bin=$1 pattern=$2 out rc skips
	echo
	echo "== $bin -test.run $pattern"
	local t
	t=$(left)
	if [ "$t" -le 0 ]; then
		echo "== NOT RUN, the stage's ${LIMIT}s are spent: $bin"
		fail=1
		return
	fi
	out=$(mktemp)
	HPCRUN_REQUIRE_NVRTC=1 timeout --kill-after=10 "$t" "${goenv[@]}" \
		"$bin" -test.v -test.count=1 -test.run "$pattern" 2>&1 | tee "$out"
	rc=${PIPESTATUS[0]}
	skips=$(grep -- '--- SKIP' "$out")
	local fewer=""
	if [ "$gpus" -lt 2 ]; then
		fewer='TwoRanks|FourRanks'
	elif [ "$gpus" -lt 4 ]; then
		fewer='FourRanks'
	fi
	if [ -n "$fewer" ] && grep -qE "$fewer" <<<"$skips"; then
		echo "== $gpus GPU(s) here: the tests of more ranks than GPUs skip on the real NCCL ($(grep -oE "Test[A-Za-z0-9]*($fewer)" <<<"$skips" | sort -u | tr '\n' ' '| sed 's/ $//')); make test runs them on simulated GPUs"
		skips=$(grep -vE "$fewer" <<<"$skips")
	fi
	if [ "$rc" != 0 ]; then
		[ "$rc" = 124 ] && echo "== TIMED OUT at the stage's ${LIMIT}s: $bin"
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

BSZ=${BSZ:-8} SEQ=${SEQ:-1024} STEPS=${STEPS:-5}

# stage_<name> runs one stage; its output goes to $OUT/<name>/log.
stage_kernels() {
	gputest "$BIN/cuda.test" '^(TestGPU|TestNVRTCCompilesKernels)'
	step "${goenv[@]}" "$BIN/cuda.test" -test.run '^$' -test.bench GPUGemm -test.benchtime 50x
}
stage_train() { gputest "$BIN/train.test" '^(TestGPU|TestNVRTCCompilesKernels)'; }
stage_nccl() { gputest "$BIN/nccl.test" '^(TestGPU|TestNVRTCCompilesKernels)'; }
stage_step() {
	local run model prec attn name
	# GPT-2 124M: bf16 and tf32 run the fused attention (auto); bf16
	# unfused is the same step with the (T,T) probabilities, the fused
	# kernels' A/B. SmolLM-135M (GQA, RoPE, SwiGLU) at bf16: the Llama.
	for run in gpt2-124m:fp32:auto gpt2-124m:tf32:auto gpt2-124m:bf16:auto gpt2-124m:bf16:unfused smollm-135m:bf16:auto; do
		IFS=: read -r model prec attn <<<"$run"
		name=hpcrun-$prec
		[ "$model" = gpt2-124m ] || name=hpcrun-llama-$prec
		[ "$attn" = auto ] || name=$name-$attn
		rm -f "$dir/$name.json"
		step "${goenv[@]}" sh -c "\"$BIN/hpcrun\" --json bench step --device cuda --precision $prec --attention $attn --model $model --bsz $BSZ --seq $SEQ --steps $STEPS > \"$dir/$name.json.tmp\" && mv \"$dir/$name.json.tmp\" \"$dir/$name.json\" && cat \"$dir/$name.json\""
	done
}
stage_pytorch() {
	local prec attn beside
	for prec in fp32 bf16; do
		# The step stage's result, when it wrote one (a failed or skipped
		# step leaves none: PyTorch runs alone).
		beside=()
		if [ -s "$OUT/step/hpcrun-$prec.json" ]; then
			beside=(--hpcrun-json "$OUT/step/hpcrun-$prec.json")
		else
			echo "== no hpcrun $prec result from the step stage: PyTorch alone"
		fi
		for attn in naive sdpa; do
			step python3 bench/pytorch/gpt2_step.py --bsz "$BSZ" --seq "$SEQ" --steps "$STEPS" --dtype "$prec" --attn "$attn" "${beside[@]}"
		done
	done
	# The Llama peer: SmolLM-135M's shape with sdpa at bf16.
	beside=()
	if [ -s "$OUT/step/hpcrun-llama-bf16.json" ]; then
		beside=(--hpcrun-json "$OUT/step/hpcrun-llama-bf16.json")
	fi
	step python3 bench/pytorch/gpt2_step.py --model llama --bsz "$BSZ" --seq "$SEQ" --steps "$STEPS" --dtype bf16 --attn sdpa "${beside[@]}"
}

stage_ncu() {
	local ncu=${NCU:-} prec
	[ -n "$ncu" ] || ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
	if [ ! -x "$ncu" ]; then
		echo "== FAILED: no ncu at $ncu (set NCU to Nsight Compute's ncu)"
		fail=1
		return
	fi
	for prec in bf16 tf32; do
		rm -f "$dir/ncu-$prec.csv"
		# ncu follows the env it starts to hpcrun, the process profiled.
		# The clocks as they run (ncu holds them at base otherwise).
		step "$ncu" --metrics gpu__time_duration.sum --clock-control none --print-summary per-kernel --csv --log-file "$dir/ncu-$prec.csv" \
			"${goenv[@]}" "$BIN/hpcrun" bench step --device cuda --precision "$prec" --model gpt2-124m \
			--bsz "$BSZ" --seq "$SEQ" --steps 1 --warmup 0
		# ncu logs its errors (no access to the counters) into the same
		# file: a summary names the metric.
		if ! grep -q gpu__time_duration "$dir/ncu-$prec.csv" 2>/dev/null; then
			echo "== FAILED: ncu wrote no summary for $prec"
			fail=1
		fi
	done
}

failed=()
for st in "${stages[@]}"; do
	dir=$OUT/$st
	mkdir -p "$dir"
	fail=0
	stage_end=$((SECONDS + LIMIT))
	echo
	echo "==== stage $st: log in $dir/log"
	"stage_$st" > >(tee "$dir/log") 2>&1
	wait $! 2>/dev/null
	if [ $fail = 0 ]; then
		echo passed > "$dir/status"
	else
		echo failed > "$dir/status"
		failed+=("$st")
	fi
done
echo
if [ ${#failed[@]} = 0 ]; then
	echo "== gpu-check ${stages[*]}: all passed"
	exit 0
fi
echo "== gpu-check: FAILURES in ${failed[*]} (logs under $OUT)"
exit 1
