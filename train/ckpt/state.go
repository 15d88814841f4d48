package ckpt

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/hpcrun/hpcrun/train/config"
)

// rngKind is the only sample order this package's runs save.
const rngKind = "pcg(seed, epoch)"

// ParseState decodes state.json's bytes and checks them (State.Check).
func ParseState(b []byte) (State, error) {
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return State{}, fmt.Errorf("%v: the file is corrupt; resume from another step dir", err)
	}
	if err := st.Check(); err != nil {
		return State{}, err
	}
	return st, nil
}

// corrupt is Check's error for a field that no save writes.
func corrupt(format string, args ...any) error {
	return fmt.Errorf(format+": the state is corrupt; resume from another step dir", args...)
}

// Check refuses a state that no save writes: a field out of its range, a
// mesh whose sizes do not multiply to its world, a tensor whose shape or
// split cannot be. The message names the field as state.json spells it
// (mesh.dp, tensors[3].full). What it cannot know, the run it is resumed
// into (its data, its model), the trainer checks.
func (st *State) Check() error {
	if st.Format != Format {
		return fmt.Errorf("format %d, this hpcrun reads format %d", st.Format, Format)
	}
	if st.Step < 0 {
		return corrupt("step %d: must be 0 or more", st.Step)
	}
	// An epoch has at least one step, and a step starts at most one epoch.
	if st.Epoch < 0 || st.Epoch > st.Step {
		return corrupt("epoch %d at step %d: must be 0 to the step (an epoch is at least one step)", st.Epoch, st.Step)
	}
	if st.SamplerPos < 0 {
		return corrupt("sampler_pos %d: must be 0 or more", st.SamplerPos)
	}
	// Checkpoints written by hand in tests leave rng out.
	if st.RNG.Kind != "" && st.RNG.Kind != rngKind {
		return corrupt("rng.kind %q: this hpcrun orders samples by %q only", st.RNG.Kind, rngKind)
	}
	if st.Model == "" {
		return corrupt("model is empty: want the saved model's name (gpt, bert, llama)")
	}
	if st.Vocab < 1 || st.Vocab > config.MaxVocab {
		return corrupt("vocab %d: must be 1 to %d", st.Vocab, config.MaxVocab)
	}
	if c := bytes.TrimSpace(st.Config); len(c) == 0 || c[0] != '{' {
		return corrupt("config: %.40q is not the saved run's config (a JSON object)", c)
	}
	if err := st.Mesh.check(); err != nil {
		return err
	}
	if st.Zero < 0 || st.Zero > 3 {
		return corrupt("zero %d: must be 0, 1, 2 or 3", st.Zero)
	}
	if g := st.ZeroGroup; g < 0 || g > 0 && (st.Zero == 0 || st.Mesh.DP%g != 0) {
		return corrupt("zero_group %d: must divide dp %d, with zero 1, 2 or 3", g, st.Mesh.DP)
	}
	if len(st.Tensors) == 0 {
		return corrupt("tensors is empty: a checkpoint lists the tensors it holds")
	}
	seen := make(map[string]bool, len(st.Tensors))
	for i, ti := range st.Tensors {
		if ti.Name == "" || seen[ti.Name] {
			return corrupt("tensors[%d].name %q: empty or listed twice", i, ti.Name)
		}
		seen[ti.Name] = true
		if err := ti.check(st.Mesh.TP); err != nil {
			return corrupt("tensors[%d].%v (tensor %s)", i, err, ti.Name)
		}
	}
	return nil
}

func (m Mesh) check() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"mesh.tp", m.TP}, {"mesh.dp", m.DP}, {"mesh.world", m.World}} {
		if f.v < 1 {
			return corrupt("%s %d: must be 1 or more", f.name, f.v)
		}
	}
	if m.PP < 0 {
		return corrupt("mesh.pp %d: must be 0 or more", m.PP)
	}
	// Each factor divides the world in turn, which cannot overflow as a
	// product of sizes would.
	rest := m.World
	for _, f := range []int{m.TP, m.DP, max(m.PP, 1)} {
		if rest%f != 0 {
			return corrupt("mesh.world %d is not mesh.tp %d x mesh.dp %d x mesh.pp %d", m.World, m.TP, m.DP, max(m.PP, 1))
		}
		rest /= f
	}
	if rest != 1 {
		return corrupt("mesh.world %d is not mesh.tp %d x mesh.dp %d x mesh.pp %d", m.World, m.TP, m.DP, max(m.PP, 1))
	}
	return nil
}

// check is the tensor's entry against the saved tp; its error begins with
// the field's name, after the caller's "tensors[i].".
func (ti TensorInfo) check(tp int) error {
	if len(ti.Full) == 0 {
		return fmt.Errorf("full is empty: want the tensor's shape")
	}
	n := int64(1)
	for _, d := range ti.Full {
		if d < 1 || int64(d) > config.MaxParams/n {
			return fmt.Errorf("full %v: every dimension must be 1 or more, %d elements at most", ti.Full, int64(config.MaxParams))
		}
		n *= int64(d)
	}
	if ti.Rows < 0 || ti.Rows > ti.Full[0] {
		return fmt.Errorf("rows %d: must be 0 to full[0] = %d", ti.Rows, ti.Full[0])
	}
	if !ti.Split {
		return nil
	}
	if ti.Dim < 0 || ti.Dim >= len(ti.Full) {
		return fmt.Errorf("dim %d: out of range for full %v", ti.Dim, ti.Full)
	}
	if ti.Blocks < 0 || ti.Replicas < 0 || ti.Shared < 0 {
		return fmt.Errorf("blocks %d, replicas %d, shared %d: must be 0 or more", ti.Blocks, ti.Replicas, ti.Shared)
	}
	if tp == 1 {
		return nil
	}
	// The rules of parallel.Shard's split, so that a load errs here and
	// not deep in a reshard.
	d := ti.Full[ti.Dim]
	if ti.Replicas > 1 {
		if ti.Blocks > 1 || tp%ti.Replicas != 0 || d%(tp/ti.Replicas) != 0 {
			return fmt.Errorf("replicas %d: full[%d] = %d does not split into groups of %d of tp %d", ti.Replicas, ti.Dim, d, ti.Replicas, tp)
		}
		group := d / (tp / ti.Replicas)
		if ti.Shared > group || (group-ti.Shared)%ti.Replicas != 0 {
			return fmt.Errorf("shared %d: groups of %d indices with %d shared do not split over %d replicas", ti.Shared, group, ti.Shared, ti.Replicas)
		}
		return nil
	}
	if blocks := max(ti.Blocks, 1); d%blocks != 0 || d/blocks%tp != 0 {
		return fmt.Errorf("full[%d] = %d is not a multiple of %d blocks x tp %d", ti.Dim, d, blocks, tp)
	}
	return nil
}
