// Package traintest holds what the tests of train and of its packages
// share: the small test model, its test text, and a Python with NumPy for
// the independent references.
package traintest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

// SmallConfig is the small test model of the given kind: 2 blocks of dim
// 32, 4 heads, 16 positions, batch 8, 20 steps on 2048 samples.
func SmallConfig(model string) config.Config {
	cfg := config.DefaultConfig()
	cfg.Model = model
	cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq = 2, 32, 4, 16
	cfg.BatchSize, cfg.Steps, cfg.Warmup, cfg.EvalEvery, cfg.EvalSamples = 8, 20, 5, 0, 32
	cfg.Samples = 2048
	return cfg
}

// TextFile writes the tests' text, about 20 KB of five words and digits,
// in t's temporary dir and returns its path.
func TextFile(t *testing.T) string {
	t.Helper()
	var sb strings.Builder
	words := []string{"alpha", "beta", "gamma", "delta", "epsilon"}
	for i := 0; sb.Len() < 20000; i++ {
		fmt.Fprintf(&sb, "%s %s %d. ", words[i%5], words[(i*3+1)%5], i%7)
	}
	p := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(p, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// NumpyPython is a python3 that imports NumPy (Debian's python3-numpy):
// the one on PATH, else the system's.
func NumpyPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import numpy").Run() == nil {
			return py
		}
	}
	t.Fatal("no python3 with NumPy: install python3-numpy (.ci/run does)")
	return ""
}
