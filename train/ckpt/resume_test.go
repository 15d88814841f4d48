package ckpt

import (
	"os"
	"path/filepath"
	"testing"
)

func TestResumePoint(t *testing.T) {
	root := t.TempDir()
	if from, err := ResumePoint(root); err != nil || from != "the start (no checkpoint yet)" {
		t.Errorf("no checkpoint: %q, %v", from, err)
	}
	if from, err := ResumePoint(filepath.Join(root, "none")); err != nil || from != "the start (no checkpoint yet)" {
		t.Errorf("no ckpt dir: %q, %v", from, err)
	}
	os.MkdirAll(filepath.Join(root, StepDir(3)), 0o755)
	os.WriteFile(filepath.Join(root, LatestFile), []byte(StepDir(3)+"\n"), 0o644)
	if _, err := ResumePoint(root); err == nil {
		t.Error("a latest checkpoint that does not open: no error")
	}
}
