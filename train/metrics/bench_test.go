package metrics

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// benchLines is n step lines as the Writer writes them, with a realistic
// spread of values.
func benchLines(n int) []byte {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for i := 1; i <= n; i++ {
		_ = w.Step(Step{Step: i, Epoch: i / 1000, Loss: 2.5 / float64(1+i%97), LR: 3e-4 * float64(i%100) / 100,
			GradNorm: 0.8123 + float64(i%13)/7, Tokens: 16384, Samples: 32, StepS: 0.1234 + float64(i%11)/1000,
			CommS: 0.0217, MemBytes: 1<<30 + int64(i), MemPeakBytes: 3 << 30, TS: 1.7634e9 + float64(i)*0.125})
	}
	return buf.Bytes()
}

// BenchmarkReadRank reads a rank file of 1,000,000 step lines with ReadRank
// against the peer: the same file read whole and decoded line by line with
// encoding/json, in the same run. One op is the whole million lines.
func BenchmarkReadRank(b *testing.B) {
	data := benchLines(1_000_000)
	path := filepath.Join(b.TempDir(), "rank-00000.jsonl")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Run("hpcrun", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			l, err := ReadRank(path)
			if err != nil || len(l.Steps) != 1_000_000 {
				b.Fatal(err, len(l.Steps))
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			data, err := os.ReadFile(path)
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for line := range bytes.Lines(data) {
				var s Step
				if err := json.Unmarshal(line, &s); err != nil {
					b.Fatal(err)
				}
				n++
			}
			if n != 1_000_000 {
				b.Fatal(n)
			}
		}
	})
}

// BenchmarkReadSummary summarizes a run of one rank file of 1,000,000
// step lines with ReadSummary (streaming, the steps not kept) against the
// peer: the same file read line by line and decoded with encoding/json into
// the same running sums, in the same run. One op is the whole million lines.
func BenchmarkReadSummary(b *testing.B) {
	data := benchLines(1_000_000)
	dir := b.TempDir()
	path := RankFile(dir, 0)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Run("hpcrun", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			s, _, err := ReadSummary(dir, NoCurves)
			if err != nil || s.Step != 1_000_000 {
				b.Fatal(err, s.Step)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			f, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 256<<10), maxLine)
			n, total := 0, 0.0
			times := make([]float64, 0, 1024)
			for sc.Scan() {
				var s Step
				if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
					b.Fatal(err)
				}
				n++
				total += s.StepS
				times = append(times, s.StepS)
			}
			f.Close()
			slices.Sort(times)
			if n != 1_000_000 || total == 0 {
				b.Fatal(n)
			}
		}
	})
}

func ExampleWriter() {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	_ = w.Step(Step{Step: 1, Loss: 0.69, StepS: 0.25, TS: 1})
	fmt.Print(buf.String())
	// Output:
	// {"type":"step","step":1,"epoch":0,"loss":0.69,"lr":0,"grad_norm":0,"tokens":0,"samples":0,"step_s":0.25,"comm_s":0,"mem_bytes":0,"mem_peak_bytes":0,"ts":1}
}
