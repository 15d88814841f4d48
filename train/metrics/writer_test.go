package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestWriterRoundTrip(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"model": "bert", "tp": 2, "ntasks": 4, "steps": 10})
	mustOK(t, w.Run(RunInfo{Config: cfg, Rank: 3, World: 4, TPRank: 1, DPRank: 1, TP: 2, DP: 2, Host: "n1", Device: "cpu", FlopsPerToken: math.NaN()}))
	mustOK(t, w.Step(Step{Step: 1, Loss: 0.69, LR: 1e-3, GradNorm: 1.5, Tokens: 512, Samples: 16, StepS: 0.25, CommS: 0.05, MemBytes: 1 << 20, MemPeakBytes: 2 << 20}))
	mustOK(t, w.Step(Step{Step: 2, Loss: math.NaN(), LR: math.Inf(1), StepS: 0.2}))
	mustOK(t, w.Eval(Eval{Step: 2, Loss: 0.6, Accuracy: math.NaN()}))
	mustOK(t, w.GPU(GPUSample{Index: 1, MemUsedBytes: 5 << 30, MemTotalBytes: 80 << 30, UtilPct: 97}))
	mustOK(t, w.End("", errors.New("boom \"quoted\"\nnext"), 1500*time.Millisecond))
	mustOK(t, w.Close())
	if err := w.Step(Step{Step: 3}); err == nil {
		t.Error("Step after Close: no error")
	}

	l, err := ReadRank(RankFile(dir, 3))
	if err != nil {
		t.Fatal(err)
	}
	if l.Rank != 3 || len(l.Problems) != 0 || l.Torn {
		t.Fatalf("rank %d problems %v torn %v", l.Rank, l.Problems, l.Torn)
	}
	if l.Info == nil || l.Info.V != Version || l.Info.TPRank != 1 || l.Info.Host != "n1" || l.Info.Start == 0 {
		t.Fatalf("run line: %+v", l.Info)
	}
	if !strings.Contains(string(l.Info.Config), `"model":"bert"`) {
		t.Errorf("config: %s", l.Info.Config)
	}
	if len(l.Steps) != 2 || l.Steps[0].Tokens != 512 || l.Steps[0].MemPeakBytes != 2<<20 || l.Steps[0].TS == 0 {
		t.Fatalf("steps: %+v", l.Steps)
	}
	if !math.IsNaN(l.Steps[1].Loss) || !math.IsNaN(l.Steps[1].LR) {
		t.Errorf("NaN/Inf loss, lr read as %v, %v; want NaN", l.Steps[1].Loss, l.Steps[1].LR)
	}
	if len(l.Evals) != 1 || !math.IsNaN(l.Evals[0].Accuracy) || l.Evals[0].Loss != 0.6 {
		t.Errorf("evals: %+v", l.Evals)
	}
	if len(l.GPU) != 1 || l.GPU[0].MemUsedBytes != 5<<30 || l.GPU[0].UtilPct != 97 {
		t.Errorf("gpu: %+v", l.GPU)
	}
	if l.End == nil || l.End.Status != StatusFailed || l.End.Error != "boom \"quoted\"\nnext" || l.End.WallS != 1.5 {
		t.Errorf("end: %+v", l.End)
	}
}

func TestWriterAppendsAndRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	for range 2 {
		w, err := Create(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		mustOK(t, w.Step(Step{Step: 1}))
		mustOK(t, w.Close())
	}
	b, _ := os.ReadFile(RankFile(dir, 0))
	if n := bytes.Count(b, []byte("\n")); n != 2 {
		t.Errorf("after two writers: %d lines, want 2 (append)", n)
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.Run(RunInfo{Config: json.RawMessage(`[1,2]`)}); err == nil {
		t.Error("config that is not an object: no error")
	}
	if _, err := Create(dir, -1); err == nil {
		t.Error("negative rank: no error")
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fullDiskChild, set in the environment, makes the test binary a rank that
// writes its metrics into a file it may not grow past that many bytes (a
// full disk, by RLIMIT_FSIZE): the writes that do not fit fail part way.
const fullDiskChild = "HPCRUN_TEST_METRICS_FSIZE"

func TestMain(m *testing.M) {
	if v := os.Getenv(fullDiskChild); v != "" {
		dir, limit, _ := strings.Cut(v, ":")
		n, _ := strconv.ParseUint(limit, 10, 64)
		w, err := Create(dir, 0)
		if err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: n, Max: n}); err != nil {
			fmt.Println(err)
			os.Exit(2)
		}
		err = w.Run(RunInfo{Rank: 0, World: 1, Host: "n1"})
		for i := 1; err == nil; i++ {
			err = w.Step(Step{Step: i, Loss: 0.5, LR: 1e-3, StepS: 0.1})
		}
		fmt.Println(err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A write that does not fit on the disk leaves no half line: the file
// ends with a whole line, and the run that resumes after it (submit
// --resume) writes lines that read back, its run line first.
func TestWriterFullDiskLeavesWholeLines(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fullDiskChild+"="+dir+":1000")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "file too large") {
		t.Fatalf("full-disk rank: %v: %s", err, out)
	}
	b, err := os.ReadFile(RankFile(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		t.Fatalf("after the failed write the file ends in a torn line: ...%q", b[max(0, len(b)-60):])
	}
	w, err := Create(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, w.Run(RunInfo{Rank: 0, World: 1, Host: "resumed"}))
	mustOK(t, w.Step(Step{Step: 100, Loss: 0.25}))
	mustOK(t, w.Close())
	l, err := ReadRank(RankFile(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Problems) != 0 || l.Torn || l.Info == nil || l.Info.Host != "resumed" || l.Steps[len(l.Steps)-1].Step != 100 {
		t.Fatalf("after resuming: problems %v torn %v run line %+v", l.Problems, l.Torn, l.Info)
	}
}

// A line an earlier process left without its newline (killed while
// writing it) is removed when the file is opened again, so the next run
// line does not stick to it.
func TestCreateCutsATornTail(t *testing.T) {
	dir := t.TempDir()
	path := RankFile(dir, 1)
	os.MkdirAll(filepath.Dir(path), 0o755)
	whole := `{"type":"step","step":1,"loss":0.5}` + "\n"
	if err := os.WriteFile(path, []byte(whole+`{"type":"step","step":2,"lo`), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := Create(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, w.Run(RunInfo{Rank: 1, World: 2, Host: "again"}))
	mustOK(t, w.Close())
	l, err := ReadRank(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Problems) != 0 || l.Info == nil || l.Info.Host != "again" || len(l.Steps) != 1 {
		t.Fatalf("problems %v run line %+v steps %v", l.Problems, l.Info, l.Steps)
	}
}

// A file already torn by an older writer (a fragment with the next whole
// line stuck to it) still yields that line: the reader finds where it
// begins, and reports the fragment.
func TestReaderRecoversALineStuckToAFragment(t *testing.T) {
	in := `{"type":"run","v":1,"rank":0,"world":2,"host":"old"}` + "\n" +
		`{"type":"step","step":1,"loss":0.5}` + "\n" +
		`{"type":"step","step":2,"lo{"type":"run","v":1,"rank":0,"world":2,"host":"new"}` + "\n" +
		`{"type":"step","step":2,"loss":0.4}` + "\n"
	l, err := ParseRank(strings.NewReader(in), "rank-00000.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if l.Info == nil || l.Info.Host != "new" || len(l.Steps) != 2 || len(l.Problems) != 1 || !strings.Contains(l.Problems[0].Msg, "torn") {
		t.Fatalf("run line %+v, steps %v, problems %v", l.Info, l.Steps, l.Problems)
	}
}

// AppendEnd gives a rank that failed before training an end line: in a
// new file, and after a line an earlier process left torn; a file that
// cannot be opened is left as it is.
func TestAppendEnd(t *testing.T) {
	dir := t.TempDir()
	AppendEnd(dir, 3, false, errors.New("rank 2 (n2): metrics: is a directory"), 2*time.Second)
	l, err := ReadRank(RankFile(dir, 3))
	if err != nil {
		t.Fatal(err)
	}
	if l.End == nil || l.End.Status != StatusFailed || l.End.Error != "rank 2 (n2): metrics: is a directory" || l.End.WallS != 2 {
		t.Errorf("end %+v: want failed, quoting the error, after 2 s", l.End)
	}
	if err := os.WriteFile(RankFile(dir, 4), []byte(`{"type":"step","step":1`), 0o644); err != nil {
		t.Fatal(err)
	}
	AppendEnd(dir, 4, true, errors.New("stopped"), time.Second)
	if l, err = ReadRank(RankFile(dir, 4)); err != nil || l.End == nil || l.End.Status != StatusInterrupted || l.Torn || len(l.Problems) != 0 {
		t.Errorf("after a torn line: %+v, %v", l, err)
	}
	bad := RankFile(dir, 5)
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	AppendEnd(dir, 5, false, errors.New("x"), 0)
	if st, err := os.Stat(bad); err != nil || !st.IsDir() {
		t.Errorf("an unopenable file: %v", err)
	}
}

// TestCreateRefusesLinks: a rank file replaced by a symbolic link to a
// user's file, or a metrics folder that is a link, is refused: before, a
// resume cut the user's file back to its last newline and appended JSON
// to it.
func TestCreateRefusesLinks(t *testing.T) {
	run := t.TempDir()
	victim := filepath.Join(t.TempDir(), "thesis.txt")
	mustOK(t, os.WriteFile(victim, []byte("chapter 1\nnot done"), 0o644))
	mustOK(t, os.MkdirAll(filepath.Join(run, "metrics"), 0o755))
	mustOK(t, os.Symlink(victim, RankFile(run, 0)))
	if w, err := Create(run, 0); err == nil || !strings.Contains(err.Error(), "is a symbolic link") {
		if w != nil {
			w.Close()
		}
		t.Errorf("Create over a link: %v, want a refusal naming the link", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "chapter 1\nnot done" {
		t.Errorf("the linked file was changed: %q", b)
	}

	run2 := t.TempDir()
	mustOK(t, os.Symlink(t.TempDir(), filepath.Join(run2, "metrics")))
	if _, err := Create(run2, 0); err == nil || !strings.Contains(err.Error(), "not a folder of the run dir") {
		t.Errorf("Create in a linked metrics folder: %v, want a refusal", err)
	}
	fifo := t.TempDir()
	mustOK(t, os.MkdirAll(filepath.Join(fifo, "metrics"), 0o755))
	mustOK(t, syscall.Mkfifo(RankFile(fifo, 0), 0o644))
	if _, err := Create(fifo, 0); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("Create over a FIFO: %v, want a refusal", err)
	}
}
