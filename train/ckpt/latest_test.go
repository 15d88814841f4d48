package ckpt

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A corrupt latest is quoted in part: a 5 MB file does not end up whole
// in the error (and in every log line that repeats it).
func TestLatestCorruptIsQuotedInPart(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, LatestFile), bytes.Repeat([]byte("x"), 5<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Latest(root)
	if err == nil || len(err.Error()) > 300 || !strings.Contains(err.Error(), "5242880 bytes") {
		t.Fatalf("Latest on a 5 MB latest: %d bytes of error (%.200s...), want a short one giving the size", len(err.Error()), err)
	}
	os.WriteFile(filepath.Join(root, LatestFile), []byte("step-x\n"), 0o644)
	if _, err := Latest(root); err == nil || !strings.Contains(err.Error(), `names "step-x", not a step dir`) {
		t.Fatalf("Latest on a short corrupt latest: %v", err)
	}
}
