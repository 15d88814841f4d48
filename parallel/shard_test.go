package parallel

import (
	"slices"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
)

func TestPadVocab(t *testing.T) {
	for _, tc := range []struct{ vocab, tp, want int }{
		{1, 1, 128}, {128, 1, 128}, {129, 1, 256}, {50257, 1, 50304}, {50257, 2, 50432},
		{50257, 4, 50688}, {256, 2, 256}, {200, 4, 512}, {30522, 8, 30720},
	} {
		got, err := PadVocab(tc.vocab, tc.tp)
		if err != nil || got != tc.want {
			t.Errorf("PadVocab(%d, %d) = %d, %v; want %d", tc.vocab, tc.tp, got, err, tc.want)
		}
	}
	for _, tc := range [][2]int{{0, 1}, {-3, 2}, {10, 0}} {
		if _, err := PadVocab(tc[0], tc[1]); err == nil {
			t.Errorf("PadVocab(%d, %d): no error", tc[0], tc[1])
		}
	}
}

func TestShardTakePut(t *testing.T) {
	// A (6, 4) matrix of 0..23.
	full := make([]float32, 24)
	for i := range full {
		full[i] = float32(i)
	}
	shape := []int{6, 4}
	for _, tc := range []struct {
		sh   Shard
		want []float32
	}{
		{Shard{Parts: 1}, full},
		{Shard{Dim: 0, Parts: 2, Index: 1}, full[12:]},
		{Shard{Dim: 1, Parts: 2, Index: 0}, []float32{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21}},
		// Three blocks of two rows (Q, K, V), split over 2 ranks: rank 1
		// gets the second row of each block.
		{Shard{Dim: 0, Parts: 2, Index: 1, Blocks: 3}, []float32{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23}},
	} {
		got, err := tc.sh.Take(full, shape)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%v.Take = %v, %v; want %v", tc.sh, got, err, tc.want)
			continue
		}
		if ls := tc.sh.LocalShape(shape); ls[0]*ls[1] != len(got) {
			t.Errorf("%v.LocalShape = %v for %d values", tc.sh, ls, len(got))
		}
		back := make([]float32, 24)
		if err := tc.sh.Put(back, shape, got); err != nil {
			t.Fatal(err)
		}
		for i, v := range back {
			if v != 0 && v != full[i] {
				t.Errorf("%v.Put wrote %v at %d", tc.sh, v, i)
			}
		}
	}
	// Put of every rank's piece rebuilds the whole tensor.
	for _, sh := range []Shard{{Dim: 0, Parts: 3}, {Dim: 1, Parts: 4}, {Dim: 0, Parts: 2, Blocks: 3}} {
		back := make([]float32, 24)
		for r := 0; r < sh.Parts; r++ {
			sh.Index = r
			p, err := sh.Take(full, shape)
			if err != nil {
				t.Fatal(err)
			}
			if err := sh.Put(back, shape, p); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(back, full) {
			t.Errorf("%v: merged %v", sh, back)
		}
	}
	for _, sh := range []Shard{{Dim: 0, Parts: 4}, {Dim: 2, Parts: 2}, {Dim: 1, Parts: 2, Index: 2}, {Dim: 0, Parts: 4, Blocks: 3}} {
		if _, err := sh.Take(full, shape); err == nil {
			t.Errorf("%v.Take of (6,4): no error", sh)
		}
	}
	for _, sh := range []Shard{{Dim: 0, Parts: 4, Replicas: 4, Shared: 1}, {Dim: 0, Parts: 4, Replicas: 3, Shared: 1}, {Dim: 0, Parts: 2, Replicas: 2, Shared: 7}} {
		if _, err := sh.Take(full, shape); err == nil {
			t.Errorf("%v.Take of (6,4): no error", sh)
		}
	}
	if _, err := ShardRows(full, 6, 4, 2, 0); err != nil {
		t.Error(err)
	}
	if got, _ := ShardCols(full, 6, 4, 4, 3); !slices.Equal(got, []float32{3, 7, 11, 15, 19, 23}) {
		t.Errorf("ShardCols = %v", got)
	}
}

// A fused Q,K,V weight of 2 key/value groups of [2 query rows | key | value]
// over 4 ranks, 2 for each group: each rank holds its query row and its
// group's key and value rows; the norm counts the shared rows once per group.
func TestShardReplicas(t *testing.T) {
	full := make([]float32, 16) // (8, 2): row i holds 2i, 2i+1
	for i := range full {
		full[i] = float32(i)
	}
	shape := []int{8, 2}
	want := [][]float32{{0, 1, 4, 5, 6, 7}, {2, 3, 4, 5, 6, 7}, {8, 9, 12, 13, 14, 15}, {10, 11, 12, 13, 14, 15}}
	back := make([]float32, 16)
	for r := 0; r < 4; r++ {
		sh := Shard{Dim: 0, Parts: 4, Index: r, Replicas: 2, Shared: 2}
		got, err := sh.Take(full, shape)
		if err != nil || !slices.Equal(got, want[r]) {
			t.Errorf("%v.Take = %v, %v; want %v", sh, got, err, want[r])
		}
		if ls := sh.LocalShape(shape); !slices.Equal(ls, []int{3, 2}) {
			t.Errorf("%v.LocalShape = %v", sh, ls)
		}
		if n, wantN := sh.CountedLen(shape), []int{6, 2}[r%2]; n != wantN {
			t.Errorf("%v.CountedLen = %d, want %d", sh, n, wantN)
		}
		if off, n := sh.SharedRange(shape); off != 2 || n != 4 {
			t.Errorf("%v.SharedRange = %d, %d", sh, off, n)
		}
		if err := sh.Put(back, shape, got); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(back, full) {
		t.Errorf("merged %v", back)
	}
}

func TestInitFullKeyed(t *testing.T) {
	a := InitFull("h.0.attn.c_attn.weight", 1, 100, InitNormal, 0.02)
	b := InitFull("h.0.attn.c_attn.weight", 1, 100, InitNormal, 0.02)
	c := InitFull("h.1.attn.c_attn.weight", 1, 100, InitNormal, 0.02)
	d := InitFull("h.0.attn.c_attn.weight", 2, 100, InitNormal, 0.02)
	if !slices.Equal(a, b) || slices.Equal(a, c) || slices.Equal(a, d) {
		t.Error("InitFull is not keyed by (seed, name) alone")
	}
	if o := InitFull("x", 1, 3, InitOnes, 0); !slices.Equal(o, []float32{1, 1, 1}) {
		t.Errorf("InitOnes = %v", o)
	}
}

// TestBadShapes: bad sizes are errors that say what to change, not panics.
func TestBadShapes(t *testing.T) {
	dev := tensor.NewCPU()
	tp := fakeSize(t, 2)
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"heads%tp", func() error {
			_, err := NewParallelSelfAttention(dev, tp, "attn", AttentionConfig{Dim: 24, Heads: 3})
			return err
		}, "multiple of tp"},
		{"dim%heads", func() error {
			_, err := NewParallelSelfAttention(dev, tp, "attn", AttentionConfig{Dim: 30, Heads: 4})
			return err
		}, "multiple of heads"},
		{"vocab", func() error { _, err := NewVocabParallelEmbedding(dev, tp, "wte", 0, 8, 1, 0, nil); return err }, "vocab"},
		{"column out%tp", func() error { _, err := NewColumnParallelLinear(dev, tp, "fc", 8, 7, LinearOptions{}); return err }, "split"},
		{"row in%tp", func() error { _, err := NewRowParallelLinear(dev, tp, "proj", 7, 8, LinearOptions{}); return err }, "split"},
		{"block hidden%tp", func() error {
			_, err := NewBlock(dev, tp, "h.0", BlockConfig{Dim: 8, Heads: 2, Hidden: 9})
			return err
		}, "multiple of tp"},
	} {
		err := tc.err()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}

	// Batches of the wrong shape.
	l, err := NewColumnParallelLinear(dev, nil, "fc", 8, 8, LinearOptions{})
	if err != nil {
		t.Fatal(err)
	}
	x, _ := dev.Alloc(2, 3, 5)
	if _, err := l.Forward(x); err == nil {
		t.Error("a (2,3,5) input to a layer of 8 inputs: no error")
	}
	x2, _ := dev.Alloc(6, 8)
	if _, err := l.Forward(x2); err == nil {
		t.Error("a rank-2 input: no error")
	}
	emb, err := NewVocabParallelEmbedding(dev, nil, "wte", 10, 4, 1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := emb.Forward([]int32{1, 2, 10}, 1, 3); err == nil {
		t.Error("token id 10 of a vocabulary of 10: no error")
	}
	if _, err := emb.Forward([]int32{1, 2}, 1, 3); err == nil {
		t.Error("2 ids for 1x3 tokens: no error")
	}
	attn, err := NewParallelSelfAttention(dev, nil, "attn", AttentionConfig{Dim: 8, Heads: 2})
	if err != nil {
		t.Fatal(err)
	}
	x3, _ := dev.Alloc(2, 3, 8)
	if _, err := attn.Forward(x3, []int32{1, 1}); err == nil {
		t.Error("a key mask of 2 for 6 tokens: no error")
	}
	if err := attn.Proj.Backward(x3, nil); err == nil {
		t.Error("Backward before Forward: no error")
	}
	ce, err := NewVocabParallelCrossEntropy(nil, "loss", 4)
	if err != nil {
		t.Fatal(err)
	}
	lg, _ := dev.Alloc(3, 4)
	if _, err := ce.Forward(lg, []int32{0, 1, 4}); err == nil {
		t.Error("target 4 of 4 columns: no error")
	}
}
