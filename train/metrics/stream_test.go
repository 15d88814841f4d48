package metrics

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// stepLine is a step line as the Writer writes it, with values that tell
// apart which write of a step a summary used (loss and step time carry the
// write's tag).
func stepLine(step int, tag float64) string {
	return fmt.Sprintf(`{"type":"step","step":%d,"epoch":0,"loss":%g,"lr":0.001,"grad_norm":0.5,"tokens":512,"samples":16,"step_s":%g,"comm_s":0.01,"mem_bytes":%d,"mem_peak_bytes":%d,"ts":%d}`,
		step, tag+float64(step)/100, 0.1+tag/10+float64(step%3)/1000, 1000+step, 2000+int(tag)*10+step, 1000+step)
}

func runLine(rank, tpRank int) string {
	return fmt.Sprintf(`{"type":"run","v":1,"config":{"model":"gpt","steps":20,"tp":2,"ntasks":2},"rank":%d,"world":2,"tp_rank":%d,"dp_rank":0,"tp":2,"dp":1,"host":"n%d","device":"cpu","total_steps":20,"start":900}`, rank, tpRank, rank)
}

func steps(from, to int, tag float64) []string {
	var out []string
	for s := from; s <= to; s++ {
		out = append(out, stepLine(s, tag))
	}
	return out
}

// writeRank writes lines joined by newlines; tail, when set, follows the
// last newline (a torn line).
func writeRank(t *testing.T, dir string, rank int, lines []string, tail string) {
	t.Helper()
	p := RankFile(dir, rank)
	mustOK(t, os.MkdirAll(filepath.Dir(p), 0o755))
	mustOK(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"+tail), 0o644))
}

// TestReadSummaryResumes checks the streaming reader against ReadRun and
// Summarize on resumed ranks (twice on rank 0, once on rank 1, at other
// steps), with a corrupt line, blank and CRLF lines, step lines only
// encoding/json decodes, a torn last line and a file that is not a rank's.
func TestReadSummaryResumes(t *testing.T) {
	dir := t.TempDir()
	var r0 []string
	r0 = append(r0, runLine(0, 0))
	r0 = append(r0, steps(1, 8, 1)...)
	r0 = append(r0, `{"type":"eval","step":5,"loss":2.5,"accuracy":null,"ts":1005}`, "garbage{{", "", "  ", stepLine(9, 1)+"\r")
	r0 = append(r0, runLine(0, 0)) // resumed from step 5
	r0 = append(r0, steps(6, 10, 2)...)
	r0 = append(r0, runLine(0, 0)) // resumed from step 8
	r0 = append(r0, steps(9, 11, 3)...)
	// A step line with an escaped string: the fast path leaves it to
	// encoding/json, and it still counts.
	r0 = append(r0, strings.Replace(stepLine(12, 3), `"epoch":0`, `"note":"a\"b","epoch":0`, 1))
	r0 = append(r0, `{"type":"eval","step":12,"loss":2.25,"accuracy":null,"ts":1012}`)
	writeRank(t, dir, 0, r0, "")
	var r1 []string
	r1 = append(r1, runLine(1, 1))
	r1 = append(r1, steps(1, 9, 1)...)
	r1 = append(r1, runLine(1, 1)) // resumed from step 3
	r1 = append(r1, steps(4, 12, 4)...)
	writeRank(t, dir, 1, r1, stepLine(13, 4)[:40])
	mustOK(t, os.WriteFile(filepath.Join(dir, "metrics", "rank-x.jsonl"), []byte("hello\n"), 0o644))

	run, err := ReadRun(dir)
	mustOK(t, err)
	want, wantC := Summarize(run)
	if want.Step != 12 || len(want.Problems) != 2 {
		t.Fatalf("ReadRun: step %d, problems %q; the test data is not what it should be", want.Step, want.Problems)
	}
	// rank 0 wrote step 12 in its third run (tag 3), and is tp_rank 0.
	if v := float64(want.LastLoss); math.Abs(v-3.12) > 1e-12 {
		t.Fatalf("ReadRun: last loss %v, want 3.12", v)
	}
	for _, size := range []int{0, 50, 333} {
		t.Run(fmt.Sprintf("block%d", size), func(t *testing.T) {
			if size > 0 {
				defer setBlockSize(size)()
			}
			got, gotC, err := ReadSummary(dir, AllPoints)
			mustOK(t, err)
			sameJSON(t, "summary", got, want)
			sameJSON(t, "curves", gotC, wantC)
		})
	}
}

// TestReadSummaryGuessesTP checks that a run whose first lines are not run
// lines and that has no train.toml (so tp_rank is guessed wrong before the
// run lines are read) still counts each replica once.
func TestReadSummaryGuessesTP(t *testing.T) {
	dir := t.TempDir()
	for r := range 2 {
		lines := []string{`{"type":"gpu","index":0,"mem_used_bytes":1,"mem_total_bytes":2,"util_pct":50,"ts":1000}`, runLine(r, r)}
		writeRank(t, dir, r, append(lines, steps(1, 10, float64(r))...), "")
	}
	run, err := ReadRun(dir)
	mustOK(t, err)
	want, _ := Summarize(run)
	got, _, err := ReadSummary(dir, NoCurves)
	mustOK(t, err)
	sameJSON(t, "summary", got, want)
	// One replica of 16 samples per step.
	if v := float64(got.SamplesPerS) * float64(got.StepP50S); v < 14 || v > 18 {
		t.Errorf("samples per step about %v, want 16 (one replica)", v)
	}
}

func TestReadSummaryErrors(t *testing.T) {
	if _, _, err := ReadSummary(filepath.Join(t.TempDir(), "nope"), NoCurves); err == nil || !strings.Contains(err.Error(), "no such run") {
		t.Errorf("missing run: %v", err)
	}
	f := filepath.Join(t.TempDir(), "file")
	mustOK(t, os.WriteFile(f, nil, 0o644))
	if _, _, err := ReadSummary(f, NoCurves); err == nil || !strings.Contains(err.Error(), "not a run directory") {
		t.Errorf("file: %v", err)
	}
}

func sameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	g, err := json.MarshalIndent(got, "", " ")
	mustOK(t, err)
	w, err := json.MarshalIndent(want, "", " ")
	mustOK(t, err)
	if string(g) != string(w) {
		t.Errorf("%s differs from ReadRun's:\ngot:\n%s\nwant:\n%s", what, g, w)
	}
}

// TestReadSummaryPoints checks that bounded curves keep evenly spaced
// points of the full curves, the first and last steps included.
func TestReadSummaryPoints(t *testing.T) {
	dir := t.TempDir()
	writeRank(t, dir, 0, append([]string{runLine(0, 0)}, steps(1, 1000, 1)...), "")
	_, all, err := ReadSummary(dir, AllPoints)
	mustOK(t, err)
	if len(all.Steps) != 1000 {
		t.Fatalf("AllPoints: %d points, want 1000", len(all.Steps))
	}
	_, none, err := ReadSummary(dir, NoCurves)
	mustOK(t, err)
	if none.Steps != nil {
		t.Errorf("NoCurves: %d points", len(none.Steps))
	}
	for _, max := range []int{1, 7, 50, 600} {
		_, c, err := ReadSummary(dir, max)
		mustOK(t, err)
		n := len(c.Steps)
		if n > 2*max+1 || n < min(max, 1000) || c.Steps[0] != 1 || c.Steps[n-1] != 1000 {
			t.Fatalf("points %d: %d points from step %v to %v", max, n, c.Steps[0], c.Steps[n-1])
		}
		for i, s := range c.Steps {
			j := int(s) - 1
			if c.Loss[i] != all.Loss[j] || c.SamplesPerS[i] != all.SamplesPerS[j] {
				t.Fatalf("points %d: point %d (step %v) is not the full curve's", max, i, s)
			}
			if i > 1 && i < n-1 && s-c.Steps[i-1] != c.Steps[1]-c.Steps[0] {
				t.Fatalf("points %d: steps %v are not evenly spaced", max, c.Steps)
			}
		}
	}
}

// TestLongLineSkipped: a line longer than maxLine (16 MiB) is skipped as a
// problem, and the rank's lines after it count, in ReadRank and in
// ReadSummary (with blocks of the default size and of 4 KiB, so that the
// long line spans thousands): it made the whole rank file a problem in
// both, so that 'hpcrun metrics' dropped the rank, while the dashboard
// skipped only the line. Long lines just past the limit, of 17 MiB, two in
// a row, and last in the file with and without a newline.
func TestLongLineSkipped(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	for _, tc := range []struct {
		name  string
		lines []string
		tail  string
		want  []string // problems of rank 0
	}{
		{"17MiB", append(append(append([]string{runLine(0, 0)}, steps(1, 5, 1)...), long(17<<20)), steps(6, 10, 1)...), "",
			[]string{":7: 17825792 bytes, longer than 16 MiB: skipped"}},
		{"just past", append(append(append([]string{runLine(0, 0)}, steps(1, 5, 1)...), long(maxLine+1)), steps(6, 10, 1)...), "",
			[]string{":7: 16777217 bytes, longer than 16 MiB: skipped"}},
		{"two in a row", append(append(append([]string{runLine(0, 0)}, steps(1, 5, 1)...), long(17<<20), long(maxLine+5)), steps(6, 10, 1)...), "",
			[]string{":7: 17825792 bytes, longer than 16 MiB: skipped", ":8: 16777221 bytes, longer than 16 MiB: skipped"}},
		{"last", append(append([]string{runLine(0, 0)}, steps(1, 10, 1)...), long(17<<20)), "",
			[]string{":12: 17825792 bytes, longer than 16 MiB: skipped"}},
		{"last without newline", append([]string{runLine(0, 0)}, steps(1, 10, 1)...), long(17 << 20),
			[]string{":12: 17825792 bytes, longer than 16 MiB: skipped"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeRank(t, dir, 0, tc.lines, tc.tail)
			writeRank(t, dir, 1, append([]string{runLine(1, 1)}, steps(1, 10, 1)...), "")
			run, err := ReadRun(dir)
			mustOK(t, err)
			if len(run.Ranks) != 2 || len(run.Ranks[0].Steps) != 10 || run.Ranks[0].Steps[9].Step != 10 {
				t.Fatalf("ReadRun: %d ranks, problems %v; want rank 0 with its 10 steps", len(run.Ranks), run.Problems)
			}
			var got []string
			for _, p := range run.Problems {
				got = append(got, strings.TrimPrefix(p.String(), RankFile(dir, 0)))
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("ReadRun: problems %q, want %q", got, tc.want)
			}
			want, _ := Summarize(run)
			if want.Step != 10 || want.Ranks != 2 {
				t.Errorf("ReadRun's summary: step %d of %d ranks, want 10 of 2", want.Step, want.Ranks)
			}
			for _, size := range []int{0, 4 << 10} {
				if size > 0 {
					defer setBlockSize(size)()
				}
				got, _, err := ReadSummary(dir, NoCurves)
				mustOK(t, err)
				sameJSON(t, fmt.Sprintf("ReadSummary's summary (blocks %d)", size), got, want)
			}
		})
	}
}

// zeros reads as n zero bytes.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), z.n)]
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

// TestLongLineReadInPieces: a line of 256 MiB is dropped in pieces, not
// read whole into memory first, by ParseRank (ReadRank's reader) from a
// stream and by ReadSummary from a sparse file: each allocates what the
// first 16 MiB of the line take (about 64 MiB), not the line.
func TestLongLineReadInPieces(t *testing.T) {
	const size = 256 << 20
	head := strings.Join(append([]string{runLine(0, 0)}, steps(1, 5, 1)...), "\n") + "\n"
	tail := "\n" + strings.Join(steps(6, 10, 1), "\n") + "\n"
	var ms runtime.MemStats
	allocated := func(read func()) uint64 {
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		read()
		runtime.ReadMemStats(&ms)
		return ms.TotalAlloc - before
	}
	if n := allocated(func() {
		l, err := ParseRank(io.MultiReader(strings.NewReader(head), &zeros{size}, strings.NewReader(tail)), "rank-00000.jsonl")
		mustOK(t, err)
		if len(l.Steps) != 10 || len(l.Problems) != 1 || l.Problems[0].Msg != "268435456 bytes, longer than 16 MiB: skipped" {
			t.Errorf("ParseRank: %d steps, problems %v", len(l.Steps), l.Problems)
		}
	}); n > size/2 {
		t.Errorf("ParseRank allocated %d MiB for a %d MiB line", n>>20, size>>20)
	}

	dir := t.TempDir()
	p := RankFile(dir, 0)
	mustOK(t, os.MkdirAll(filepath.Dir(p), 0o755))
	mustOK(t, os.WriteFile(p, []byte(head), 0o644))
	if err := os.Truncate(p, int64(len(head))+size); err != nil {
		t.Skipf("no sparse file here: %v", err)
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	mustOK(t, err)
	_, err = f.WriteString(tail)
	mustOK(t, err)
	mustOK(t, f.Close())
	if n := allocated(func() {
		s, _, err := ReadSummary(dir, NoCurves)
		mustOK(t, err)
		if s.Step != 10 || len(s.Problems) != 1 {
			t.Errorf("ReadSummary: step %d, problems %v", s.Step, s.Problems)
		}
	}); n > size/2 {
		t.Errorf("ReadSummary allocated %d MiB for a file of a %d MiB line", n>>20, size>>20)
	}
}

// TestWallTimeSumsSegments: a run resumed (or requeued) appends a segment
// to each rank file; its wall time is the sum of the segments', not the
// last segment's (2.21 s became 159 ms after a resume).
func TestWallTimeSumsSegments(t *testing.T) {
	dir := t.TempDir()
	for r := range 2 {
		lines := []string{runLine(r, r)}
		lines = append(lines, steps(1, 5, 1)...)
		lines = append(lines, `{"type":"end","status":"interrupted","error":"stopped","wall_s":2.05,"ts":1006}`, runLine(r, r))
		lines = append(lines, steps(6, 20, 2)...)
		lines = append(lines, `{"type":"end","status":"completed","wall_s":0.159,"ts":1021}`)
		writeRank(t, dir, r, lines, "")
	}
	s, _, err := ReadSummary(dir, NoCurves)
	mustOK(t, err)
	if s.Status != StatusCompleted || math.Abs(float64(s.WallS)-2.209) > 1e-9 {
		t.Errorf("status %s, wall %v s; want completed after 2.05 + 0.159 = 2.209 s", s.Status, s.WallS)
	}
}

// TestSettleKilledRanks: ranks that wrote no end line when the job is
// over were killed; they are named before a peer that failed for want of
// them, and the run is failed, not running forever.
func TestSettleKilledRanks(t *testing.T) {
	dir := t.TempDir()
	writeRank(t, dir, 0, append([]string{runLine(0, 0)}, steps(1, 5, 1)...), "")
	writeRank(t, dir, 1, append(append([]string{runLine(1, 1)}, steps(1, 5, 1)...),
		`{"type":"end","status":"failed","error":"step 6: rank 0 (n0): process exited or lost its connection","wall_s":1,"ts":1006}`), "")
	s, _, err := ReadSummary(dir, NoCurves)
	mustOK(t, err)
	s.Settle(JobState{ExecID: "x"})
	if s.Status != StatusFailed || !strings.HasPrefix(s.Error, "rank 1: ") {
		t.Fatalf("job going on: status %s, error %q; want rank 1's failure as it wrote it", s.Status, s.Error)
	}
	s.Settle(JobState{State: "FAILED", Over: true, ExecID: "x"})
	if s.Status != StatusFailed || !strings.HasPrefix(s.Error, "rank 0 wrote no end line before the job ended FAILED") || !strings.Contains(s.Error, "then rank 1: step 6") {
		t.Errorf("status %s, error %q; want failed, rank 0 named first", s.Status, s.Error)
	}

	writeRank(t, dir, 1, append([]string{runLine(1, 1)}, steps(1, 5, 1)...), "")
	s, _, _ = ReadSummary(dir, NoCurves)
	s.Settle(JobState{State: "CANCELLED", Over: true, ExecID: "x"})
	if s.Status != StatusFailed || !strings.HasPrefix(s.Error, "ranks 0-1 wrote no end line") {
		t.Errorf("every rank killed: status %s, error %q", s.Status, s.Error)
	}
}

// TestSettleRequeued: a run stopped by the time-limit signal whose job is
// pending again is requeued, with its restart count, not interrupted.
func TestSettleRequeued(t *testing.T) {
	dir := t.TempDir()
	for r := range 2 {
		writeRank(t, dir, r, append(append([]string{runLine(r, r)}, steps(1, 5, 1)...),
			`{"type":"end","status":"interrupted","error":"step 5 of 20, checkpoint saved: stopped by the time-limit signal (USR1); requeued job 7 (restart 1 of at most 10), it resumes from the checkpoint","wall_s":1,"ts":1006}`), "")
	}
	s, _, err := ReadSummary(dir, NoCurves)
	mustOK(t, err)
	if s.Status != StatusInterrupted {
		t.Fatalf("status %s before settling, want interrupted", s.Status)
	}
	s.Settle(JobState{State: "PENDING", ExecID: "x", Restarts: 1, MaxRestarts: 10})
	if s.Status != StatusRequeued || s.Error != "restart 1 of at most 10, job pending: it resumes from its checkpoint" {
		t.Errorf("requeued job: status %s, %q", s.Status, s.Error)
	}
}
