package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// BenchmarkSubmitOverhead submits the same trivial job script through bare
// `sbatch --parsable` and through `hpcrun submit`, alternating, on the local
// Slurm, and reports what hpcrun adds (the bar: 50 ms) and the ratio.
func BenchmarkSubmitOverhead(b *testing.B) {
	if exec.Command("sinfo").Run() != nil {
		b.Skip("Slurm is not up (sinfo fails); as root: scripts/slurm-local.sh up")
	}
	e := newEnv(b)
	// The jobs only run `true`; those still queued at the end are cancelled.
	name := fmt.Sprintf("hpcrun-bench-%d", os.Getpid())
	b.Cleanup(func() { exec.Command("scancel", "--name", name).Run() })
	src, err := os.ReadFile(filepath.Join("..", "..", "templates", "sbatch.tmpl"))
	if err != nil {
		b.Fatal(err)
	}
	tmpl := filepath.Join(e.dir, "true.tmpl")
	os.WriteFile(tmpl, regexp.MustCompile(`(?m)^srun .*$`).ReplaceAll(src, []byte("true")), 0o644)
	script := filepath.Join(e.dir, "bare.sbatch")
	bareDir := filepath.Join(e.dir, "runs", "bare")
	os.MkdirAll(bareDir, 0o755)
	dry := e.mustRun("submit", "--executor", "slurm", "--template", tmpl, "--name", name, "--dry-run")
	dry = regexp.MustCompile(regexp.QuoteMeta(e.dir)+`/runs/[0-9-]+`).ReplaceAllString(dry, bareDir)
	os.WriteFile(script, []byte(dry), 0o644)
	e.mustRun("submit", "--executor", "slurm", "--template", tmpl, "--name", name) // warm the binary hash cache

	var bare, hp time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if out, err := exec.Command("sbatch", "--parsable", script).CombinedOutput(); err != nil {
			b.Fatalf("sbatch: %v: %s", err, out)
		}
		t1 := time.Now()
		e.mustRun("submit", "--executor", "slurm", "--template", tmpl, "--name", name)
		t2 := time.Now()
		bare += t1.Sub(t0)
		hp += t2.Sub(t1)
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(b.N) }
	b.ReportMetric(ms(bare), "sbatch-ms/op")
	b.ReportMetric(ms(hp), "hpcrun-ms/op")
	b.ReportMetric(ms(hp-bare), "overhead-ms/op")
	b.ReportMetric(float64(hp)/float64(bare), "ratio")
}
