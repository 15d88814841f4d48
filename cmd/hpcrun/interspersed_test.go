package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/cmdline"
)

func TestInterspersed(t *testing.T) {
	app := newApp()
	for _, tc := range []struct{ in, want string }{
		{"metrics X --plot", "metrics --plot X"},
		{"--json metrics X Y --last 3", "--json metrics --last 3 X Y"},
		{"metrics X --png out.png --width 60", "metrics --png out.png --width 60 X"},
		{"metrics X --png=out.png", "metrics --png=out.png X"},
		{"ckpt merge runs/x -o m.safetensors --force", "ckpt merge -o m.safetensors --force runs/x"},
		{"logs X --err --follow", "logs --err --follow X"},
		{"check all --tp 2", "check --tp 2 all"},
		{"config show --profile jz", "config show --profile jz"},
		{"logs X -- --err", "logs X -- --err"},
		{"metrics X --nosuch", "metrics --nosuch X"},
		{"completion bash", "completion bash"},
		{"", ""},
	} {
		in := append([]string{"hpcrun"}, strings.Fields(tc.in)...)
		want := append([]string{"hpcrun"}, strings.Fields(tc.want)...)
		if got := cmdline.Interspersed(app, in); !slices.Equal(got, want) {
			t.Errorf("%q: got %q, want %q", tc.in, strings.Join(got[1:], " "), tc.want)
		}
	}
}
