package train

import (
	"errors"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
)

// The comm path follows --comm and --device and what loads: nccl without
// NCCL is a one-line error naming the library; auto falls back to the host
// ring and says why.
func TestChooseComm(t *testing.T) {
	noNCCL := errors.New("nccl backend: cannot load libnccl.so.2 (install NCCL or add it to LD_LIBRARY_PATH): libnccl.so.2: cannot open shared object file")
	gpu, noGPU := commEnv{}, commEnv{cudaWhy: "cannot load the CUDA driver (tried libcuda.so.1)"}
	for _, c := range []struct {
		comm, device string
		env          commEnv
		backend      string
		note, err    string // substrings; "" = none
	}{
		{"tcp", "cuda", gpu, nccl.BackendAuto, "", ""},
		{"auto", "cpu", gpu, nccl.BackendAuto, "", ""},
		{"auto", "cuda", gpu, nccl.BackendNCCL, "", ""},
		{"auto", "auto", gpu, nccl.BackendNCCL, "", ""},
		{"nccl", "cuda", gpu, nccl.BackendNCCL, "", ""},
		{"auto", "cuda", commEnv{ncclErr: noNCCL}, nccl.BackendAuto, "comm auto: collectives go through host memory (TCP/shared-memory ring): nccl backend: cannot load libnccl.so.2", ""},
		{"nccl", "cuda", commEnv{ncclErr: noNCCL}, "", "", "comm nccl: nccl backend: cannot load libnccl.so.2"},
		{"auto", "auto", noGPU, nccl.BackendAuto, "", ""},
		{"nccl", "cuda", noGPU, "", "", "comm nccl: no CUDA device: cannot load the CUDA driver (tried libcuda.so.1)"},
	} {
		backend, note, err := chooseComm(c.comm, c.device, c.env)
		name := c.comm + "/" + c.device
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s: %v, want one line with %q", name, err, c.err)
			}
			continue
		}
		if err != nil || backend != c.backend {
			t.Errorf("%s: %q, %v; want %q", name, backend, err, c.backend)
		}
		if (c.note == "") != (note == "") || !strings.Contains(note, c.note) {
			t.Errorf("%s: note %q, want %q", name, note, c.note)
		}
	}
}

// On this machine: comm nccl with device cuda fails before anything starts
// when CUDA or NCCL is missing, naming the library; auto picks the host
// ring; a bad value is a config error.
func TestCommBackendHere(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.Device, cfg.Comm = "cuda", "nccl"
	backend, _, err := CommBackend(cfg, nil)
	if nerr := nccl.NCCLAvailable(); nerr != nil {
		if err == nil || !strings.Contains(err.Error(), ".so") || strings.Contains(err.Error(), "\n") {
			t.Errorf("cuda+nccl without NCCL here: %q, %v; want a one-line error naming the library", backend, err)
		}
		t.Log(err)
		cfg.Comm = "auto"
		if backend, _, err := CommBackend(cfg, nil); err != nil || backend != nccl.BackendAuto {
			t.Errorf("auto without NCCL: %q, %v; want %q", backend, err, nccl.BackendAuto)
		}
	} else if err != nil || backend != nccl.BackendNCCL {
		t.Errorf("cuda+nccl with NCCL: %q, %v", backend, err)
	}
	for _, c := range []struct{ comm, device, want string }{
		{"mpi", "auto", `comm "mpi": use auto, tcp or nccl`},
		{"nccl", "cpu", "comm nccl needs device cuda"},
	} {
		cfg := config.DefaultConfig()
		cfg.Comm, cfg.Device = c.comm, c.device
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("comm %s device %s: %v, want %q", c.comm, c.device, err, c.want)
		}
	}
}

// The training log's note: only for a CUDA device whose collectives go
// through host memory.
func TestCommNote(t *testing.T) {
	worlds := nccl.NewInProcess(2)
	defer func() {
		for _, w := range worlds {
			w.Close()
		}
	}()
	cfg := config.DefaultConfig()
	if n := commNote(cfg, tensor.NewCPU(), worlds[0]); n != "" {
		t.Errorf("cpu device: note %q", n)
	}
	cfg.Comm = "tcp"
	if n := commNote(cfg, namedDevice{tensor.NewCPU(), "cuda:0"}, worlds[0]); !strings.Contains(n, "comm tcp") {
		t.Errorf("cuda device, comm tcp: note %q", n)
	}
	if nccl.NCCLAvailable() != nil {
		cfg.Comm = "auto"
		if n := commNote(cfg, namedDevice{tensor.NewCPU(), "cuda:0"}, worlds[0]); !strings.Contains(n, "libnccl.so.2") {
			t.Errorf("cuda device, no NCCL: note %q, want the reason", n)
		}
	}
}

// namedDevice is a CPU device that answers to another name.
type namedDevice struct {
	tensor.Device
	name string
}

func (d namedDevice) Name() string { return d.name }
