package train

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/interop"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// TestGenerateGreedyIsEqualAtTP1And2: at temperature 0 the sampled tokens
// are the same twice and at tp 1 and 2; rank 0 streams their text; with a
// temperature and top-k the same seed gives the same tokens at both tp.
func TestGenerateGreedyIsEqualAtTP1And2(t *testing.T) {
	dir := tinyGPT2(t, tinyGPT2Spec, interop.HFOptions{})
	run := func(tp int, temp float64, k int) ([]int, string) {
		outs := make([][]int, tp)
		var sb strings.Builder
		err := nccl.RunInProcess(tp, func(c nccl.Comm) error {
			o := GenerateOptions{Source: dir, Prompt: "alpha beta", Tokens: 12, Temperature: temp, TopK: k, Seed: 5, Device: "cpu"}
			if c.Rank() == 0 {
				o.Out = &sb
			}
			ids, err := Generate(context.Background(), c, o)
			outs[c.Rank()] = ids
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for r := range outs {
			if !reflect.DeepEqual(outs[r], outs[0]) {
				t.Fatalf("tp %d: rank %d drew %v, rank 0 %v", tp, r, outs[r], outs[0])
			}
		}
		return outs[0], sb.String()
	}
	a, text := run(1, 0, 0)
	if len(a) != 12 {
		t.Fatalf("%d tokens, want 12", len(a))
	}
	if want := (tokenizer.Byte{}).Decode(a); text != want {
		t.Errorf("streamed %q, the tokens decode to %q", text, want)
	}
	if b, _ := run(1, 0, 0); !reflect.DeepEqual(a, b) {
		t.Errorf("greedy twice: %v then %v", a, b)
	}
	if b, _ := run(2, 0, 0); !reflect.DeepEqual(a, b) {
		t.Errorf("greedy at tp 1 %v, at tp 2 %v", a, b)
	}
	s1, _ := run(1, 1.0, 20)
	if s2, _ := run(2, 1.0, 20); !reflect.DeepEqual(s1, s2) {
		t.Errorf("sampled at tp 1 %v, at tp 2 %v", s1, s2)
	}
	if reflect.DeepEqual(s1, a) {
		t.Errorf("sampling at temperature 1 gave the greedy tokens %v", a)
	}
}

// TestSample: greedy picks the largest logit (lowest id on a tie); top-k 1
// is greedy at any temperature; top-k never draws outside the k best.
func TestSample(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	logits := []float32{0.5, 2, 2, -1, 1.5}
	if got := sample(logits, 0, 0, r); got != 1 {
		t.Errorf("greedy %d, want 1", got)
	}
	for i := 0; i < 200; i++ {
		if got := sample(logits, 5, 1, r); got != 1 {
			t.Fatalf("top-1 drew %d", got)
		}
		if got := sample(logits, 5, 3, r); got != 1 && got != 2 && got != 4 {
			t.Fatalf("top-3 drew %d", got)
		}
	}
}

// TestEvaluateSource: eval of a pretrained model over a token file is equal
// at tp 1 and 2, and equal to eval over the same text as a text file.
func TestEvaluateSource(t *testing.T) {
	dir := tinyGPT2(t, tinyGPT2Spec, interop.HFOptions{})
	text := textFile(t)
	b, _ := os.ReadFile(text)
	ids := (tokenizer.Byte{}).Encode(string(b)[:1700])
	tokens := filepath.Join(t.TempDir(), "t.bin")
	if err := data.WriteTokenFile(tokens, ids, (tokenizer.Byte{}).VocabSize()); err != nil {
		t.Fatal(err)
	}
	var losses []float64
	for _, tp := range []int{1, 2} {
		res := make([]SourceEval, tp)
		err := nccl.RunInProcess(tp, func(c nccl.Comm) error {
			var err error
			res[c.Rank()], err = EvaluateSource(context.Background(), c, EvalOptions{Source: dir, Data: tokens, Seq: 16, BatchSize: 4, Device: "cpu"})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, res[0].Loss)
		if res[0].Seq != 16 || res[0].Windows != (1700-1)/16 {
			t.Errorf("tp %d: seq %d, %d windows; want seq 16, %d windows", tp, res[0].Seq, res[0].Windows, (1700-1)/16)
		}
	}
	if math.Abs(losses[0]-losses[1]) > 1e-5 || !(losses[0] > 0) {
		t.Errorf("eval loss at tp 1 %.7f, tp 2 %.7f", losses[0], losses[1])
	}
	// The same text as a text file: the same windows, the same loss.
	txt := filepath.Join(t.TempDir(), "t.txt")
	os.WriteFile(txt, []byte(string(b)[:1700]), 0o644)
	err := nccl.RunInProcess(1, func(c nccl.Comm) error {
		e, err := EvaluateSource(context.Background(), c, EvalOptions{Source: dir, Data: txt, Seq: 16, BatchSize: 4, Device: "cpu"})
		if err == nil && e.Loss != losses[0] {
			t.Errorf("text file loss %.7f, token file %.7f", e.Loss, losses[0])
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSourceConfigDropsTrainingLayout: a checkpoint saved by a run with a
// pipeline, sequence parallelism and ZeRO-3 over groups of 2 (hybrid
// sharding) reads as a plain model config, valid for ranks laid out
// otherwise (eval, generate at any tp).
func TestSourceConfigDropsTrainingLayout(t *testing.T) {
	dir := t.TempDir()
	cfg := config.DefaultConfig()
	cfg.NTasks, cfg.TP, cfg.PP, cfg.MicroBatches, cfg.PPSplit, cfg.SP, cfg.Zero, cfg.ZeroGroup = 16, 2, 2, 4, "1,1", true, 3, "2"
	raw, _ := json.Marshal(cfg)
	st, _ := json.Marshal(ckpt.State{Config: raw, Vocab: 128})
	if err := os.WriteFile(filepath.Join(dir, ckpt.StateFile), st, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := SourceConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.PP != 0 || got.MicroBatches != 0 || got.PPSplit != "" || got.SP || got.Zero != 0 || got.ZeroGroup != "" {
		t.Errorf("config from the checkpoint keeps the training layout: pp %d mb %d split %q sp %v zero %d group %q", got.PP, got.MicroBatches, got.PPSplit, got.SP, got.Zero, got.ZeroGroup)
	}
	got.NTasks, got.TP = 1, 1
	if err := got.Validate(); err != nil {
		t.Errorf("the config does not validate at one rank: %v", err)
	}
}

// recordWrites keeps each write.
type recordWrites struct{ writes []string }

func (r *recordWrites) Write(p []byte) (int, error) {
	r.writes = append(r.writes, string(p))
	return len(p), nil
}

// Generated text streams as it grows, one invalid byte included: only an
// incomplete UTF-8 sequence at the end waits for the next token (an
// invalid byte stopped the stream until the last token, so that
// generate --tokens 20000 printed nothing more after it).
func TestTextStreamHoldsOnlyIncompleteCharacters(t *testing.T) {
	var r recordWrites
	s := textStream{w: &r}
	text := ""
	for i, tc := range []struct{ add, want string }{
		{"ab", "ab"},
		{"\xff", "\xff"},           // invalid: written as it is
		{"cd", "cd"},               // the stream goes on after it
		{"\xe2\x82", ""},           // the first two bytes of "€"
		{"\xac!", "\xe2\x82\xac!"}, // completed
		{"\x80", "\x80"},           // a lone continuation byte can never complete
		{"\xf0\x9f", ""},           // the start of a 4-byte character
	} {
		text += tc.add
		n := len(r.writes)
		s.write(text, false)
		got := strings.Join(r.writes[n:], "")
		if got != tc.want {
			t.Fatalf("token %d (+%q): wrote %q, want %q", i, tc.add, got, tc.want)
		}
	}
	s.write(text, true)
	if got := strings.Join(r.writes, ""); got != text {
		t.Fatalf("the stream wrote %q, the text is %q", got, text)
	}
}

// A tokenizer.json's post-processor puts its special tokens around a prompt
// as around each training document (train/data's
// TestPostProcessorBeginsEachSequence): Llama 3's TemplateProcessing its
// <|begin_of_text|> before it.
func TestPostProcessorBeginsEachPrompt(t *testing.T) {
	tok, err := tokenizer.LoadHF(templateHF)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := promptIDs(tok, ""); !reflect.DeepEqual(got, []int{262}) {
		t.Errorf("the empty prompt: %v, want [262] (<|begin_of_text|>)", got)
	}
	if got, _ := promptIDs(tok, "he"); !reflect.DeepEqual(got, []int{262, 256}) {
		t.Errorf("prompt he: %v, want [262 256]", got)
	}
}

// A template that also ends each sequence with end-of-text (<s> $A </s>):
// a prompt keeps its begin but not the end (generation would start after
// the end).
func TestTemplateEndingWithEOTPrompt(t *testing.T) {
	tok, err := tokenizer.LoadHF(templateEOTHF)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := promptIDs(tok, "he"); !reflect.DeepEqual(got, []int{262, 256}) {
		t.Errorf("prompt he: %v, want [262 256]: no end-of-text after it", got)
	}
}
