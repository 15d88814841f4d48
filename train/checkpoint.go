package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/tensor"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/hpcrun/hpcrun/train/config"
)

// ErrStopped is returned (wrapped) by Run when a stop was requested
// (Options.Stop, the time-limit signal): every rank stopped after the same
// step and, when the run has a run dir, saved its checkpoint; resuming
// continues from it.
var ErrStopped = errors.New("stopped on request")

// agree makes every rank of world learn whether any rank failed (an
// all-reduce MAX of a failure flag, which is also a barrier): it returns
// this rank's own err, or an error saying that another rank failed.
func agree(world nccl.Comm, err error, what string) error {
	flag := []float32{0}
	if err != nil {
		flag[0] = 1
	}
	if cerr := world.AllReduce(flag, nccl.Max); cerr != nil {
		if err != nil {
			return err
		}
		return fmt.Errorf("%s: %w", what, cerr)
	}
	if err != nil {
		return err
	}
	if flag[0] > 0 {
		return fmt.Errorf("%s failed on another rank (its error is in its log)", what)
	}
	return nil
}

// stopRequested tells whether any rank was asked to stop: an all-reduce
// MAX of each rank's flag, so that all ranks stop after the same step.
func (t *trainer) stopRequested() (bool, error) {
	if t.stop == nil {
		return false, nil
	}
	flag := []float32{0}
	select {
	case <-t.stop:
		flag[0] = 1
	default:
	}
	if err := t.world.AllReduce(flag, nccl.Max); err != nil {
		return false, fmt.Errorf("stop agreement: %w", err)
	}
	return flag[0] > 0, nil
}

// tensorInfos describes how this run's parameters are cut.
func (t *trainer) tensorInfos() []ckpt.TensorInfo {
	return t.tensorInfosOf(t.model.Params())
}

// tensorInfosOf describes how params, some of this run's, are cut.
func (t *trainer) tensorInfosOf(params []*parallel.Param) []ckpt.TensorInfo {
	var vocabParam, headParam *parallel.Param // the tables whose rows past the vocabulary are padding
	if tr, ok := t.model.(*transformer); ok {
		if tr.wte != nil {
			vocabParam = tr.wte.Weight
		}
		if tr.gpt && !tr.tied && tr.head != nil {
			headParam = tr.head.Weight
		}
	} else if b, ok := t.model.(*hfBERT); ok {
		vocabParam = b.wte.Weight
	}
	var out []ckpt.TensorInfo
	for _, p := range params {
		ti := ckpt.TensorInfo{Name: p.Name, Full: p.Full, Split: !p.Shard.Replicated(), Dim: p.Shard.Dim, Blocks: p.Shard.Blocks,
			Replicas: p.Shard.Replicas, Shared: p.Shard.Shared}
		if p == vocabParam || p == headParam {
			ti.Rows = t.data.Vocab
		}
		out = append(out, ti)
	}
	return out
}

// paramsToHost copies the values of params to the host through set, when
// keep says so: under ZeRO-3 the blocks' are gathered, and every DP rank
// calls it together, those that write nothing with keep false.
func paramsToHost(set *parallel.ParamSet, params []*parallel.Param, keep bool) ([]ckpt.Tensor, error) {
	var out []ckpt.Tensor
	for _, p := range params {
		var vals []float32
		if keep {
			vals = make([]float32, p.Data.Len())
		}
		if err := set.ToHost(p, vals); err != nil {
			return nil, err
		}
		if keep {
			out = append(out, ckpt.Tensor{Name: p.Name, Shape: p.Data.Shape(), Data: vals})
		}
	}
	return out, nil
}

func hostTensor(dev tensor.Device, name string, x *tensor.Tensor) ckpt.Tensor {
	data := make([]float32, x.Len())
	dev.CopyToHost(data, x)
	return ckpt.Tensor{Name: name, Shape: x.Shape(), Data: data}
}

// save writes the checkpoint of step (optimizer steps done) on every rank
// of the world together: rank 0 prepares the temporary dir, each TP rank
// of DP rank 0 writes its model shard and optimizer state, rank 0 writes
// state.json; once all agree that their files are written and fsynced,
// rank 0 renames the dir and moves latest, and all agree again.
func (t *trainer) save(step int) error {
	root := rundir.Dir(t.runDir).Ckpt()
	rank0 := t.world.Rank() == 0
	what := fmt.Sprintf("checkpoint at step %d", step)
	var err error
	if rank0 {
		_, err = ckpt.Prepare(root, step, t.cfg.Checkpoints())
	}
	if err = agree(t.world, err, what); err != nil {
		return err
	}
	dir := ckpt.TempDir(root, step)
	var infos []ckpt.TensorInfo
	if t.pipe != nil {
		if infos, err = t.savePipeline(dir, step); err != nil {
			return err
		}
	} else {
		if t.mesh.DPRank() == 0 || t.zero != nil {
			err = t.writeShard(dir, step)
		}
		infos = t.tensorInfos()
	}
	if err == nil && rank0 {
		err = t.writeState(dir, step, infos)
	}
	if err == nil && rank0 && t.pipe != nil {
		err = t.removeZeroParts(dir)
	}
	if err = agree(t.world, err, what); err != nil {
		return t.abortSave(root, step, err)
	}
	if rank0 {
		_, err = ckpt.Commit(root, step, t.cfg.Checkpoints())
	}
	if err = agree(t.world, err, what); err != nil {
		return t.abortSave(root, step, err)
	}
	t.logf("step %d: checkpoint saved in %s", step, filepath.Join(root, ckpt.StepDir(step)))
	return nil
}

// abortSave ends a save that failed: rank 0, once every rank has stopped
// writing (they agreed on the failure), removes the temporary dir.
func (t *trainer) abortSave(root string, step int, err error) error {
	if t.world.Rank() == 0 {
		if aerr := ckpt.Abort(root, step); aerr != nil {
			t.logf("%v", aerr)
		}
	}
	return err
}

// nonFinite is the index of the first NaN or infinity of x, or -1.
func nonFinite(x []float32) int {
	for i, v := range x {
		if v-v != 0 { // NaN and ±Inf
			return i
		}
	}
	return -1
}

// writeShard writes this rank's files: on DP rank 0 the model shard and
// (without ZeRO) the AdamW moments; under ZeRO every DP rank writes the
// pieces of the moments it owns.
func (t *trainer) writeShard(dir string, step int) error {
	params := t.model.Params()
	set := t.model.ParamSet()
	if t.mesh.DPRank() == 0 || set.ShardsValues() {
		model, err := paramsToHost(set, params, t.mesh.DPRank() == 0) // every DP rank gathers ZeRO-3's blocks
		if err != nil {
			return err
		}
		if t.mesh.DPRank() == 0 {
			if err := ckpt.WriteModel(dir, t.mesh.TPRank(), t.cfg.TP, step, model); err != nil {
				return err
			}
		}
	}
	if t.zero != nil {
		if !t.writesZeroPieces() {
			return nil
		}
		return ckpt.WriteOptimZero(dir, t.mesh.TPRank(), t.mesh.DPRank(), step, t.opt.Steps(), t.zero.Pieces())
	}
	var m, v []ckpt.Tensor
	for i, p := range params {
		mt, vt := t.opt.Moments(i)
		m = append(m, hostTensor(t.dev, p.Name, mt))
		v = append(v, hostTensor(t.dev, p.Name, vt))
	}
	return ckpt.WriteOptim(dir, t.mesh.TPRank(), t.mesh.DPRank(), step, t.opt.Steps(), m, v)
}

func (t *trainer) writeState(dir string, step int, infos []ckpt.TensorInfo) error {
	cfgJSON, err := json.Marshal(t.cfg)
	if err != nil {
		return err
	}
	return ckpt.WriteState(dir, &ckpt.State{
		Format: ckpt.Format, Step: step, Epoch: t.epoch, SamplerPos: t.pos,
		RNG:   ckpt.RNG{Kind: "pcg(seed, epoch)", Seed: t.cfg.Seed},
		Model: t.cfg.Model, Vocab: t.data.Vocab, Config: cfgJSON,
		Mesh:    ckpt.Mesh{TP: t.cfg.TP, DP: t.cfg.DP(), PP: t.mesh.PPSize(), World: t.world.Size()},
		Tensors: infos, Saved: time.Now().UTC(), Zero: t.cfg.Zero, ZeroGroup: t.zeroGroup(),
	})
}

// checkState refuses a state.json whose sampler position cannot be in
// this run's training data (ckpt.State.Check has checked its ranges): the
// position is within an epoch at the saved dp, and so every product of it
// with the saved dp is at most the samples' count.
func (t *trainer) checkState(dir string, st *ckpt.State) error {
	sp := filepath.Join(dir, ckpt.StateFile)
	n := t.data.Train.Len()
	if st.Mesh.DP > n {
		return fmt.Errorf("checkpoint %s: mesh.dp %d: more data-parallel ranks than this run's %d training samples: give the saved run's --data, or resume from another step dir (the state is corrupt)", sp, st.Mesh.DP, n)
	}
	if per := n / st.Mesh.DP; st.SamplerPos > per {
		return fmt.Errorf("checkpoint %s: sampler_pos %d: past the %d samples of an epoch per data-parallel rank at the saved dp %d: give the saved run's --data, or resume from another step dir (the state is corrupt)", sp, st.SamplerPos, per, st.Mesh.DP)
	}
	return nil
}

// resume loads the checkpoint in dir (a step dir) into this rank's model,
// optimizer and sampler, resharding for this run's tp; every rank agrees
// that its load succeeded.
func (t *trainer) resume(dir string) error {
	err := t.load(dir)
	return agree(t.world, err, "resume from "+dir)
}

func (t *trainer) load(dir string) error {
	c, err := ckpt.Open(dir, true)
	if err != nil {
		return err
	}
	st := &c.State
	var saved config.Config
	if err := json.Unmarshal(st.Config, &saved); err != nil {
		return fmt.Errorf("checkpoint %s: config: %v", filepath.Join(dir, ckpt.StateFile), err)
	}
	if err := t.checkState(dir, st); err != nil {
		return err
	}
	for _, d := range []struct {
		name      string
		have, was any
	}{
		{"model", t.cfg.Model, saved.Model}, {"model", t.cfg.Model, st.Model}, {"layers", t.cfg.Layers, saved.Layers},
		{"dim", t.cfg.Dim, saved.Dim}, {"heads", t.cfg.Heads, saved.Heads},
		{"seq", t.cfg.Seq, saved.Seq}, {"vocab", t.data.Vocab, st.Vocab},
	} {
		if d.have != d.was {
			return fmt.Errorf("checkpoint %s was saved with %s %v, this run has %s %v: use the saved run's model settings, or another run dir",
				dir, d.name, d.was, d.name, d.have)
		}
	}
	params := t.model.Params()
	// A pipeline stage holds some of the tensors, each loaded by name.
	if t.pipe == nil && len(params) != len(st.Tensors) {
		return fmt.Errorf("checkpoint %s holds %d tensors, this model has %d", dir, len(st.Tensors), len(params))
	}
	for i, p := range params {
		vals, err := c.Load("", p.Name, p.Full, p.Shard)
		if err != nil {
			return err
		}
		t.model.ParamSet().Load(p, vals)
		m, err := c.Load("m", p.Name, p.Full, p.Shard)
		if err != nil {
			return err
		}
		v, err := c.Load("v", p.Name, p.Full, p.Shard)
		if err != nil {
			return err
		}
		for _, x := range []struct {
			what string
			vals []float32
		}{{"weights", vals}, {"first moment (m)", m}, {"second moment (v)", v}} {
			if j := nonFinite(x.vals); j >= 0 {
				return fmt.Errorf("checkpoint %s: the %s of %s hold %v at element %d of this rank's shard: the checkpoint was saved after training diverged, or is corrupt; give an earlier step dir to --resume-from",
					dir, x.what, p.Name, x.vals[j], j)
			}
		}
		// A mean of squares; sqrt(v) in the update would be NaN.
		for j, x := range v {
			if x < 0 {
				return fmt.Errorf("checkpoint %s: the second moment (v) of %s holds %v at element %d of this rank's shard: AdamW's v is never negative, the checkpoint is corrupt; give an earlier step dir to --resume-from",
					dir, p.Name, x, j)
			}
		}
		if t.zero != nil {
			// This DP rank keeps its range of the moments, whatever the
			// saved dp and ZeRO setting.
			if err := t.zero.LoadMoments(i, m, v); err != nil {
				return err
			}
			continue
		}
		mt, vt := t.opt.Moments(i)
		t.dev.CopyFromHost(mt, m)
		t.dev.CopyFromHost(vt, v)
	}
	t.opt.SetSteps(c.AdamStep)
	t.start, t.epoch = st.Step, st.Epoch
	t.order = t.sampler.Epoch(t.epoch)
	t.pos = min(st.SamplerPos, len(t.order))
	if st.Mesh.DP != t.cfg.DP() {
		// The same share of the epoch is done; which samples come next
		// differs, since the epoch's order is split over another DP.
		t.pos = min(st.SamplerPos*st.Mesh.DP/t.cfg.DP(), len(t.order))
		t.logf("checkpoint saved at data-parallel %d, this run has %d: epoch %d goes on from the same share, not the same samples", st.Mesh.DP, t.cfg.DP(), t.epoch)
	}
	t.logf("resumed from %s: step %d, epoch %d (saved at pp %d x dp %d x tp %d)", dir, st.Step, st.Epoch, max(st.Mesh.PP, 1), st.Mesh.DP, st.Mesh.TP)
	return nil
}

// zeroGroup is the data-parallel ranks a checkpoint's ZeRO pieces are cut
// over under hybrid sharding (ckpt.State.ZeroGroup), 0 without it.
func (t *trainer) zeroGroup() int {
	if t.zero == nil || t.mesh.ZeroReplicas == nil {
		return 0
	}
	return t.mesh.ZeroShard.Size()
}

// writesZeroPieces says whether this rank writes its ZeRO pieces: every
// data-parallel rank, or under hybrid sharding those of the first group
// (DP ranks 0 to zeroGroup-1; the others hold the same pieces).
func (t *trainer) writesZeroPieces() bool {
	return t.zero != nil && (t.mesh.ZeroReplicas == nil || t.mesh.ZeroReplicas.Rank() == 0)
}
