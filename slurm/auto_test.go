package slurm

import (
	"os"
	"path/filepath"
	"testing"
)

// fakeSlurmBin puts an sbatch and an scontrol that exits with pingExit on PATH.
func fakeSlurmBin(t *testing.T, pingExit string) {
	t.Helper()
	dir := t.TempDir()
	for name, body := range map[string]string{"sbatch": "exit 0", "scontrol": "exit " + pingExit} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

func TestAutoExecutor(t *testing.T) {
	for _, tc := range []struct {
		ping, want string
	}{
		{"0", "slurm"}, // controller answers
		{"1", "local"}, // client installed, no controller
	} {
		t.Run(tc.want, func(t *testing.T) {
			fakeSlurmBin(t, tc.ping)
			e, err := New("auto")
			if err != nil {
				t.Fatal(err)
			}
			if e.Name() != tc.want {
				t.Errorf("auto with scontrol ping exit %s chose %s, want %s", tc.ping, e.Name(), tc.want)
			}
		})
	}
	t.Run("no sbatch", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		if e, err := New("auto"); err != nil || e.Name() != "local" {
			t.Errorf("auto without sbatch: %v %v", e, err)
		}
		if _, err := New("slurm"); err == nil {
			t.Error("executor slurm without sbatch: no error")
		}
	})
}
