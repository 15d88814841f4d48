package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCheckAcrossProcesses runs every equivalence check at tp=2 in two real
// processes over the TCP backend, as `hpcrun check all --tp 2` does on a
// workstation, and reads the JSON table back.
func TestCheckAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun("--json", "check", "all", "--tp", "2")
	var table struct {
		Results []struct {
			Check  string  `json:"check"`
			TP     int     `json:"tp"`
			Pass   bool    `json:"pass"`
			MaxErr float64 `json:"max_err"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &table); err != nil {
		t.Fatalf("check --json: %v\n%s", err, out)
	}
	results := table.Results
	if len(results) < 10 {
		t.Fatalf("%d checks ran, want every layer:\n%s", len(results), out)
	}
	for _, r := range results {
		if !r.Pass || r.TP != 2 {
			t.Errorf("%s at tp %d: pass=%v max err %.3g", r.Check, r.TP, r.Pass, r.MaxErr)
		}
	}
	if _, errOut, code := e.run("check", "NoSuchLayer", "--tp", "2"); code == 0 || !strings.Contains(errOut, "NoSuchLayer") {
		t.Errorf("check of an unknown layer: exit %d, %q", code, errOut)
	}
}
