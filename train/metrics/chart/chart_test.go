package chart

import (
	"bytes"
	"errors"
	"flag"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hpcrun/hpcrun/train/metrics"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

func curvesOf(t *testing.T, execid string) metrics.Curves {
	t.Helper()
	run, err := metrics.ReadRun(filepath.Join("..", "testdata", "runs", execid))
	if err != nil {
		t.Fatal(err)
	}
	_, c := metrics.Summarize(run)
	return c
}

func TestTerminalFits80Columns(t *testing.T) {
	for _, tt := range []struct{ name, execid string }{
		{"bert-complete", "20261121-143005-a3f9"},
		{"gpt-partial", "20261121-150002-d4c8"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := Terminal(&buf, curvesOf(t, tt.execid), 80, 10); err != nil {
				t.Fatal(err)
			}
			for i, line := range strings.Split(buf.String(), "\n") {
				if n := utf8.RuneCountInString(line); n > 80 {
					t.Errorf("line %d is %d columns wide: %q", i+1, n, line)
				}
			}
			for _, want := range []string{"training loss", "throughput (samples/s)"} {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("no %q chart", want)
				}
			}
			path := filepath.Join("testdata", tt.name+".txt")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test -update creates it)", err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("terminal chart differs from %s (go test -update rewrites it):\n%s", path, buf.String())
			}
		})
	}
}

func TestNoData(t *testing.T) {
	if err := Terminal(&bytes.Buffer{}, metrics.Curves{}, 80, 10); !errors.Is(err, ErrNoData) {
		t.Errorf("Terminal of nothing: %v", err)
	}
	if err := PNG(filepath.Join(t.TempDir(), "x.png"), metrics.Curves{}, "x"); !errors.Is(err, ErrNoData) {
		t.Errorf("PNG of nothing: %v", err)
	}
}

func TestPNG(t *testing.T) {
	dir := t.TempDir()
	if p := os.Getenv("HPCRUN_KEEP_PNG"); p != "" {
		dir = p
	}
	path := filepath.Join(dir, "run.png")
	if err := PNG(path, curvesOf(t, "20261121-143005-a3f9"), "20261121-143005-a3f9: bert, 4 tasks, tp 2"); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	// Three panels: loss, accuracy, throughput, 2.6 in each at 110 dpi.
	if b := img.Bounds(); b.Dx() != 880 || b.Dy() != 858 {
		t.Errorf("image is %dx%d, want 880x858", b.Dx(), b.Dy())
	}
	// Not blank: the curves put coloured pixels on the white page.
	coloured := 0
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y += 2 {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += 2 {
			r, g, b, _ := img.At(x, y).RGBA()
			if !(r == g && g == b) {
				coloured++
			}
		}
	}
	if coloured < 500 {
		t.Errorf("only %d coloured pixels: the curves are missing", coloured)
	}
	if err := PNG(filepath.Join(dir, "no-such-dir", "x.png"), curvesOf(t, "20261121-143005-a3f9"), "x"); err == nil {
		t.Error("PNG into a missing folder: no error")
	}
}
