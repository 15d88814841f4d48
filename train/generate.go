package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"unicode/utf8"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/interop"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// SourceConfig is the config of the model at src: a checkpoint (a step
// dir, a checkpoint root or a run dir: the saved run's config, its weights
// through resume_from) or pretrained weights (a Hugging Face directory or
// an llm.c file: their shape, the weights through init_from).
func SourceConfig(src string) (config.Config, error) {
	if _, err := os.Stat(src); err != nil {
		return config.Config{}, err
	}
	if dir, err := ckpt.Resolve(src); err == nil && dir != "" {
		b, err := os.ReadFile(filepath.Join(dir, ckpt.StateFile))
		if err != nil {
			return config.Config{}, err
		}
		var st ckpt.State
		if err := json.Unmarshal(b, &st); err != nil {
			return config.Config{}, fmt.Errorf("checkpoint %s: %v", dir, err)
		}
		cfg := config.DefaultConfig()
		if err := json.Unmarshal(st.Config, &cfg); err != nil {
			return config.Config{}, fmt.Errorf("checkpoint %s: config: %v", dir, err)
		}
		cfg.ResumeFrom, cfg.InitFrom = dir, ""
		// A run saved before train.toml recorded its tokenizer: the one
		// its training data implied, before eval swaps in its own data.
		cfg.Tokenizer = cfg.TokenizerName()
		// The checkpoint is laid out as at pp 1, whatever the pipeline
		// that saved it: the caller's ranks run the whole model. How the
		// training split its work (pipeline, sequence, optimizer state)
		// does not belong to the model, and may not fit the caller's ranks.
		cfg.PP, cfg.MicroBatches, cfg.PPSplit = 0, 0, ""
		cfg.SP, cfg.Zero, cfg.ZeroGroup = false, 0, ""
		cfg.Vocab = st.Vocab
		if cfg.Positions == 0 {
			cfg.Positions = cfg.Seq
		}
		return cfg, nil
	}
	cfg := config.DefaultConfig()
	cfg.Preset, cfg.InitFrom = "", src
	if err := ApplyInitFrom(&cfg, nil); err != nil {
		return config.Config{}, err
	}
	cfg.Tokenizer = cfg.TokenizerName()
	cfg.Seq = min(cfg.Positions, 1024)
	// An export of hpcrun's says the window it trained on: the run's own
	// default, whatever its position table holds.
	if spec, err := interop.Inspect(src); err == nil && spec.Seq > 0 && spec.Seq <= cfg.Positions {
		cfg.Seq = spec.Seq
	}
	return cfg, nil
}

// loadWeights fills this rank's params from the config's weights: its
// resume_from checkpoint (the model only, resharded for this tp) or its
// init_from pretrained weights.
func loadWeights(set *parallel.ParamSet, cfg config.Config, vocab int) error {
	params := set.Params()
	if cfg.ResumeFrom != "" {
		c, err := ckpt.Open(cfg.ResumeFrom, false)
		if err != nil {
			return err
		}
		for _, p := range params {
			vals, err := c.Load("", p.Name, p.Full, p.Shard)
			if err != nil {
				return err
			}
			if j := nonFinite(vals); j >= 0 {
				return fmt.Errorf("checkpoint %s: the weights of %s hold %v at element %d of this rank's shard: the checkpoint was saved after training diverged, or is corrupt", cfg.ResumeFrom, p.Name, vals[j], j)
			}
			set.Load(p, vals)
		}
		return nil
	}
	w, err := interop.Open(cfg.InitFrom)
	if err != nil {
		return err
	}
	defer w.Close()
	if err := checkInitFrom(cfg, vocab, w.Spec()); err != nil {
		return err
	}
	for _, p := range params {
		vals, err := w.Load(p.Name, p.Full, p.Shard)
		if errors.Is(err, interop.ErrAbsent) {
			continue // a new head: the model's own init
		}
		if err != nil {
			return err
		}
		if j := nonFinite(vals); j >= 0 {
			return fmt.Errorf("init_from %s: %s holds %v at element %d of this rank's piece: the weights are corrupt", cfg.InitFrom, p.Name, vals[j], j)
		}
		set.Load(p, vals)
	}
	return nil
}

// GenerateOptions say what Generate samples.
type GenerateOptions struct {
	Source      string  // a checkpoint, run dir, Hugging Face dir or llm.c file (see SourceConfig)
	Prompt      string  // text the sample continues
	Tokens      int     // tokens to sample
	Temperature float64 // 0 = greedy (the most likely token, the lowest id on a tie)
	TopK        int     // sample among the k most likely tokens; 0 = all
	Seed        uint64  // the sampler's seed: the same on every rank, so all ranks draw the same tokens
	Device      string  // auto, cpu, cuda
	Out         io.Writer
}

// Generate samples opt.Tokens tokens from the GPT at opt.Source after
// opt.Prompt, the model split over every rank of world (tp = world size),
// and returns the sampled ids. Rank 0 streams the decoded text to opt.Out
// as tokens come. A prefill forward over the prompt fills each layer's
// key/value cache (each rank its own heads); every later step forwards the
// one new token over the cache, so n tokens after a prompt of p cost p+n
// positions of the model, until the sequence outgrows the model's
// positions: from then on each step forwards the last window of that many
// again (as without a cache). Each step gathers the vocab-parallel logits
// of the last position over the group.
func Generate(ctx context.Context, world nccl.Comm, opt GenerateOptions) ([]int, error) {
	return generate(ctx, world, opt, true, nil)
}

// genTrace records what a generate run did, for tests: the positions its
// forwards processed and, with keep, each step's full logits.
type genTrace struct {
	keep      bool
	positions int
	logits    [][]float32
}

// generate is Generate with (cached) or without the key/value cache: the
// uncached path runs the whole window, padded to the model's length, at
// every step.
func generate(ctx context.Context, world nccl.Comm, opt GenerateOptions, cached bool, trace *genTrace) ([]int, error) {
	cfg, err := SourceConfig(opt.Source)
	if err != nil {
		return nil, err
	}
	if !cfg.LM() {
		return nil, fmt.Errorf("generate %s: a %s model: only gpt and llama generate text", opt.Source, cfg.Model)
	}
	if opt.Tokens < 1 || opt.Temperature < 0 || opt.TopK < 0 {
		return nil, fmt.Errorf("generate: tokens %d, temperature %g, top-k %d: want tokens >= 1, temperature >= 0, top-k >= 0", opt.Tokens, opt.Temperature, opt.TopK)
	}
	tok, err := tokenizer.New(cfg, nil)
	if err != nil {
		return nil, err
	}
	vocab, err := data.ModelVocab(cfg, tok)
	if err != nil {
		return nil, err
	}
	ids, err := promptIDs(tok, opt.Prompt)
	if err != nil {
		return nil, err
	}
	cfg.TP, cfg.NTasks, cfg.BatchSize = world.Size(), world.Size(), 1
	cfg.Seq = min(cfg.Positions, len(ids)+opt.Tokens)
	if opt.Device != "" {
		cfg.Device = opt.Device
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dev, _, err := OpenDevice(cfg.Device, nil)
	if err != nil {
		return nil, err
	}
	if c, ok := dev.(interface{ Close() error }); ok {
		defer c.Close()
	}
	if err := setPrecision(dev, cfg.Precision); err != nil {
		return nil, err
	}
	mesh, err := parallel.NewMesh(world, cfg.TP)
	if err != nil {
		return nil, err
	}
	defer mesh.Close()
	m, err := newModel(cfg, &data.Data{Vocab: vocab}, mesh, dev)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	tr := m.(*transformer)
	if err := agree(world, loadWeights(tr.ParamSet(), cfg, vocab), "loading "+opt.Source); err != nil {
		return nil, err
	}
	T, local := cfg.Seq, tr.head.LocalOut()
	row := make([]float32, local)
	full := make([]float32, local*cfg.TP)
	b := &data.Batch{B: 1, T: T, Tokens: make([]int32, T), Targets: make([]int32, T), Lengths: []int32{int32(T)}}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x6e6))
	var caches []*parallel.KVCache
	if cached {
		if caches, err = tr.newKVCaches(T); err != nil {
			return nil, err
		}
		defer func() {
			for _, c := range caches {
				c.Release()
			}
		}()
	}
	base, held := 0, 0 // the caches hold ids[base:base+held]
	var out []int
	stream := textStream{w: opt.Out}
	for k := 0; k < opt.Tokens; k++ {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		var logits *tensor.Tensor
		last := 0 // the row of the last position in logits
		if cached {
			feed := ids[base+held:]
			if held == 0 || len(ids)-base > T {
				// The first step, or the sequence outgrew the positions:
				// fill the caches again from the last window.
				base, held = max(0, len(ids)-T), 0
				feed = ids[base:]
				for _, c := range caches {
					c.Reset()
				}
			}
			tokens := make([]int32, len(feed))
			for i, id := range feed {
				tokens[i] = int32(id)
			}
			if logits, err = tr.decode(tokens, held, caches); err != nil {
				return out, err
			}
			held += len(feed)
			last = len(feed) - 1
			if trace != nil {
				trace.positions += len(feed)
			}
		} else {
			window := ids[max(0, len(ids)-T):]
			for i := range b.Tokens {
				b.Tokens[i], b.Targets[i] = 0, -1
				if i < len(window) {
					b.Tokens[i] = int32(window[i])
				}
			}
			h, err := tr.trunk(b)
			if err != nil {
				return out, err
			}
			if logits, err = tr.head.Forward(h); err != nil {
				return out, err
			}
			last = len(window) - 1
			if trace != nil {
				trace.positions += T
			}
		}
		dev.CopyToHost(row, logits.View(last*local, local))
		if err := mesh.TP.AllGather(row, full); err != nil {
			return out, err
		}
		if trace != nil && trace.keep {
			trace.logits = append(trace.logits, append([]float32(nil), full[:vocab]...))
		}
		next := sample(full[:vocab], opt.Temperature, opt.TopK, rng)
		ids, out = append(ids, next), append(out, next)
		if opt.Out != nil && world.Rank() == 0 {
			stream.write(tok.Decode(out), k == opt.Tokens-1)
		}
	}
	return out, nil
}

// textStream writes a growing decoded text as it grows: all of it but an
// incomplete UTF-8 sequence at its end, which the next token may complete
// (a character of several byte-level tokens). Invalid bytes are written as
// they are, so that what was streamed is the decoded text byte for byte.
type textStream struct {
	w       io.Writer
	printed int // bytes of the text written
}

// write writes what text (the whole decoded text so far, of which the
// written bytes are a prefix) adds, holding back an incomplete sequence at
// its end unless final.
func (s *textStream) write(text string, final bool) {
	if len(text) <= s.printed {
		return
	}
	end := len(text)
	if !final {
		// The last character's first byte is among the last UTFMax.
		for i := len(text) - 1; i >= max(s.printed, len(text)-utf8.UTFMax); i-- {
			if utf8.RuneStart(text[i]) {
				if !utf8.FullRuneInString(text[i:]) {
					end = i
				}
				break
			}
		}
	}
	if end > s.printed {
		io.WriteString(s.w, text[s.printed:end])
		s.printed = end
	}
}

// sample draws a token from logits (the real vocabulary's; padding columns
// are never drawn): the most likely at temperature 0, else from the
// softmax of logits/temperature over the top k.
func sample(logits []float32, temperature float64, k int, rng *rand.Rand) int {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if temperature == 0 {
		return best
	}
	idx := make([]int, len(logits))
	for i := range idx {
		idx[i] = i
	}
	if k > 0 && k < len(idx) {
		sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
		idx = idx[:k]
	}
	p := make([]float64, len(idx))
	sum := 0.0
	for j, i := range idx {
		p[j] = math.Exp(float64(logits[i]-logits[best]) / temperature)
		sum += p[j]
	}
	r := rng.Float64() * sum
	for j := range p {
		if r -= p[j]; r < 0 {
			return idx[j]
		}
	}
	return idx[len(idx)-1]
}

// EvalOptions say what EvaluateSource measures.
type EvalOptions struct {
	Source    string // as for Generate
	Data      string // a text or token files (see config.Config.Data)
	Seq       int    // window length; 0 = the checkpoint's, an hpcrun export's (Spec.Seq), or up to 1024 of the pretrained model's positions
	BatchSize int    // windows per forward; 0 = 8
	Device    string // auto, cpu, cuda; "" = the source's (auto for pretrained weights)
}

// promptIDs are the ids generation starts from: the prompt as one
// sequence (EncodeSequence: Llama's begin-of-text first), or the
// end-of-text token when that is empty.
func promptIDs(tok tokenizer.Tokenizer, prompt string) ([]int, error) {
	ids, err := tokenizer.EncodeSequence(tok, prompt)
	if err != nil {
		return nil, fmt.Errorf("prompt: %w", err)
	}
	// Generation goes on from the text: of the tokens a post-processor puts
	// around it, only those before it (a begin-of-text) belong to a prompt;
	// an end-of-sequence after it would end it.
	if plain := tok.Encode(prompt); len(plain) > 0 && len(ids) > len(plain) {
		for start := 0; start+len(plain) <= len(ids); start++ {
			if slices.Equal(ids[start:start+len(plain)], plain) {
				ids = ids[:start+len(plain)]
				break
			}
		}
	}
	if len(ids) == 0 {
		ids = []int{tok.Specials().EOT}
	}
	return ids, nil
}

// SourceEval is EvaluateSource's result: the mean loss over Windows
// windows of Seq tokens each.
type SourceEval struct {
	EvalResult
	Seq     int
	Windows int
}

// EvaluateSource is the mean loss of the GPT at opt.Source over every
// window (seq+1 tokens, stride seq) of opt.Data, the model split over every
// rank of world; the perplexity is its exp.
func EvaluateSource(ctx context.Context, world nccl.Comm, opt EvalOptions) (SourceEval, error) {
	cfg, err := SourceConfig(opt.Source)
	if err != nil {
		return SourceEval{}, err
	}
	if !cfg.LM() {
		return SourceEval{}, fmt.Errorf("eval %s: a %s model: eval measures a language model's loss", opt.Source, cfg.Model)
	}
	cfg.Data, cfg.TP, cfg.NTasks = opt.Data, world.Size(), world.Size()
	cfg.Samples, cfg.EvalSamples, cfg.Steps, cfg.EvalEvery, cfg.GradAccum = 0, math.MaxInt32, 1, 0, 1
	cfg.BatchSize = 8
	if opt.BatchSize > 0 {
		cfg.BatchSize = opt.BatchSize
	}
	if opt.Seq > 0 {
		cfg.Seq = opt.Seq
	}
	if opt.Device != "" {
		cfg.Device = opt.Device
	}
	ds, err := data.Prepare(cfg)
	if err != nil {
		return SourceEval{}, err
	}
	ds.Val = ds.AllWindows()
	ds.Train = ds.Val // newTrainer wants one step's worth; nothing trains
	cfg.BatchSize = min(cfg.BatchSize, ds.Val.Len())
	t, err := newTrainer(cfg, world, Options{Data: ds}, nil)
	if err != nil {
		return SourceEval{}, err
	}
	defer t.close()
	if err := agree(world, loadWeights(t.model.ParamSet(), cfg, ds.Vocab), "loading "+opt.Source); err != nil {
		return SourceEval{}, err
	}
	if err := ctx.Err(); err != nil {
		return SourceEval{}, err
	}
	e, err := t.evaluate(0)
	return SourceEval{EvalResult: e, Seq: cfg.Seq, Windows: ds.Val.Len()}, err
}
