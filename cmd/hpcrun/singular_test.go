package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestOneIsSingular: a count of 1 reads "1 rank", "1 step", not "x 1
// ranks" as plan's tokens/s line, run's first line and ckpt info did.
func TestOneIsSingular(t *testing.T) {
	e := newEnv(t)
	text := e.mustRun("plan", "--executor", "local", "--ntasks", "1", "--device", "cpu")
	if !strings.Contains(text, " GFLOP/s x 1 rank\n") {
		t.Errorf("plan --ntasks 1 lacks \"x 1 rank\":\n%s", text)
	}
	_, errOut := e.mustRunErr("run", "--nproc", "1", "--preset", "tiny", "--model", "gpt", "--steps", "1", "--device", "cpu")
	text += errOut
	if !strings.Contains(errOut, ": 1 rank (") {
		t.Errorf("run --nproc 1 lacks \": 1 rank (\":\n%s", errOut)
	}
	info := e.mustRun("ckpt", "info", filepath.Base(e.onlyRun()))
	text += info
	if !strings.Contains(info, "(1 rank)") {
		t.Errorf("ckpt info of a 1-rank run lacks \"(1 rank)\":\n%s", info)
	}
	if bad := regexp.MustCompile(`\b1 [a-z]+s\b`).FindAllString(text, -1); len(bad) > 0 {
		t.Errorf("plural after 1: %q", bad)
	}
}
