package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigFileRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "train.toml")
	cfg := DefaultConfig()
	cfg.NTasks, cfg.TP, cfg.VocabFile = 4, 2, "vocab.txt"
	if err := WriteConfigFile(p, cfg, "run x"); err != nil {
		t.Fatal(err)
	}
	got, err := ReadConfigFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if got != cfg {
		t.Fatalf("read back %+v, wrote %+v", got, cfg)
	}
}

func TestReadConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	tests := []struct{ name, body, want string }{
		{"unknown key", "model = \"bert\"\nlayerz = 3\n", "unknown key(s) layerz"},
		{"bad toml", "model = \n", "training config"},
		{"invalid", "tp = 3\nntasks = 4\n", "not a multiple of tp 3"},
	}
	for _, tt := range tests {
		p := filepath.Join(dir, tt.name+".toml")
		os.WriteFile(p, []byte(tt.body), 0o644)
		if _, err := ReadConfigFile(p); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %q", tt.name, err, tt.want)
		}
	}
	if _, err := ReadConfigFile(filepath.Join(dir, "missing.toml")); err == nil {
		t.Error("missing file: no error")
	}
}

// AbsPaths makes the file paths absolute and leaves "synthetic", empty
// and absolute ones alone.
func TestAbsPaths(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	c := Config{Data: "synthetic", VocabFile: "tok/tokenizer.json", InitFrom: "/abs/gpt2"}
	if err := c.AbsPaths(); err != nil {
		t.Fatal(err)
	}
	if c.Data != "synthetic" || c.VocabFile != filepath.Join(wd, "tok/tokenizer.json") || c.InitFrom != "/abs/gpt2" || c.ResumeFrom != "" {
		t.Errorf("%+v", c)
	}
}

// comm_timeout is a Go duration of a second or more.
func TestCommTimeout(t *testing.T) {
	c := DefaultConfig()
	if c.CommTimeoutDuration() != 0 {
		t.Errorf("unset: %v", c.CommTimeoutDuration())
	}
	c.CommTimeout = "90s"
	if err := c.Validate(); err != nil || c.CommTimeoutDuration() != 90*time.Second {
		t.Errorf("90s: %v, %v", err, c.CommTimeoutDuration())
	}
	for _, bad := range []string{"90", "10ms", "-1s"} {
		c.CommTimeout = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "comm_timeout") {
			t.Errorf("comm_timeout %q: %v", bad, err)
		}
	}
}
