package parallel

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/hpcrun/hpcrun/tensor"
)

func uploadRand(t *testing.T, dev tensor.Device, r *rand.Rand, shape ...int) (*tensor.Tensor, []float32) {
	t.Helper()
	x, err := dev.Alloc(shape...)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, x.Len())
	for i := range v {
		v[i] = r.Float32()*2 - 1
	}
	dev.CopyFromHost(x, v)
	return x, v
}

// TestAttentionReference checks the unsharded attention, on which every
// sharded check rests, against a float64 loop: QKV rows laid out [Q;K;V],
// heads contiguous, causal and padding masks.
func TestAttentionReference(t *testing.T) {
	const b, tt, c, nh = 2, 5, 12, 3
	hd := c / nh
	dev := tensor.NewCPU()
	r := rand.New(rand.NewPCG(1, 2))
	for _, causal := range []bool{true, false} {
		a, err := NewParallelSelfAttention(dev, nil, "attn", AttentionConfig{Dim: c, Heads: nh, Causal: causal, Seed: 3, Std: 0.5})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range a.Params() { // non-zero biases
			_, v := uploadRand(t, dev, r, p.Data.Shape()...)
			dev.CopyFromHost(p.Data, v)
		}
		var mask []int32
		if !causal {
			mask = keyMask(b, tt)
		}
		x, xv := uploadRand(t, dev, r, b, tt, c)
		out, err := a.Forward(x, mask)
		if err != nil {
			t.Fatal(err)
		}
		wq, bq := download(a.QKV.Weight.Data), download(a.QKV.Bias.Data)
		wo, bo := download(a.Proj.Weight.Data), download(a.Proj.Bias.Data)
		lin := func(w, bias []float32, in []float64, rows int) []float64 {
			o := make([]float64, rows)
			for i := range o {
				s := float64(bias[i])
				for j, v := range in {
					s += float64(w[i*len(in)+j]) * v
				}
				o[i] = s
			}
			return o
		}
		want := make([]float64, b*tt*c)
		for bi := 0; bi < b; bi++ {
			qkv := make([][]float64, tt)
			for ti := range qkv {
				in := make([]float64, c)
				for j := range in {
					in[j] = float64(xv[(bi*tt+ti)*c+j])
				}
				qkv[ti] = lin(wq, bq, in, 3*c)
			}
			for ti := 0; ti < tt; ti++ {
				y := make([]float64, c)
				for h := 0; h < nh; h++ {
					sc := make([]float64, tt)
					mx := math.Inf(-1)
					for tj := 0; tj < tt; tj++ {
						sc[tj] = math.Inf(-1)
						if (causal && tj > ti) || (mask != nil && mask[bi*tt+tj] == 0) {
							continue
						}
						var s float64
						for d := 0; d < hd; d++ {
							s += qkv[ti][h*hd+d] * qkv[tj][c+h*hd+d]
						}
						sc[tj] = s / math.Sqrt(float64(hd))
						mx = max(mx, sc[tj])
					}
					var z float64
					for tj := range sc {
						sc[tj] = math.Exp(sc[tj] - mx)
						z += sc[tj]
					}
					for tj := range sc {
						for d := 0; d < hd; d++ {
							y[h*hd+d] += sc[tj] / z * qkv[tj][2*c+h*hd+d]
						}
					}
				}
				copy(want[(bi*tt+ti)*c:], lin(wo, bo, y, c))
			}
		}
		got := download(out)
		var d, n float64
		for i, g := range got {
			d += (float64(g) - want[i]) * (float64(g) - want[i])
			n += want[i] * want[i]
		}
		if e := math.Sqrt(d / n); e > 1e-6 {
			t.Errorf("causal=%v: attention differs from the float64 loop by %.3g", causal, e)
		}
	}
}

// TestBlockFiniteDifferences checks the block's backward against central
// differences of L = sum(out * w) for a few inputs and weights.
func TestBlockFiniteDifferences(t *testing.T) {
	const b, tt, c = 2, 4, 8
	dev := tensor.NewCPU()
	r := rand.New(rand.NewPCG(5, 6))
	blk, err := NewBlock(dev, nil, "h.0", BlockConfig{Dim: c, Heads: 2, Causal: true, Seed: 9, Std: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range blk.Params() {
		if p.Shard.Replicated() && len(p.Full) == 1 { // perturb layernorm and bias params
			_, v := uploadRand(t, dev, r, p.Data.Shape()...)
			for i := range v {
				v[i] = v[i]*0.3 + float32(map[bool]float64{true: 1, false: 0}[p.Name[len(p.Name)-6:] == "weight"])
			}
			dev.CopyFromHost(p.Data, v)
		}
	}
	checkBlockGradients(t, dev, r, blk, b, tt, c, keyMask(b, tt), []int{0, 7, 13, 31, 40, 63}, func(n int) []int { return []int{0, n / 3, n - 1} })
}

// gradBlock is a block whose Backward checkBlockGradients checks.
type gradBlock interface {
	Forward(x *tensor.Tensor, keyValid []int32) (*tensor.Tensor, error)
	Backward(dout, dx *tensor.Tensor) error
	Params() []*Param
}

// checkBlockGradients checks blk's Backward against central differences
// of L = sum(out * w), for random (b,tt,c) inputs x and weights w, at the
// entries xIdx of x and paramIdx(len) of every parameter.
func checkBlockGradients(t *testing.T, dev tensor.Device, r *rand.Rand, blk gradBlock, b, tt, c int, mask []int32, xIdx []int, paramIdx func(n int) []int) {
	t.Helper()
	x, xv := uploadRand(t, dev, r, b, tt, c)
	_, wv := uploadRand(t, dev, r, b, tt, c)
	loss := func() float64 {
		out, err := blk.Forward(x, mask)
		if err != nil {
			t.Fatal(err)
		}
		var s float64
		for i, v := range download(out) {
			s += float64(v) * float64(wv[i])
		}
		return s
	}
	loss()
	dout, _ := uploadRand(t, dev, r, b, tt, c)
	dev.CopyFromHost(dout, wv)
	dx, _ := dev.Alloc(b, tt, c)
	ZeroGrads(blk.Params())
	if err := blk.Backward(dout, dx); err != nil {
		t.Fatal(err)
	}
	const h = 1e-2
	probe := func(name string, data []float32, set func([]float32), grad []float32, idx []int) {
		for _, i := range idx {
			orig := data[i]
			data[i] = orig + h
			set(data)
			lp := loss()
			data[i] = orig - h
			set(data)
			lm := loss()
			data[i] = orig
			set(data)
			num := (lp - lm) / (2 * h)
			if d := math.Abs(num - float64(grad[i])); d > 2e-2*math.Max(1, math.Abs(num)) {
				t.Errorf("%s[%d]: backward %g, finite difference %g", name, i, grad[i], num)
			}
		}
	}
	probe("x", xv, func(v []float32) { dev.CopyFromHost(x, v) }, download(dx), xIdx)
	for _, p := range blk.Params() {
		data := download(p.Data)
		probe(p.Name, data, func(v []float32) { dev.CopyFromHost(p.Data, v) }, download(p.Grad), paramIdx(len(data)))
	}
}

// TestMarkGradsStaleOverwrites checks that a Backward after MarkGradsStale
// writes every gradient of a block, position and token embedding (stale values
// ignored) and that a second Backward accumulates, as ZeroGrads would.
func TestMarkGradsStaleOverwrites(t *testing.T) {
	const b, tt, c, nh, vocab = 2, 4, 8, 2, 11
	dev := tensor.NewCPU()
	r := rand.New(rand.NewPCG(3, 4))
	emb, err := NewVocabParallelEmbedding(dev, nil, "wte", vocab, c, 1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	pos, err := NewPositionEmbedding(dev, "wpe", tt, c, 1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := NewBlock(dev, nil, "h.0", BlockConfig{Dim: c, Heads: nh, Causal: true, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	params := append(append(emb.Params(), pos.Params()...), blk.Params()...)
	ids := []int32{1, 5, 5, 0, 10, 3, 2, 1}
	dout, _ := uploadRand(t, dev, r, b, tt, c)
	dx, _ := dev.Alloc(b, tt, c)
	pass := func() {
		x, err := emb.Forward(ids, b, tt)
		if err != nil {
			t.Fatal(err)
		}
		if x, err = pos.Forward(x); err != nil {
			t.Fatal(err)
		}
		if _, err := blk.Forward(x, nil); err != nil {
			t.Fatal(err)
		}
		dev.Zero(dx)
		if err := blk.Backward(dout, dx); err != nil {
			t.Fatal(err)
		}
		if err := pos.Backward(dx, nil); err != nil {
			t.Fatal(err)
		}
		if err := emb.Backward(dx); err != nil {
			t.Fatal(err)
		}
	}
	ZeroGrads(params)
	pass()
	pass()
	var want [][]float32
	for _, p := range params {
		want = append(want, download(p.Grad))
		dev.Fill(p.Grad, 1e3) // stale values MarkGradsStale must not keep
	}
	MarkGradsStale(params)
	pass()
	pass()
	ZeroStaleGrads(params)
	for i, p := range params {
		if e := relErr(download(p.Grad), want[i]); e > 1e-6 {
			t.Errorf("%s: gradient after MarkGradsStale differs from ZeroGrads by %.2g", p.Name, e)
		}
	}
}

// The LM head over a padded vocabulary multiplies its valid columns
// rounded up to 8 (aligned GEMM kernels on a GPU) and masks every padded
// logit, those the product wrote included, on every forward; the valid
// logits are the float64 products of the input and the table.
func TestLMHeadMasksPadding(t *testing.T) {
	for _, c := range []struct{ v, ol, want int }{{50, 128, 56}, {56, 128, 56}, {125, 128, 125}, {50257, 50304, 50264}, {61, 64, 61}} {
		if got := productWidth(c.v, c.ol); got != c.want {
			t.Errorf("productWidth(%d, %d) = %d, want %d", c.v, c.ol, got, c.want)
		}
	}
	dev := tensor.NewCPU()
	const vocab, dim, n = 50, 16, 6
	wte, err := NewVocabParallelEmbedding(dev, nil, "wte", vocab, dim, 3, 0.5, nil)
	if err != nil {
		t.Fatal(err)
	}
	head, err := NewLMHead(nil, "lm_head", wte, tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	x, _ := dev.Alloc(1, n, dim)
	for i := range x.Host() {
		x.Host()[i] = float32(i%7) - 3
	}
	w := wte.Weight.Data.Host()
	for pass := 0; pass < 2; pass++ { // the second forward must mask again
		out, err := head.Forward(x)
		if err != nil {
			t.Fatal(err)
		}
		o := out.Host()
		for r := 0; r < n; r++ {
			for j := 0; j < wte.Padded; j++ {
				got := o[r*wte.Padded+j]
				if j >= vocab {
					if got != maskedLogit {
						t.Fatalf("pass %d: row %d padded column %d = %g, want the mask %g", pass, r, j, got, float32(maskedLogit))
					}
					continue
				}
				want := 0.0
				for k := 0; k < dim; k++ {
					want += float64(x.Host()[r*dim+k]) * float64(w[j*dim+k])
				}
				if math.Abs(float64(got)-want) > 1e-4*(1+math.Abs(want)) {
					t.Fatalf("pass %d: row %d column %d = %g, want %g", pass, r, j, got, want)
				}
			}
		}
	}
}

// A row-parallel layer with a bfloat16 GradDType rounds a float32 output
// gradient once and reads that in both products and the bias gradient:
// its gradients are, bit for bit, those of the layer without it given the
// gradient rounded (widened back to float32); at fp32 the option is off.
func TestRowGradRounded(t *testing.T) {
	dev := tensor.NewCPU()
	r := rand.New(rand.NewPCG(41, 42))
	const b, tt, in, out = 2, 5, 12, 8
	x, _ := uploadRand(t, dev, r, b, tt, in)
	dout, dv := uploadRand(t, dev, r, b, tt, out)
	rounded := make([]float32, len(dv))
	for i, v := range dv {
		rounded[i] = tensor.Float32FromBF16(tensor.BF16FromFloat32(v))
	}
	doutR, err := dev.Alloc(b, tt, out)
	if err != nil {
		t.Fatal(err)
	}
	dev.CopyFromHost(doutR, rounded)
	grads := func(opt LinearOptions, g *tensor.Tensor) [3][]float32 {
		l, err := NewRowParallelLinear(dev, nil, "proj", in, out, opt)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Forward(x); err != nil {
			t.Fatal(err)
		}
		dx, err := dev.Alloc(b, tt, in)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Backward(g, dx); err != nil {
			t.Fatal(err)
		}
		get := func(x *tensor.Tensor) []float32 {
			h := make([]float32, x.Len())
			dev.CopyToHost(h, x)
			return h
		}
		return [3][]float32{get(l.Weight.Grad), get(l.Bias.Grad), get(dx)}
	}
	opt := LinearOptions{Bias: true, Seed: 7, TransientOut: true}
	want := grads(opt, doutR)
	opt.GradDType = tensor.BFloat16
	got := grads(opt, dout)
	for i, what := range []string{"weight", "bias", "input"} {
		for j := range want[i] {
			if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
				t.Fatalf("%s gradient %d: %g, want %g (the float32 layer's from the rounded gradient)", what, j, got[i][j], want[i][j])
			}
		}
	}
	if same := grads(LinearOptions{Bias: true, Seed: 7, TransientOut: true}, dout); same[0][0] == got[0][0] && same[2][0] == got[2][0] && same[1][0] == got[1][0] {
		t.Errorf("the gradients from the unrounded gradient equal the rounded ones: the test cannot tell")
	}
}

// A Forward with no Backward after it (an evaluation) makes only the
// scratch a forward uses: an attention's probabilities under selective
// recomputation and its bfloat16 probabilities' float32 scores (no datt
// at float32), a Llama's rotation table; the gradients' scratch comes
// with the first Backward.
func TestForwardMakesNoBackwardScratch(t *testing.T) {
	dev := tensor.NewCPU()
	r := rand.New(rand.NewPCG(51, 52))
	x, _ := uploadRand(t, dev, r, 2, 6, 16)
	dout, _ := uploadRand(t, dev, r, 2, 6, 16)
	dx, err := dev.Alloc(2, 6, 16)
	if err != nil {
		t.Fatal(err)
	}
	gpt, err := NewParallelSelfAttention(dev, nil, "attn", AttentionConfig{Dim: 16, Heads: 2, Causal: true, Seed: 3, Activations: tensor.BFloat16})
	if err != nil {
		t.Fatal(err)
	}
	llama, err := NewLlamaAttention(dev, nil, "self_attn", LlamaAttentionConfig{Dim: 16, Heads: 4, KVHeads: 2, RoPE: RoPE{Theta: 10000}, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		layer   attentionSublayer
		scratch func() *attnScratchView
		forward string // the scratch Forward needs
	}{
		{"gpt bf16", gpt, func() *attnScratchView { return &attnScratchView{gpt.datt, gpt.dpre, gpt.dy, gpt.dqkv, nil} }, "datt"},
		{"llama fp32", llama, func() *attnScratchView {
			return &attnScratchView{llama.datt, llama.dpre, llama.dy, llama.dqkv, llama.ropeTable}
		}, "rope"},
	} {
		before := dev.MemStats().Current
		if _, err := c.layer.Forward(x, nil); err != nil {
			t.Fatal(err)
		}
		s := c.scratch()
		if s.dpre != nil || s.dy != nil || s.dqkv != nil || (c.forward == "rope" && s.datt != nil) {
			t.Errorf("%s: Forward made the backward's scratch (dpre %v, dy %v, dqkv %v, datt %v)", c.name, s.dpre, s.dy, s.dqkv, s.datt)
		}
		if c.forward == "datt" && s.datt == nil || c.forward == "rope" && s.rope == nil {
			t.Errorf("%s: Forward made no %s", c.name, c.forward)
		}
		afterForward := dev.MemStats().Current
		if err := c.layer.Backward(dout, dx); err != nil {
			t.Fatal(err)
		}
		s = c.scratch()
		if s.dpre == nil || s.dy == nil || s.dqkv == nil {
			t.Errorf("%s: Backward made no scratch", c.name)
		}
		if dev.MemStats().Current <= afterForward || afterForward <= before {
			t.Errorf("%s: %d B before, %d after Forward, %d after Backward", c.name, before, afterForward, dev.MemStats().Current)
		}
	}
}

// attnScratchView is what TestForwardMakesNoBackwardScratch looks at of an
// attention's scratch.
type attnScratchView struct{ datt, dpre, dy, dqkv, rope *tensor.Tensor }
