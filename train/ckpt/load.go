package ckpt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hpcrun/hpcrun/parallel"
)

// WriteModel writes TP rank tp's model shard into dir.
func WriteModel(dir string, tp, tpSize, step int, tensors []Tensor) error {
	meta := map[string]string{"format": "hpcrun-model", "step": strconv.Itoa(step), "tp": strconv.Itoa(tp), "tp_size": strconv.Itoa(tpSize)}
	return WriteFile(filepath.Join(dir, ModelFile(tp, tpSize)), tensors, meta)
}

// WriteOptim writes TP rank tp's AdamW state into dir: the first moments
// as "m.<name>", the second as "v.<name>", and the optimizer's step count
// in the metadata.
func WriteOptim(dir string, tp, dp, step, adamStep int, m, v []Tensor) error {
	all := make([]Tensor, 0, len(m)+len(v))
	for _, t := range m {
		all = append(all, Tensor{Name: "m." + t.Name, Shape: t.Shape, Data: t.Data})
	}
	for _, t := range v {
		all = append(all, Tensor{Name: "v." + t.Name, Shape: t.Shape, Data: t.Data})
	}
	meta := map[string]string{"format": "hpcrun-optim", "step": strconv.Itoa(step), "adam_step": strconv.Itoa(adamStep)}
	return WriteFile(filepath.Join(dir, OptimFile(tp, dp)), all, meta)
}

// Checkpoint is a step dir read and checked whole: every shard the state
// names is present, holds exactly the state's tensors with their shard
// shapes, and agrees on the step.
type Checkpoint struct {
	Dir      string
	State    State
	model    []*File // per saved TP rank
	optim    []*File // per saved TP rank; nil entries when withOptim is false
	AdamStep int
}

// Open reads the checkpoint in dir (a step dir). withOptim also reads and
// checks the optimizer files. Every error names the file and the problem.
func Open(dir string, withOptim bool) (*Checkpoint, error) {
	c := &Checkpoint{Dir: dir}
	sp := filepath.Join(dir, StateFile)
	b, err := os.ReadFile(sp)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("checkpoint %s: no %s: not a complete checkpoint", dir, StateFile)
		}
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if c.State, err = ParseState(b); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %v", sp, err)
	}
	st := &c.State
	tp := st.Mesh.TP
	for r := 0; r < tp; r++ {
		path := filepath.Join(dir, ModelFile(r, tp))
		f, err := readChecked(path, st, r, "")
		if err != nil {
			return nil, err
		}
		c.model = append(c.model, f)
	}
	c.optim = make([]*File, tp)
	if withOptim && st.Zero > 0 {
		for r := 0; r < tp; r++ {
			f, as, err := openZeroOptim(dir, st, r)
			if err != nil {
				return nil, err
			}
			if r > 0 && as != c.AdamStep {
				return nil, fmt.Errorf("checkpoint %s: adam_step %d at tp rank %d, %d at tp rank 0", dir, as, r, c.AdamStep)
			}
			c.AdamStep, c.optim[r] = as, f
		}
	} else if withOptim {
		for r := 0; r < tp; r++ {
			path := filepath.Join(dir, OptimFile(r, 0))
			f, err := readChecked(path, st, r, "m.", "v.")
			if err != nil {
				return nil, err
			}
			as, err := parseInt(f.Metadata, "adam_step")
			if err != nil {
				return nil, fmt.Errorf("checkpoint %s: %v", path, err)
			}
			if r > 0 && as != c.AdamStep {
				return nil, fmt.Errorf("checkpoint %s: adam_step %d, but %s has %d", path, as, OptimFile(0, 0), c.AdamStep)
			}
			c.AdamStep = as
			c.optim[r] = f
		}
	}
	return c, nil
}

// readChecked reads one shard file and checks it holds exactly the state's
// tensors (under each prefix) with rank r's shard shapes and the state's
// step.
func readChecked(path string, st *State, r int, prefixes ...string) (*File, error) {
	f, err := ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("checkpoint %s: missing: the checkpoint saved at tp %d needs every shard", path, st.Mesh.TP)
		}
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if step, err := parseInt(f.Metadata, "step"); err != nil || step != st.Step {
		return nil, fmt.Errorf("checkpoint %s: step %q in its metadata, but %s says %d: shards from different saves", path, f.Metadata["step"], StateFile, st.Step)
	}
	want := 0
	for _, pre := range prefixes {
		for _, ti := range st.Tensors {
			want++
			e, ok := f.Find(pre + ti.Name)
			if !ok {
				return nil, fmt.Errorf("checkpoint %s: no tensor %s", path, pre+ti.Name)
			}
			local := ti.Shard(r, st.Mesh.TP).LocalShape(ti.Full)
			if !equalShape(e.Shape, local) {
				return nil, fmt.Errorf("checkpoint %s: tensor %s is %v, want %v (shard %d of %v)", path, e.Name, e.Shape, local, r, ti.Full)
			}
		}
	}
	if len(f.Tensors) != want {
		return nil, fmt.Errorf("checkpoint %s: %d tensors, %s lists %d", path, len(f.Tensors), StateFile, want)
	}
	return f, nil
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Info returns the state's entry for name.
func (c *Checkpoint) Info(name string) (TensorInfo, bool) {
	for _, ti := range c.State.Tensors {
		if ti.Name == name {
			return ti, true
		}
	}
	return TensorInfo{}, false
}

// Full merges the shards of tensor name (kind "" for the model, "m" or "v"
// for the AdamW moments) into the full tensor at the saved tp.
func (c *Checkpoint) Full(kind, name string) ([]float32, error) {
	ti, ok := c.Info(name)
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: no tensor %s", c.Dir, name)
	}
	files, key := c.model, name
	if kind != "" {
		files, key = c.optim, kind+"."+name
		if files[0] == nil {
			return nil, fmt.Errorf("checkpoint %s: optimizer state not read", c.Dir)
		}
	}
	tp := c.State.Mesh.TP
	full := make([]float32, numel(ti.Full))
	for r := 0; r < tp; r++ {
		t, err := files[r].Tensor(key)
		if err != nil {
			return nil, err
		}
		if err := ti.Shard(r, tp).Put(full, ti.Full, t.Data); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %s: %w", files[r].Path, key, err)
		}
	}
	return full, nil
}

// Load returns tensor name (kind as for Full) cut for a run whose own
// parameter has full shape full and shard sh: the checkpoint's full tensor
// resharded, with vocabulary padding rows dropped or added when the run's
// tp pads the vocabulary differently. A shape that differs otherwise is
// refused, naming the tensor and both shapes.
func (c *Checkpoint) Load(kind, name string, full []int, sh parallel.Shard) ([]float32, error) {
	ti, ok := c.Info(name)
	if !ok {
		return nil, fmt.Errorf("checkpoint %s: no tensor %s: saved from a different model (%s, %d tensors)", c.Dir, name, c.State.Model, len(c.State.Tensors))
	}
	vals, err := c.Full(kind, name)
	if err != nil {
		return nil, err
	}
	if !equalShape(ti.Full, full) {
		if ti.Rows == 0 || len(full) != len(ti.Full) || !equalShape(ti.Full[1:], full[1:]) || full[0] < ti.Rows {
			return nil, fmt.Errorf("checkpoint %s: tensor %s is %v but this run's model has %v: the model dims (layers, dim, heads, seq, vocab) must match the saved run's", c.Dir, name, ti.Full, full)
		}
		// Vocabulary padding: keep the real rows, zero the rest.
		row := numel(full[1:])
		padded := make([]float32, numel(full))
		copy(padded, vals[:ti.Rows*row])
		vals = padded
	}
	return sh.Take(vals, full)
}
