package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/metrics"
	"github.com/hpcrun/hpcrun/train/spec"
)

// Options are the parts of a run that do not belong in train.toml.
type Options struct {
	// RunDir receives the metrics (RunDir/metrics/rank-NNNNN.jsonl); ""
	// writes none.
	RunDir string
	// Device runs the kernels; nil opens the one the config's device asks
	// for (OpenDevice), closed when Run returns.
	Device tensor.Device
	// GPUOrdinal picks this task's CUDA device given how many are visible
	// (idrenv.Env.GPUOrdinal); nil picks device 0.
	GPUOrdinal func(count int) int
	// Data is the prepared data; nil prepares it from the config.
	Data *data.Data
	// Log receives progress lines (rank 0 only); nil is silent.
	Log io.Writer
	// Host names this machine in the run line; "" uses os.Hostname.
	Host string
	// Stop, when closed on any rank, makes every rank stop after the same
	// step, save a checkpoint and return ErrStopped (the time-limit
	// signal). nil: no stop; no per-step agreement either.
	Stop <-chan struct{}
	// Resume is a checkpoint to start from: a step dir, a checkpoint root
	// or a run dir. "" resumes from RunDir's ckpt/latest when there is one.
	Resume string
	// StopReason says why Stop was closed (Ctrl-C, the time limit, ...),
	// for the end line in place of ErrStopped's "stopped on request"; nil
	// keeps that.
	StopReason func() string
	// RanksPerNode is how many ranks each node runs, for zero_group node
	// (idrenv.Env.LocalWorldSize); 0: every rank on one node.
	RanksPerNode int
}

// Result is what one rank saw of a run.
type Result struct {
	Steps  int          // optimizer steps made by this call
	Start  int          // optimizer steps done before it (from the checkpoint resumed)
	Losses []float64    // training loss of every step, averaged over the DP group
	Evals  []EvalResult // validations, in order
}

// EvalResult is one validation pass over the validation set.
type EvalResult struct {
	Step     int
	Loss     float64
	Accuracy float64 // NaN for a language model
}

// Run trains cfg on this rank. world is the job's communicator (rank =
// tp_rank + tp*(dp_rank + dp*pp_rank), Megatron order, parallel.Mesh);
// every rank of world must call Run with the same cfg. It writes a run line, a step line per optimizer step, eval lines
// and an end line to the rank's metrics file, and returns the first error:
// its own, or the one a failed peer caused in a collective.
func Run(ctx context.Context, cfg config.Config, world nccl.Comm, opt Options) (res *Result, err error) {
	start := time.Now()
	var w *metrics.Writer
	if opt.RunDir != "" {
		if w, err = metrics.Create(opt.RunDir, world.Rank()); err != nil {
			return nil, err
		}
		defer func() {
			// A panic is recorded as the failure it is, then goes on.
			p := recover()
			if p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
			status := ""
			if p == nil && err != nil && (ctx.Err() != nil || errors.Is(err, ErrStopped)) {
				status = metrics.StatusInterrupted
			}
			endErr := err
			if errors.Is(err, ErrStopped) && opt.StopReason != nil {
				endErr = errors.New(strings.Replace(err.Error(), ErrStopped.Error(), opt.StopReason(), 1))
			}
			w.End(status, endErr, time.Since(start))
			if cerr := w.Close(); cerr != nil && err == nil {
				err = cerr
			}
			if p != nil {
				nccl.Abort(world, err)
				panic(p)
			}
		}()
	}
	t, err := newTrainer(cfg, world, opt, w)
	if err != nil {
		return nil, err
	}
	defer t.close()
	if err := t.resumeIfAny(opt); err != nil {
		return nil, err
	}
	return t.run(ctx)
}

// resumeIfAny loads opt.Resume, or else the run dir's latest checkpoint,
// or else the config's resume_from, or else the pretrained weights of
// init_from.
func (t *trainer) resumeIfAny(opt Options) error {
	dir := ""
	var err error
	if opt.Resume != "" {
		dir, err = ckpt.Resolve(opt.Resume)
	} else if opt.RunDir != "" {
		dir, err = ckpt.Latest(rundir.Dir(opt.RunDir).Ckpt())
	}
	if err == nil && dir == "" && t.cfg.ResumeFrom != "" {
		dir, err = ckpt.Resolve(t.cfg.ResumeFrom)
	}
	if err = agree(t.world, err, "finding the checkpoint"); err != nil {
		return err
	}
	if dir == "" {
		if t.cfg.InitFrom == "" {
			return nil
		}
		return agree(t.world, t.loadPretrained(), "init_from "+t.cfg.InitFrom)
	}
	return t.resume(dir)
}

// trainer is the state of one rank's run.
type trainer struct {
	cfg     config.Config
	world   nccl.Comm
	mesh    *parallel.Mesh // this rank's place on the PP x DP x TP grid, and its groups
	dev     tensor.Device
	data    *data.Data
	model   model
	opt     *AdamW          // the moments (replicated) or the hyperparameters (ZeRO)
	optim   optimizer       // replicated AdamW or ZeRO
	zero    *ZeRO           // --zero 1 to 3: optim
	lm      deviceLM        // the model, when the step keeps its loss on the device (step.go)
	dpGroup *parallel.Group // the data-parallel group, for the device-kept loss
	pipe    *pipeline       // pp > 1: this rank's pipeline stage
	stage   stage           // what runs on this rank: pipe, or the model whole (step.go)
	sampler *data.Sampler
	w       *metrics.Writer
	log     io.Writer
	total   int // optimizer steps
	perEp   int // optimizer steps per epoch

	epoch   int
	order   []int        // this rank's sample order in the current epoch
	pos     int          // next micro-batch in order
	batches []data.Batch // the step's micro-batches
	commNow func() time.Duration

	runDir   string
	host     string // names this machine in the run line
	stop     <-chan struct{}
	closeDev func() error // closes a device the trainer opened
	unwatch  func()       // ends watchDeviceWaits
	start    int          // optimizer steps done before this run (resumed)
}

// Check is everything that can be known wrong about cfg before a rank
// starts on this machine: CheckJob's checks and the device. hpcrun run
// calls it so that bad input fails in the terminal.
func Check(cfg config.Config) error {
	if err := CheckJob(cfg); err != nil {
		return err
	}
	return checkDevice(cfg)
}

// CheckJob checks the config and the data (files, columns, labels, sizes
// against the batch and the data-parallel degree), but not the device: a
// job submitted from a login node runs on GPUs the login node lacks.
// hpcrun submit calls it.
func CheckJob(cfg config.Config) error {
	ds, err := data.Prepare(cfg)
	if err != nil {
		return err
	}
	return checkSteps(cfg, ds)
}

// checkSteps reports a training set too small for one optimizer step.
func checkSteps(cfg config.Config, ds *data.Data) error {
	perRank := ds.Train.Len() / cfg.DP()
	if perRank/cfg.BatchSize/cfg.Micro() == 0 {
		return fmt.Errorf("%d training samples make no full step of bsz %d x micro-batches %d x data-parallel %d: lower --bsz, --grad-accum or --micro-batches, or give more samples",
			ds.Train.Len(), cfg.BatchSize, cfg.Micro(), cfg.DP())
	}
	return nil
}

func newTrainer(cfg config.Config, world nccl.Comm, opt Options, w *metrics.Writer) (*trainer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opt.Device == nil {
		if err := checkDevice(cfg); err != nil {
			return nil, err
		}
	}
	if world.Size() != cfg.NTasks {
		return nil, fmt.Errorf("the job has %s but the config says ntasks = %d", units.Count(world.Size(), "rank"), cfg.NTasks)
	}
	ds := opt.Data
	if ds == nil {
		var err error
		if ds, err = data.Prepare(cfg); err != nil {
			return nil, err
		}
	}
	t := &trainer{cfg: cfg, world: world, data: ds, w: w, dev: opt.Device, runDir: opt.RunDir, host: opt.Host, stop: opt.Stop}
	if world.Rank() == 0 {
		t.log = opt.Log
	}
	if t.dev == nil {
		dev, note, err := OpenDevice(cfg.Device, opt.GPUOrdinal)
		if err != nil {
			return nil, err
		}
		t.dev = dev
		if c, ok := dev.(interface{ Close() error }); ok {
			t.closeDev = c.Close
		}
		if note != "" {
			t.logf("%s", note)
		}
	}
	// Before this, --precision bf16 trained in float32 on a GPU, unsaid.
	if err := setPrecision(t.dev, cfg.Precision); err != nil {
		t.close()
		return nil, err
	}
	if note := commNote(cfg, t.dev, world); note != "" {
		t.logf("%s", note)
	}
	mesh, err := newMesh(cfg, world, opt.RanksPerNode)
	if err != nil {
		return nil, err
	}
	t.mesh = mesh
	t.unwatch = watchDeviceWaits(t.dev, world)
	t.commNow = func() time.Duration {
		d := t.mesh.TP.Stats().Total().Time + t.mesh.DP.Stats().Total().Time
		if t.mesh.ZeroReplicas != nil {
			d += t.mesh.ZeroShard.Stats().Total().Time + t.mesh.ZeroReplicas.Stats().Total().Time
		}
		if t.pipe != nil {
			d += t.pipe.commTime()
		}
		return d
	}

	if t.sampler, err = data.NewSampler(ds.Train.Len(), cfg.DP(), t.mesh.DPRank(), cfg.Seed, cfg.Shuffle); err != nil {
		return nil, err
	}
	if err := checkSteps(cfg, ds); err != nil {
		return nil, err
	}
	t.perEp = t.sampler.Len() / cfg.BatchSize / cfg.Micro()
	t.total = cfg.Steps
	if t.total == 0 {
		t.total = cfg.Epochs * t.perEp
	}
	if t.model, err = newModel(cfg, ds, mesh, t.dev); err != nil {
		return nil, err
	}
	if _, note, _ := AttentionFused(cfg, t.dev); note != "" {
		t.logf("%s", note)
	}
	var why string
	if t.lm, why = lossOnDevice(t.dev, t.model, cfg.Stages() > 1); why != "" {
		t.logf("%s", why)
	}
	t.stage, t.batches = wholeModel{t.model, t.lm}, make([]data.Batch, cfg.Micro())
	if cfg.Stages() > 1 {
		tm, ok := t.model.(*transformer)
		if !ok {
			return nil, fmt.Errorf("pp %d: this model has no pipeline split: use pp 1", cfg.Stages())
		}
		if t.pipe, err = newPipeline(tm, mesh); err != nil {
			return nil, err
		}
		t.stage = t.pipe
	}
	params := t.model.Params()
	var pp nccl.Comm
	var skip *parallel.Param
	if t.pipe != nil {
		pp, skip = t.mesh.PP, t.pipe.uncounted()
	}
	if cfg.Zero > 0 {
		if t.zero, err = newOptimZeRO(cfg, t.model, t.dev, t.mesh); err != nil {
			return nil, err
		}
		t.opt, t.optim = t.zero.AdamW, t.zero
		if t.pipe != nil {
			if err := t.zero.setPipeline(pp, skip); err != nil {
				return nil, err
			}
		}
	} else {
		if t.opt, err = NewAdamW(t.dev, params, cfg.WeightDecay, cfg.GradClip); err != nil {
			return nil, err
		}
		if t.optim, err = newReplicated(t.dev, params, t.opt, t.mesh.DP, t.mesh.TP, pp, skip, cfg.GradClip, cfg.GradReduceBF16()); err != nil {
			t.opt.Close()
			return nil, err
		}
	}
	t.opt.SetBetas(cfg.Adam())
	t.dpGroup = parallel.NewDeviceGroup(t.mesh.DP, t.dev)
	if w != nil {
		if err := t.writeRunLine(); err != nil {
			return nil, err
		}
	}
	t.logf("%s %d layers dim %d heads %d seq %d: %.2fM params, %stp %d x dp %d%s, %s (%d per epoch); %s",
		cfg.Model, cfg.Layers, cfg.Dim, cfg.Heads, cfg.Seq, float64(spec.ParamCount(cfg, ds.Vocab))/1e6,
		pipeNote(cfg), cfg.TP, cfg.DP(), memoryModes(cfg), units.Count(t.total, "step"), t.perEp, ds.Describe())
	return t, nil
}

func (t *trainer) close() {
	if t.pipe != nil {
		t.pipe.close()
	}
	// The step's device buffers go back before the device closes (its
	// Close frees what is left, but reports what it could not).
	if t.optim != nil {
		t.optim.close()
	}
	if t.model != nil {
		t.model.Close()
	}
	// The mesh's NCCL communicators live in the device's context: they go
	// first, then the device, whose Close reports what it could not free.
	if t.unwatch != nil {
		t.unwatch()
	}
	if t.mesh != nil {
		t.mesh.Close()
	}
	if t.closeDev != nil {
		if err := t.closeDev(); err != nil {
			t.logf("closing the device: %v", err)
		}
	}
}

func (t *trainer) logf(format string, args ...any) {
	if t.log != nil {
		fmt.Fprintf(t.log, format+"\n", args...)
	}
}

func (t *trainer) writeRunLine() error {
	cfgJSON, err := json.Marshal(t.cfg)
	if err != nil {
		return err
	}
	host := t.host
	if host == "" {
		host, _ = os.Hostname()
	}
	return t.w.Run(metrics.RunInfo{
		Config: cfgJSON, Rank: t.world.Rank(), World: t.world.Size(),
		TPRank: t.mesh.TPRank(), DPRank: t.mesh.DPRank(), TP: t.cfg.TP, DP: t.cfg.DP(),
		PPRank: t.mesh.PPRank(), PP: t.mesh.PPSize(),
		Host: host, Device: t.dev.Name(), TotalSteps: t.total,
		Params: spec.ParamCount(t.cfg, t.data.Vocab), FlopsPerToken: spec.ModelFlopsPerToken(t.cfg, t.data.Vocab),
		HardwareFlopsPerToken: spec.HardwareFlopsPerToken(t.cfg, t.data.Vocab),
	})
}

// nextBatch gathers this rank's next micro-batch into b, starting a new
// epoch (and a new shuffle) when the current one has no whole step left:
// the samples of an epoch that fill no step of micro-batches are left out,
// so that an epoch is perEp steps and a step never mixes two epochs.
func (t *trainer) nextBatch(b *data.Batch) {
	bsz := t.cfg.BatchSize
	if t.order == nil || t.pos+bsz > t.perEp*t.cfg.Micro()*bsz {
		if t.order != nil {
			t.epoch++
		}
		t.order, t.pos = t.sampler.Epoch(t.epoch), 0
	}
	t.data.Train.Gather(b, t.order[t.pos:t.pos+bsz])
	t.pos += bsz
}

func (t *trainer) run(ctx context.Context) (*Result, error) {
	res := &Result{Start: t.start}
	if t.start == 0 && t.cfg.EvalEvery > 0 {
		// The baseline: the loss of the initial (or pretrained) weights.
		if err := t.evalAndLog(res, 0); err != nil {
			return res, err
		}
	}
	for step := t.start; step < t.total; step++ {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("interrupted at step %d: %w", step, err)
		}
		s, err := t.trainStep(step)
		if err == nil {
			err = t.data.Train.Err()
		}
		if err != nil {
			return res, fmt.Errorf("step %d: %w", step+1, err)
		}
		res.Steps++
		res.Losses = append(res.Losses, s.Loss)
		if t.w != nil {
			if err := t.w.Step(s); err != nil {
				return res, err
			}
		}
		last := step+1 == t.total
		if last || (t.cfg.EvalEvery > 0 && (step+1)%t.cfg.EvalEvery == 0) {
			if err := t.evalAndLog(res, step+1); err != nil {
				return res, err
			}
		}
		if step == 0 || (step+1)%10 == 0 || last {
			t.logf("step %d/%d: loss %.4f lr %.2e grad_norm %.3f %.3fs (comm %.3fs)",
				s.Step, t.total, s.Loss, s.LR, s.GradNorm, s.StepS, s.CommS)
		}
		stop, err := t.stopRequested()
		if err != nil {
			return res, err
		}
		every := t.cfg.CkptEvery
		saved := false
		if t.runDir != "" && every >= 0 && (last || stop || (every > 0 && (step+1)%every == 0)) {
			if err := t.save(step + 1); err != nil {
				return res, err
			}
			saved = true
		}
		if stop && !last {
			if saved {
				return res, fmt.Errorf("step %d of %d, checkpoint saved: %w", step+1, t.total, ErrStopped)
			}
			return res, fmt.Errorf("step %d of %d, no checkpoint (no run dir, or ckpt_every < 0): %w", step+1, t.total, ErrStopped)
		}
	}
	return res, nil
}

// evalAndLog validates after step optimizer steps and records the result
// in res, the metrics and the log.
func (t *trainer) evalAndLog(res *Result, step int) error {
	e, err := t.evaluate(step)
	if err != nil {
		return fmt.Errorf("validation at step %d: %w", step, err)
	}
	res.Evals = append(res.Evals, e)
	if t.w != nil {
		if err := t.w.Eval(metrics.Eval{Step: e.Step, Loss: e.Loss, Accuracy: e.Accuracy}); err != nil {
			return err
		}
	}
	if math.IsNaN(e.Accuracy) {
		t.logf("step %d: val loss %.4f", e.Step, e.Loss)
	} else {
		t.logf("step %d: val loss %.4f accuracy %.1f%%", e.Step, e.Loss, 100*e.Accuracy)
	}
	return nil
}

// dpMean averages a scalar over the data-parallel group.
func (t *trainer) dpMean(v float64) (float64, error) {
	if t.mesh.DP.Size() == 1 {
		return v, nil
	}
	buf := []float32{float32(v)}
	if err := t.mesh.DP.AllReduce(buf, nccl.Avg); err != nil {
		return 0, err
	}
	return float64(buf[0]), nil
}

// evaluate runs the validation set, split over the DP ranks, and returns its
// mean loss and (classifier) accuracy over the real samples, the same on
// every rank.
func (t *trainer) evaluate(step int) (EvalResult, error) {
	val := t.data.Val
	dp := t.cfg.DP()
	bsz := t.cfg.BatchSize
	var mine []int
	for i := t.mesh.DPRank(); i < val.Len(); i += dp {
		mine = append(mine, i)
	}
	// Every DP rank runs the same number of batches (a collective per
	// layer), padding the last one with repeats whose targets are masked
	// out (-1): the batch's mean loss is then the mean over its real
	// samples (a language model's samples all have T targets).
	most := (val.Len() + dp - 1) / dp
	nb := (most + bsz - 1) / bsz
	var loss, correct float64 // loss summed over real samples
	idx := make([]int, bsz)
	var b data.Batch
	for k := 0; k < nb; k++ {
		real := min(max(len(mine)-k*bsz, 0), bsz)
		for j := range idx {
			if i := k*bsz + j; i < len(mine) {
				idx[j] = mine[i]
			} else if len(mine) > 0 {
				idx[j] = mine[i%len(mine)]
			} else {
				idx[j] = 0
			}
		}
		val.Gather(&b, idx)
		if err := val.Err(); err != nil {
			return EvalResult{}, err
		}
		maskPadding(&b, real)
		l, err := t.stage.evalForward(&b)
		if err != nil {
			return EvalResult{}, err
		}
		loss += l * float64(real)
		if pred := t.model.Predictions(); pred != nil {
			for j := 0; j < real; j++ {
				if pred[j] == b.Labels[j] {
					correct++
				}
			}
		}
	}
	// sums: loss, correct, count
	sums := []float32{float32(loss), float32(correct), float32(len(mine))}
	if t.pipe != nil {
		// The loss and the predictions are the last stage's.
		if err := t.pipe.sumStages(sums[:2]); err != nil {
			return EvalResult{}, err
		}
	}
	if dp > 1 {
		if err := t.mesh.DP.AllReduce(sums, nccl.Sum); err != nil {
			return EvalResult{}, err
		}
	}
	if sums[2] == 0 {
		return EvalResult{}, errors.New("the validation set is empty")
	}
	e := EvalResult{Step: step, Loss: float64(sums[0] / sums[2]), Accuracy: math.NaN()}
	if t.cfg.Model == "bert" {
		e.Accuracy = float64(sums[1] / sums[2])
	}
	return e, nil
}

// maskPadding sets the targets (labels) of b's samples from real on to -1,
// which the loss ignores.
func maskPadding(b *data.Batch, real int) {
	for j := real; j < b.B; j++ {
		if b.Targets != nil {
			for i := j * b.T; i < (j+1)*b.T; i++ {
				b.Targets[i] = -1
			}
		}
		if b.Labels != nil {
			b.Labels[j] = -1
		}
	}
}

// newMesh lays world out for cfg: the (pp, dp, tp) grid, and under hybrid
// sharding (zero_group) ZeRO's groups of the data-parallel ranks.
func newMesh(cfg config.Config, world nccl.Comm, ranksPerNode int) (*parallel.Mesh, error) {
	mesh, err := parallel.NewMeshPP(world, cfg.Stages(), cfg.TP)
	if err != nil || cfg.Zero == 0 {
		return mesh, err
	}
	if ranksPerNode <= 0 {
		ranksPerNode = world.Size()
	}
	shards, err := cfg.ZeroShards(ranksPerNode)
	if err == nil {
		err = mesh.ShardZeRO(shards)
	}
	if err != nil {
		mesh.Close()
		return nil, err
	}
	return mesh, nil
}
