package config

import "fmt"

// NumClasses is the number of labels of the BERT classifier's head.
const NumClasses = 2

// BERTTypes is the number of token types (segments) of BERT's table;
// hpcrun's single-text samples are all of type 0.
const BERTTypes = 2

// The largest model shape hpcrun accepts from a file or a flag, far past
// any real model (GPT-3 has 96 layers of 12288): a size beyond them is
// refused before anything is allocated for it, so that a corrupt or
// hostile header cannot make a rank allocate until it dies.
const (
	MaxLayers    = 1 << 12
	MaxDim       = 1 << 17
	MaxPositions = 1 << 20
	MaxVocab     = 1 << 24
	// MaxParams bounds the whole model (about 1.1e12 parameters).
	MaxParams = 1 << 40
)

// CheckSize refuses a shape past the Max limits, naming the first key that
// is: key(name) gives the name the source uses for a field (n_layer,
// --layers).
func CheckSize(layers, dim, positions, vocab int, key func(name string) string) error {
	for _, k := range []struct {
		name  string
		v, at int
	}{{"layers", layers, MaxLayers}, {"dim", dim, MaxDim}, {"positions", positions, MaxPositions}, {"vocab", vocab, MaxVocab}} {
		if k.v > k.at {
			return fmt.Errorf("%s = %d: more than the %d hpcrun accepts", key(k.name), k.v, k.at)
		}
	}
	L, C, P, V := float64(layers), float64(dim), float64(positions), float64(vocab)
	if n := 12*L*C*C + (V+P)*C; n > MaxParams {
		return fmt.Errorf("%s %d, %s %d, %s %d: %.3g parameters, more than the %.3g hpcrun accepts",
			key("layers"), layers, key("dim"), dim, key("vocab"), vocab, n, float64(MaxParams))
	}
	return nil
}
