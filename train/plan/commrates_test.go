package plan

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// TestSaveCommFitConcurrentWriters: writers of cpu-comm.json at the same
// time (bench comm runs of other paths or rank counts) each keep their fit
// beside the others', in a whole file: each read the file, added its fit
// and renamed its copy over it, so that the last rename dropped what the
// writers before it had added.
func TestSaveCommFitConcurrentWriters(t *testing.T) {
	if spec := os.Getenv("HPCRUN_TEST_COMM_WRITER"); spec != "" {
		// A child process: save the fits of ranks n..n+per-1 of a path.
		var path string
		var n, per int
		fmt.Sscanf(spec, "%s %d %d", &path, &n, &per)
		for i := range per {
			if _, err := SaveCommFit(CommFit{Path: path, NRanks: n + i, Nodes: 1, LatencyS: 1e-5, BusGBs: float64(n + i)}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		os.Exit(0)
	}
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	const procs, per = 4, 10
	var wg sync.WaitGroup
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestSaveCommFitConcurrentWriters$")
			cmd.Env = append(os.Environ(), "HPCRUN_TEST_COMM_WRITER=path"+strconv.Itoa(p)+" 2 "+strconv.Itoa(per))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("writer %d: %v\n%s", p, err, out)
			}
		}()
	}
	wg.Wait()
	r, err := ReadCommRates(filepath.Join(cache, "hpcrun", "cpu-comm.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Fits) != procs*per {
		t.Errorf("%d fits in cpu-comm.json, want the %d the writers saved", len(r.Fits), procs*per)
	}
	for p := range procs {
		for i := range per {
			if f := r.Lookup("path"+strconv.Itoa(p), 2+i); f == nil || f.NRanks != 2+i || f.BusGBs != float64(2+i) {
				t.Errorf("path%d at %d ranks: %+v", p, 2+i, f)
			}
		}
	}
	if left, _ := filepath.Glob(filepath.Join(cache, "hpcrun", ".cpu-comm.json.tmp*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
