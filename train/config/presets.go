package config

import (
	"fmt"
	"sort"
	"strings"
)

// Preset is a named model size. Model is "" for sizes that fit either model
// (tiny, small); named architectures (bert-base, gpt2-124m, ...) also choose
// the model and its tokenizer.
type Preset struct {
	Name      string
	Model     string // "" keeps the config's model
	Layers    int
	Dim       int
	Heads     int
	Seq       int
	BatchSize int
	Tokenizer string // "" keeps the config's tokenizer
	LR        float64
	MaxSeq    int // positions of the published model; 0 = no limit

	// Llama's (model llama): see Config's fields of the same names.
	KVHeads, FFN, Vocab                   int
	RopeTheta                             float64
	RopeFactor, RopeLowFreq, RopeHighFreq float64
	RopeOriginalSeq                       int
}

// presets are the sizes `--preset` knows. tiny trains in seconds a step on
// one CPU core; the named ones follow the published architectures.
var presets = map[string]Preset{
	"tiny":       {Name: "tiny", Layers: 2, Dim: 64, Heads: 4, Seq: 32, BatchSize: 16, LR: 1e-3},
	"small":      {Name: "small", Layers: 4, Dim: 256, Heads: 8, Seq: 128, BatchSize: 16, LR: 5e-4},
	"bert-base":  {Name: "bert-base", Model: "bert", Layers: 12, Dim: 768, Heads: 12, Seq: 512, BatchSize: 8, Tokenizer: "wordpiece", LR: 1e-4, MaxSeq: 512},
	"bert-large": {Name: "bert-large", Model: "bert", Layers: 24, Dim: 1024, Heads: 16, Seq: 512, BatchSize: 8, Tokenizer: "wordpiece", LR: 5e-5, MaxSeq: 512},
	"gpt2-124m":  {Name: "gpt2-124m", Model: "gpt", Layers: 12, Dim: 768, Heads: 12, Seq: 1024, BatchSize: 4, Tokenizer: "gpt2", LR: 6e-4, MaxSeq: 1024},
	"gpt2-350m":  {Name: "gpt2-350m", Model: "gpt", Layers: 24, Dim: 1024, Heads: 16, Seq: 1024, BatchSize: 4, Tokenizer: "gpt2", LR: 3e-4, MaxSeq: 1024},
	// Llama-shaped decoders: a tiny one for tests, SmolLM-135M's shapes
	// (HuggingFaceTB/SmolLM-135M config.json) and Llama 3.2 1B's
	// (meta-llama/Llama-3.2-1B), both with tied heads; their vocabularies
	// are the published tokenizers' (--init-from a directory brings its own).
	"llama-tiny":  {Name: "llama-tiny", Model: "llama", Layers: 2, Dim: 64, Heads: 4, KVHeads: 2, FFN: 160, Seq: 32, BatchSize: 16, LR: 1e-3},
	"smollm-135m": {Name: "smollm-135m", Model: "llama", Layers: 30, Dim: 576, Heads: 9, KVHeads: 3, FFN: 1536, Vocab: 49152, Seq: 2048, BatchSize: 4, LR: 3e-4, MaxSeq: 2048},
	"llama-1b": {Name: "llama-1b", Model: "llama", Layers: 16, Dim: 2048, Heads: 32, KVHeads: 8, FFN: 8192, Vocab: 128256, Seq: 2048, BatchSize: 4, LR: 3e-4, MaxSeq: 131072,
		RopeTheta: 500000, RopeFactor: 32, RopeLowFreq: 1, RopeHighFreq: 4, RopeOriginalSeq: 8192},
}

// PresetNames lists the known presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupPreset returns the preset called name.
func LookupPreset(name string) (Preset, error) {
	p, ok := presets[name]
	if !ok {
		return Preset{}, fmt.Errorf("preset %q: use one of %s", name, strings.Join(PresetNames(), ", "))
	}
	return p, nil
}

// ApplyPreset sets the model dimensions of cfg from the preset called name.
// Callers apply it before the flags the user set, so that an explicit flag
// wins over the preset.
func (c *Config) ApplyPreset(name string) error {
	p, err := LookupPreset(name)
	if err != nil {
		return err
	}
	c.Preset = p.Name
	if p.Model != "" {
		c.Model = p.Model
	}
	if p.Tokenizer != "" {
		c.Tokenizer = p.Tokenizer
	}
	c.Layers, c.Dim, c.Heads, c.Seq = p.Layers, p.Dim, p.Heads, p.Seq
	c.Positions = p.MaxSeq // the published model's table (0: seq's) whatever --seq says
	c.BatchSize, c.LR = p.BatchSize, p.LR
	c.KVHeads, c.FFN, c.Vocab, c.RopeTheta = p.KVHeads, p.FFN, p.Vocab, p.RopeTheta
	c.RopeFactor, c.RopeLowFreq, c.RopeHighFreq, c.RopeOriginalSeq = p.RopeFactor, p.RopeLowFreq, p.RopeHighFreq, p.RopeOriginalSeq
	return nil
}
