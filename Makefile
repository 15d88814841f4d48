# hpcrun — make targets. `make run` runs the main job, `make test` the tests.
GO      ?= go
BIN     := bin/hpcrun
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# The tests must fit CI's budget on 2 cores.
TEST_TIMEOUT ?= 15m

.PHONY: all build install test test-unit test-e2e test-portable test-race run bench lint slurm-up slurm-down gpu-check clean fuzz

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/hpcrun

# hpcrun on PATH: go install puts it in $(go env GOPATH)/bin (or GOBIN).
install:
	$(GO) install -ldflags "$(LDFLAGS)" ./cmd/hpcrun

# Unit tests, the portable (no assembly) compute path, the race detector on the
# concurrent packages, then the end-to-end tests. The e2e tests use the local
# one-node Slurm when it can be started (root), and the Local executor always.
# Last, the all-reduce's ratios to Open MPI on 1, 2 and 3 hosts (and one rank on
# each of 2 hosts, the control whose ranks have a core each), printed in the
# suite's output (a record to compare runs by, no assertion on time).
# Every fuzz target runs FUZZTIME inputs (make fuzz: a minute each).
FUZZTIME ?= 2000x
test: build slurm-up-if-root
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...
	HPCRUN_NOASM=1 $(GO) test -count=1 -tags noasm ./tensor/
	$(GO) test -count=1 -race -short ./nccl/ ./tensor/ ./parallel/ ./slurm/ ./idrenv/ ./train/metrics/
	$(GO) test -count=1 -run '^$$' -bench AllReduceVsMPI -benchtime 1x ./cmd/hpcrun
	GO=$(GO) FUZZ_FRESH=1 scripts/fuzz.sh $(FUZZTIME)

# The fuzz targets of every parser of a file a user or another program
# writes, a minute each (FUZZTIME=10m make fuzz for longer).
fuzz:
	GO=$(GO) scripts/fuzz.sh $(if $(filter 2000x,$(FUZZTIME)),1m,$(FUZZTIME))

.PHONY: slurm-up-if-root
slurm-up-if-root:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		scripts/slurm-local.sh up --nodes 3 || scripts/slurm-local.sh up || echo "make: local Slurm did not start; Slurm e2e tests will skip"; \
	else echo "make: not root; Slurm e2e tests will skip unless a Slurm is reachable"; fi

slurm-up:
	scripts/slurm-local.sh up

slurm-down:
	scripts/slurm-local.sh down

# The main job: the tiny BERT at tp=2 x dp=2 on the synthetic set, through
# Slurm when sbatch is on PATH, else the Local executor; then its metrics.
run: build
	$(BIN) submit --ntasks 4 --tp 2 --wait
	$(BIN) metrics --last 1

# Benchmarks print ratios against a peer measured in the same run.
bench:
	CGO_ENABLED=1 $(GO) run -tags openblas ./cmd/hpcrun bench gemm
	$(GO) run ./cmd/hpcrun bench comm --nproc 4
	CGO_ENABLED=1 $(GO) run -tags openblas ./cmd/hpcrun bench step --model gpt2-124m --bsz 4 --seq 64
	$(GO) test ./cmd/hpcrun -run XXX -bench SubmitOverhead -benchtime 40x

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags openblas ./...
	$(GO) run ./scripts/doccheck .

# GPU checks: builds the test and bench binaries into devbin/ here, without
# cgo (they start on any glibc with dlopen; Go is not needed on the GPU
# machine; under 64 MiB together); there, `bench/pytorch/gpu-check.sh run
# [STAGE]...` compiles every kernel with NVRTC, checks every CUDA kernel
# against the CPU device, the NCCL backend, and a GPT-2 124M step beside
# PyTorch eager, in stages that each fit a 10-minute run (README: the calls).
# Where nvidia-smi sees a GPU, a skipped GPU test fails the check.
gpu-check:
	bench/pytorch/gpu-check.sh build
	@echo "copy this checkout (devbin/ included) to the GPU machine; there, from its root: bench/pytorch/gpu-check.sh run [kernels|train|nccl|step|pytorch]..."

clean:
	rm -rf bin
