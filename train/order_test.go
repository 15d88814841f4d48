package train

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
)

// orderCase is a data set whose samples carry their place in the file: the
// number a test reads back from a batch with id.
type orderCase struct {
	name string
	cfg  config.Config
	id   func(d *data.Data, b *data.Batch, i int) int
}

// orderCases writes a CSV of 41 reviews "rNN" (37 train, 4 validate), a text
// of 42 numbers "NNN " and a token file of 42 runs of four equal tokens (41
// windows of 4 each, 37 to train): every sample says which it is.
func orderCases(t *testing.T) []orderCase {
	t.Helper()
	dir := t.TempDir()
	var csv strings.Builder
	csv.WriteString("review,sentiment\n")
	for i := range 41 {
		fmt.Fprintf(&csv, "r%02d film,%d\n", i, i%2)
	}
	var text strings.Builder
	tokens := make([]int, 0, 168)
	for i := range 42 {
		fmt.Fprintf(&text, "%03d ", i)
		tokens = append(tokens, i, i, i, i)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bin := filepath.Join(dir, "tokens.bin")
	if err := data.WriteTokenFile(bin, tokens, 256); err != nil {
		t.Fatal(err)
	}
	bert, gpt := smallConfig("bert"), smallConfig("gpt")
	bert.Data = write("reviews.csv", []byte(csv.String()))
	gpt.Data, gpt.Seq = write("text.txt", []byte(text.String())), 4
	tok := gpt
	tok.Data, tok.Tokenizer = bin, "byte"
	review := func(d *data.Data, b *data.Batch, i int) int {
		row := b.Tokens[i*b.T : (i+1)*b.T]
		ids := make([]int, 0, b.Lengths[i]-1)
		for _, id := range row[1:b.Lengths[i]] {
			ids = append(ids, int(id))
		}
		var n int
		if _, err := fmt.Sscanf(d.Tokenizer.Decode(ids), "r%d", &n); err != nil {
			t.Fatalf("sample %v: %v", row, err)
		}
		return n
	}
	window := func(d *data.Data, b *data.Batch, i int) int {
		n, err := strconv.Atoi(string(rune(b.Tokens[i*b.T])) + string(rune(b.Tokens[i*b.T+1])) + string(rune(b.Tokens[i*b.T+2])))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	first := func(d *data.Data, b *data.Batch, i int) int { return int(b.Tokens[i*b.T]) }
	return []orderCase{{"csv", bert, review}, {"text", gpt, window}, {"tokens", tok, first}}
}

// stepsSeen returns, per rank, the samples each of steps optimizer steps
// takes (all its micro-batches), as the trainer of cfg gathers them.
func stepsSeen(t *testing.T, cfg config.Config, ds *data.Data, steps int, id func(*data.Data, *data.Batch, int) int) [][][]int {
	t.Helper()
	seen := make([][][]int, cfg.NTasks)
	err := nccl.RunInProcess(cfg.NTasks, func(c nccl.Comm) error {
		tr, err := newTrainer(cfg, c, Options{Data: ds}, nil)
		if err != nil {
			return err
		}
		defer tr.close()
		for range steps {
			var ids []int
			b := new(data.Batch)
			for range cfg.Micro() {
				tr.nextBatch(b)
				for i := range b.B {
					ids = append(ids, id(ds, b, i))
				}
			}
			seen[c.Rank()] = append(seen[c.Rank()], ids)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return seen
}

// TestBatchOrder reads which samples each step takes from a CSV, a text and a
// token file, shuffled and not, at dp 1 with bsz 10, dp 2 with bsz 5 and dp 1
// with 2 micro-batches of 5. The three take the same samples each step, dp
// rank r the r-th of every two. With --shuffle=false they are the training
// samples in file order, each epoch alike; an epoch's 37 samples make 3 steps
// of 10 and the 7 left are dropped at every layout (at dp 2 rank 0 has 19, at
// 2 micro-batches they make a seventh micro-batch of 5: no step mixes two
// epochs). Shuffled, an epoch is 30 distinct training samples in an order
// that is not the file's and changes with the epoch.
func TestBatchOrder(t *testing.T) {
	const steps, perEpoch = 7, 3 // two epochs and a step
	for _, c := range orderCases(t) {
		for _, shuffle := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/shuffle=%v", c.name, shuffle), func(t *testing.T) {
				cfg := c.cfg
				cfg.Shuffle, cfg.Samples, cfg.Steps = shuffle, 0, steps
				ds, err := data.Prepare(cfg)
				if err != nil {
					t.Fatal(err)
				}
				file := trainInFileOrder(t, c, ds)
				if len(file) != 37 {
					t.Fatalf("%d training samples, want 37", len(file))
				}

				cfg.NTasks, cfg.BatchSize, cfg.GradAccum = 1, 10, 1
				one := stepsSeen(t, cfg, ds, steps, c.id)[0]
				cfg.NTasks, cfg.BatchSize = 2, 5
				dp2 := stepsSeen(t, cfg, ds, steps, c.id)
				cfg.NTasks, cfg.GradAccum = 1, 2
				accum := stepsSeen(t, cfg, ds, steps, c.id)[0]
				t.Logf("dp 1 steps 1-3: %v", one[:3])

				for s, ids := range one {
					for r := range 2 {
						if share := strided(ids, r, 2); !slices.Equal(dp2[r][s], share) {
							t.Errorf("step %d: dp rank %d of 2 took %v, want %v (every second of dp 1's %v)", s+1, r, dp2[r][s], share, ids)
						}
					}
					if !slices.Equal(accum[s], ids) {
						t.Errorf("step %d: 2 micro-batches took %v, dp 1 %v", s+1, accum[s], ids)
					}
				}
				epoch := func(e int) []int { return slices.Concat(one[e*perEpoch : (e+1)*perEpoch]...) }
				if !shuffle {
					for s, ids := range one {
						at := s % perEpoch * 10
						if want := file[at : at+10]; !slices.Equal(ids, want) {
							t.Errorf("step %d took %v, want %v in file order", s+1, ids, want)
						}
					}
					return
				}
				for e := range 2 {
					got := epoch(e)
					if set := slices.Compact(slices.Sorted(slices.Values(got))); len(set) != 30 {
						t.Errorf("epoch %d took %d distinct samples of 30: %v", e+1, len(set), got)
					}
					for _, id := range got {
						if !slices.Contains(file, id) {
							t.Errorf("epoch %d took sample %d, which does not train", e+1, id)
						}
					}
					if slices.Equal(got, file[:30]) {
						t.Errorf("epoch %d is in file order: %v", e+1, got)
					}
				}
				if slices.Equal(epoch(0), epoch(1)) {
					t.Errorf("epochs 1 and 2 in the same order: %v", epoch(0))
				}
			})
		}
	}
}

// trainInFileOrder is the ids of the training samples in file order: the
// text's and the token file's first 37 windows, or the reviews that do not
// validate.
func trainInFileOrder(t *testing.T, c orderCase, ds *data.Data) []int {
	t.Helper()
	var train []int
	if c.name != "csv" {
		for i := range ds.Train.Len() {
			train = append(train, i)
		}
		return train
	}
	val := map[int]bool{}
	var b data.Batch
	for i := range ds.Val.Len() {
		ds.Val.Gather(&b, []int{i})
		val[c.id(ds, &b, 0)] = true
	}
	if len(val) != 4 {
		t.Fatalf("%d reviews validate, want 4", len(val))
	}
	for i := range 41 {
		if !val[i] {
			train = append(train, i)
		}
	}
	return train
}

// strided is ids[r], ids[r+n], ...
func strided(ids []int, r, n int) []int {
	var out []int
	for i := r; i < len(ids); i += n {
		out = append(out, ids[i])
	}
	return out
}
