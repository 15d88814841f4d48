package data

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// Dataset is encoded samples of fixed length Seq, ready to batch. A
// classifier's sample is [CLS] text [PAD]...; a language model's is a window
// of the token stream and its targets are the same window shifted by one.
type Dataset struct {
	Seq     int
	Tokens  []int32 // (N,Seq)
	Targets []int32 // (N,Seq) next tokens; language model only
	Labels  []int32 // (N) classifier only
	Lengths []int32 // (N) tokens before the padding

	// A language model's windows read in place from memory-mapped token
	// files (Tokens and the others nil): sample i is the window of Seq+1
	// tokens at (first+i)*Seq, its targets shifted by one.
	stream   *tokenStream
	first, n int
}

// Len is the number of samples.
func (d *Dataset) Len() int {
	if d.stream != nil {
		return d.n
	}
	if d.Seq == 0 {
		return 0
	}
	return len(d.Tokens) / d.Seq
}

// Err is the first error of a Gather from token files (one truncated
// since it was mapped); Gather leaves the samples it could not read zero.
func (d *Dataset) Err() error {
	if d.stream != nil {
		return d.stream.Err()
	}
	return nil
}

// Batch is B samples of the dataset gathered for one micro-step.
type Batch struct {
	B, T    int
	Tokens  []int32 // (B,T)
	Targets []int32 // (B,T) language model only
	Labels  []int32 // (B) classifier only
	Lengths []int32 // (B)
}

// Gather copies the samples at idx into b, reusing its slices.
func (d *Dataset) Gather(b *Batch, idx []int) {
	T := d.Seq
	b.B, b.T = len(idx), T
	b.Tokens = resize(b.Tokens, len(idx)*T)
	b.Lengths = resize(b.Lengths, len(idx))
	if d.stream != nil {
		b.Targets = resize(b.Targets, len(idx)*T)
		b.Labels = nil
		win := make([]int32, T+1)
		for i, j := range idx {
			d.stream.read(win, (d.first+j)*T)
			copy(b.Tokens[i*T:(i+1)*T], win[:T])
			copy(b.Targets[i*T:(i+1)*T], win[1:])
			b.Lengths[i] = int32(T)
		}
		return
	}
	if d.Targets != nil {
		b.Targets = resize(b.Targets, len(idx)*T)
	}
	if d.Labels != nil {
		b.Labels = resize(b.Labels, len(idx))
	}
	for i, j := range idx {
		copy(b.Tokens[i*T:(i+1)*T], d.Tokens[j*T:(j+1)*T])
		b.Lengths[i] = d.Lengths[j]
		if d.Targets != nil {
			copy(b.Targets[i*T:(i+1)*T], d.Targets[j*T:(j+1)*T])
		}
		if d.Labels != nil {
			b.Labels[i] = d.Labels[j]
		}
	}
}

func resize(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

// Data is what a run trains and validates on, with the tokenizer that
// encoded it. Every rank prepares the same Data from the same config.Config.
type Data struct {
	Tokenizer tokenizer.Tokenizer
	Vocab     int // ids the model must embed, before padding
	Train     *Dataset
	Val       *Dataset
}

// Sizes of the built-in synthetic set.
const (
	synthTrain = 4096
	synthVal   = 512
)

// Prepare loads, tokenizes and splits the config's data. It is where a bad
// data file is reported, before any rank starts work.
func Prepare(cfg config.Config) (*Data, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.LM() {
		if config.IsTokenData(cfg.Data) {
			return prepareTokens(cfg)
		}
		return prepareText(cfg)
	}
	return prepareClassifier(cfg)
}

func prepareClassifier(cfg config.Config) (*Data, error) {
	var train, val []Example
	if cfg.Data == "synthetic" {
		train = SyntheticSentiment(synthTrain, uint64(cfg.Seed))
		val = SyntheticSentiment(synthVal, uint64(cfg.Seed)+1)
		if cfg.Samples > 0 && cfg.Samples < len(train) {
			train = train[:cfg.Samples]
		}
		if n := cfg.ValSamples(); n < len(val) {
			val = val[:n]
		}
	} else {
		all, err := LoadIMDb(cfg.Data)
		if err != nil {
			return nil, err
		}
		if len(all) < 2 {
			return nil, fmt.Errorf("data %s: %d review, need at least 2 (one to train, one to validate)", cfg.Data, len(all))
		}
		train, val = splitReviews(all, cfg)
	}
	texts := make([]string, len(train))
	for i, e := range train {
		texts[i] = e.Text
	}
	tok, err := tokenizer.New(cfg, texts)
	if err != nil {
		return nil, err
	}
	vocab, err := ModelVocab(cfg, tok)
	if err != nil {
		return nil, err
	}
	trainSet, err := encodeExamples(tok, train, cfg.Seq, cfg.Arch == "hf")
	if err != nil {
		return nil, fmt.Errorf("data %s: %w", cfg.Data, err)
	}
	valSet, err := encodeExamples(tok, val, cfg.Seq, cfg.Arch == "hf")
	if err != nil {
		return nil, fmt.Errorf("data %s: %w", cfg.Data, err)
	}
	return &Data{Tokenizer: tok, Vocab: vocab, Train: trainSet, Val: valSet}, nil
}

// splitReviews draws max(1, n/10) of the n reviews at random from
// the seed to validate and keeps the rest to train, cfg.Samples of them when
// that is set: a file sorted by label still validates on both labels. Both
// sets keep the file's order, which training follows with --shuffle=false.
func splitReviews(all []Example, cfg config.Config) (train, val []Example) {
	idx := make([]int, len(all))
	for i := range idx {
		idx[i] = i
	}
	r := rand.New(rand.NewPCG(uint64(cfg.Seed), 0xda7a))
	r.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	nVal := max(1, len(all)/10)
	trainIdx, valIdx := idx[:len(idx)-nVal], idx[len(idx)-nVal:]
	if cfg.Samples > 0 && cfg.Samples < len(trainIdx) {
		trainIdx = trainIdx[:cfg.Samples]
	}
	if n := cfg.ValSamples(); n < len(valIdx) {
		valIdx = valIdx[:n]
	}
	pick := func(idx []int) []Example {
		slices.Sort(idx)
		ex := make([]Example, len(idx))
		for i, j := range idx {
			ex[i] = all[j]
		}
		return ex
	}
	return pick(trainIdx), pick(valIdx)
}

// encodeExamples makes [CLS] text [PAD]... samples of length seq; texts
// longer than seq-1 tokens are truncated, as BERT fine-tuning does.
func encodeExamples(tok tokenizer.Tokenizer, ex []Example, seq int, sep bool) (*Dataset, error) {
	sp := tok.Specials()
	d := &Dataset{Seq: seq, Tokens: make([]int32, len(ex)*seq), Labels: make([]int32, len(ex)), Lengths: make([]int32, len(ex))}
	for i, e := range ex {
		row := d.Tokens[i*seq : (i+1)*seq]
		row[0] = int32(sp.CLS)
		ids, err := tokenizer.EncodeText(tok, e.Text)
		if err != nil {
			return nil, fmt.Errorf("example %d: %w", i+1, err)
		}
		n := min(len(ids), seq-1)
		if sep {
			n = min(len(ids), seq-2)
		}
		for j := 0; j < n; j++ {
			row[1+j] = int32(ids[j])
		}
		if sep {
			row[1+n] = int32(sp.EOT) // [SEP], as BERT's own tokenizer ends a text
			n++
		}
		for j := 1 + n; j < seq; j++ {
			row[j] = int32(sp.Pad)
		}
		d.Labels[i] = int32(e.Label)
		d.Lengths[i] = int32(1 + n)
	}
	return d, nil
}

func prepareText(cfg config.Config) (*Data, error) {
	text := SyntheticText(uint64(cfg.Seed))
	if cfg.Data != "synthetic" {
		var err error
		if text, err = LoadText(cfg.Data); err != nil {
			return nil, err
		}
	}
	tok, err := tokenizer.New(cfg, []string{text})
	if err != nil {
		return nil, err
	}
	vocab, err := ModelVocab(cfg, tok)
	if err != nil {
		return nil, err
	}
	ids, err := tokenizer.EncodeSequence(tok, text) // as one sequence: Llama's begin-of-text first
	if err != nil {
		return nil, fmt.Errorf("data %s: %w", cfg.Data, err)
	}
	// Windows of seq+1 tokens, stride seq; the last max(1, nWin/10)
	// validate.
	nWin := (len(ids) - 1) / cfg.Seq
	if nWin < 2 {
		return nil, fmt.Errorf("data %s: %d tokens make %d window(s) of seq %d, need at least 2 (one to train, one to validate): lower --seq or give a longer file", cfg.Data, len(ids), nWin, cfg.Seq)
	}
	nVal := max(1, nWin/10)
	nTrain := nWin - nVal
	if cfg.Samples > 0 && cfg.Samples < nTrain {
		nTrain = cfg.Samples
	}
	windows := func(first, n int) *Dataset {
		T := cfg.Seq
		d := &Dataset{Seq: T, Tokens: make([]int32, n*T), Targets: make([]int32, n*T), Lengths: make([]int32, n)}
		for i := 0; i < n; i++ {
			src := ids[(first+i)*T:]
			for t := 0; t < T; t++ {
				d.Tokens[i*T+t] = int32(src[t])
				d.Targets[i*T+t] = int32(src[t+1])
			}
			d.Lengths[i] = int32(T)
		}
		return d
	}
	val := windows(nWin-nVal, min(nVal, cfg.ValSamples()))
	return &Data{Tokenizer: tok, Vocab: vocab, Train: windows(0, nTrain), Val: val}, nil
}

// Describe says what the data is, for logs.
func (d *Data) Describe() string {
	return strings.TrimSpace(fmt.Sprintf("%d train / %d val samples of %d tokens, tokenizer %s (vocab %d)",
		d.Train.Len(), d.Val.Len(), d.Train.Seq, d.Tokenizer.Name(), d.Vocab))
}

// AllWindows is a language model's training windows followed by its
// validation windows (Prepare's split of one stream, which together are
// every window when no samples are held back).
func (d *Data) AllWindows() *Dataset {
	a, b := d.Train, d.Val
	if a.stream != nil {
		return &Dataset{Seq: a.Seq, stream: a.stream, first: a.first, n: a.n + b.n}
	}
	return &Dataset{
		Seq:     a.Seq,
		Tokens:  append(append([]int32(nil), a.Tokens...), b.Tokens...),
		Targets: append(append([]int32(nil), a.Targets...), b.Targets...),
		Lengths: append(append([]int32(nil), a.Lengths...), b.Lengths...),
	}
}
