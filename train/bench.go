package train

import (
	"fmt"
	"math/rand/v2"

	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/spec"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// StepTiming is what BenchStep measured.
type StepTiming struct {
	Params        int64     // parameters of the model
	TokensPerStep int       // bsz * seq
	FlopsPerToken float64   // spec.ModelFlopsPerToken, what MFU counts
	StepS         []float64 // seconds of each timed step
	Loss          float64   // loss of the last step (a sanity check: about ln(vocab) at init)
	HostSyncs     int64     // host synchronisations in the last step (GPU step: 1); 0 on the CPU
	CommS         []float64 // seconds of each timed step in collectives (BenchStepDP)
	MemPeak       int64     // the engine's peak bytes on a rank (BenchStepDP)
}

// BenchStep times the training loop's steps (forward, backward, grad norm,
// AdamW) of cfg's model on one rank (tp=1, dp=1) on random tokens: warmup
// untimed steps, then steps timed ones. The vocabulary is
// data.PlanVocab's, the run's, without loading any data.
func BenchStep(cfg config.Config, dev tensor.Device, warmup, steps int) (StepTiming, error) {
	cfg.NTasks, cfg.TP, cfg.GradAccum = 1, 1, 1
	if err := cfg.Validate(); err != nil {
		return StepTiming{}, err
	}
	ds, err := benchData(cfg, cfg.BatchSize)
	if err != nil {
		return StepTiming{}, err
	}
	world := nccl.NewInProcess(1)[0]
	defer world.Close()
	cfg.Steps, cfg.Shuffle = warmup+steps, false
	t, err := newTrainer(cfg, world, Options{Data: ds, Device: dev}, nil)
	if err != nil {
		return StepTiming{}, err
	}
	defer t.close()
	return t.benchSteps(warmup, steps)
}

// benchSteps runs warmup and then steps timed steps of t.
func (t *trainer) benchSteps(warmup, steps int) (StepTiming, error) {
	cfg, vocab := t.cfg, t.data.Vocab
	res := StepTiming{Params: spec.ParamCount(cfg, vocab), TokensPerStep: cfg.BatchSize * cfg.Seq,
		FlopsPerToken: spec.ModelFlopsPerToken(cfg, vocab)}
	for s := range warmup + steps {
		m, err := t.trainStep(s)
		if err != nil {
			return res, fmt.Errorf("step %d: %w", s, err)
		}
		if s >= warmup {
			res.StepS, res.CommS = append(res.StepS, m.StepS), append(res.CommS, m.CommS)
		}
		res.Loss, res.HostSyncs, res.MemPeak = m.Loss, m.HostSyncs, m.MemPeakBytes
	}
	return res, nil
}

// BenchStepDP is BenchStep on dp data-parallel ranks of this process (tp
// 1, the config's ZeRO stage), each on a CPU device of threads threads:
// rank 0's step and communication times and its engine peak.
func BenchStepDP(cfg config.Config, dp, threads, warmup, steps int) (StepTiming, error) {
	cfg.NTasks, cfg.TP, cfg.GradAccum = dp, 1, 1
	if err := cfg.Validate(); err != nil {
		return StepTiming{}, err
	}
	ds, err := benchData(cfg, cfg.BatchSize*dp)
	if err != nil {
		return StepTiming{}, err
	}
	cfg.Steps, cfg.Shuffle = warmup+steps, false
	var res StepTiming
	err = nccl.RunInProcess(dp, func(world nccl.Comm) error {
		dev := tensor.NewCPU()
		dev.SetThreads(threads)
		t, err := newTrainer(cfg, world, Options{Data: ds, Device: dev}, nil)
		if err != nil {
			return err
		}
		defer t.close()
		r, err := t.benchSteps(warmup, steps)
		if world.Rank() == 0 {
			res = r
		}
		return err
	})
	return res, err
}

// benchData is samples sequences of random tokens (or labels) of cfg's
// shape, below data.PlanVocab's vocabulary, as both the training and the
// validation set.
func benchData(cfg config.Config, samples int) (*data.Data, error) {
	vocab, _, err := data.PlanVocab(cfg)
	if err != nil {
		return nil, err
	}
	B, T := samples, cfg.Seq
	r := rand.New(rand.NewPCG(uint64(cfg.Seed), 1))
	d := &data.Dataset{Seq: T, Tokens: make([]int32, B*T), Lengths: make([]int32, B)}
	if cfg.LM() {
		d.Targets = make([]int32, B*T)
	} else {
		d.Labels = make([]int32, B)
	}
	for i := range d.Tokens {
		d.Tokens[i] = int32(r.IntN(vocab))
		if d.Targets != nil {
			d.Targets[i] = int32(r.IntN(vocab))
		}
	}
	for i := range d.Lengths {
		d.Lengths[i] = int32(T)
		if d.Labels != nil {
			d.Labels[i] = int32(i % 2)
		}
	}
	return &data.Data{Tokenizer: tokenizer.Byte{}, Vocab: vocab, Train: d, Val: d}, nil
}
