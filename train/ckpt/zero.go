package ckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// ZeroPiece is one data-parallel rank's range of one parameter's AdamW
// moments under ZeRO-1: len(M) elements from Offset of the parameter's
// (tensor-parallel local, flattened) tensor.
type ZeroPiece struct {
	Name   string
	Offset int
	M, V   []float32
}

// WriteOptimZero writes DP rank dp's ZeRO-1 moments of TP rank tp into dir
// (OptimFile(tp, dp)): "m.<name>" and "v.<name>" as 1-D tensors of the
// pieces, their offsets in the metadata ("offsets", a JSON object), and
// the optimizer's step count. State.Zero says that a checkpoint's
// optimizer state is written this way, one file per TP and DP rank.
func WriteOptimZero(dir string, tp, dp, step, adamStep int, pieces []ZeroPiece) error {
	all := make([]Tensor, 0, 2*len(pieces))
	offsets := make(map[string]int, len(pieces))
	for _, p := range pieces {
		if len(p.M) != len(p.V) {
			return fmt.Errorf("zero-1 piece %s: m has %d elements, v %d", p.Name, len(p.M), len(p.V))
		}
		all = append(all, Tensor{Name: "m." + p.Name, Shape: []int{len(p.M)}, Data: p.M})
		offsets[p.Name] = p.Offset
	}
	for _, p := range pieces {
		all = append(all, Tensor{Name: "v." + p.Name, Shape: []int{len(p.V)}, Data: p.V})
	}
	off, err := json.Marshal(offsets)
	if err != nil {
		return err
	}
	meta := map[string]string{"format": "hpcrun-optim-zero1", "step": strconv.Itoa(step), "adam_step": strconv.Itoa(adamStep), "dp": strconv.Itoa(dp), "offsets": string(off)}
	return WriteFile(filepath.Join(dir, OptimFile(tp, dp)), all, meta)
}

// openZeroOptim reads the ZeRO-1 optimizer files of TP rank r (one per
// saved DP rank) and assembles every parameter's whole (TP-local) moments,
// as the file a replicated optimizer would have written. Every element
// must come from exactly one DP rank.
func openZeroOptim(dir string, st *State, r int) (*File, int, error) {
	out := &File{Header: Header{Path: filepath.Join(dir, fmt.Sprintf("optim-tp%d-dp*.safetensors", r))}, data: map[string][]float32{}}
	covered := map[string][]int8{}
	for _, ti := range st.Tensors {
		local := ti.Shard(r, st.Mesh.TP).LocalShape(ti.Full)
		n := numel(local)
		for _, kind := range []string{"m.", "v."} {
			out.Tensors = append(out.Tensors, HeaderEntry{Name: kind + ti.Name, DType: "F32", Shape: local})
			out.data[kind+ti.Name] = make([]float32, n)
		}
		covered[ti.Name] = make([]int8, n)
	}
	adamStep := -1
	files := st.Mesh.DP
	if st.ZeroGroup > 0 {
		files = st.ZeroGroup
	}
	for d := 0; d < files; d++ {
		path := filepath.Join(dir, OptimFile(r, d))
		f, err := ReadFile(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, 0, fmt.Errorf("checkpoint %s: missing: a ZeRO checkpoint cut over %d data-parallel ranks needs the optimizer file of each", path, files)
			}
			return nil, 0, fmt.Errorf("checkpoint: %w", err)
		}
		if step, err := parseInt(f.Metadata, "step"); err != nil || step != st.Step {
			return nil, 0, fmt.Errorf("checkpoint %s: step %q in its metadata, but %s says %d: shards from different saves", path, f.Metadata["step"], StateFile, st.Step)
		}
		as, err := parseInt(f.Metadata, "adam_step")
		if err != nil {
			return nil, 0, fmt.Errorf("checkpoint %s: %v", path, err)
		}
		if adamStep >= 0 && as != adamStep {
			return nil, 0, fmt.Errorf("checkpoint %s: adam_step %d, but another data-parallel rank's file has %d", path, as, adamStep)
		}
		adamStep = as
		var offsets map[string]int
		if err := json.Unmarshal([]byte(f.Metadata["offsets"]), &offsets); err != nil {
			return nil, 0, fmt.Errorf("checkpoint %s: offsets: %v", path, err)
		}
		if len(f.Tensors) != 2*len(offsets) {
			return nil, 0, fmt.Errorf("checkpoint %s: %d tensors for %d pieces", path, len(f.Tensors), len(offsets))
		}
		for name, off := range offsets {
			cov, ok := covered[name]
			if !ok {
				return nil, 0, fmt.Errorf("checkpoint %s: piece of %s, which %s does not list", path, name, StateFile)
			}
			for _, kind := range []string{"m.", "v."} {
				t, err := f.Tensor(kind + name)
				if err != nil {
					return nil, 0, fmt.Errorf("checkpoint: %w", err)
				}
				if off < 0 || off+len(t.Data) > len(cov) {
					return nil, 0, fmt.Errorf("checkpoint %s: %s%s covers [%d,%d) of %d elements", path, kind, name, off, off+len(t.Data), len(cov))
				}
				copy(out.data[kind+name][off:], t.Data)
				if kind == "m." {
					for i := off; i < off+len(t.Data); i++ {
						cov[i]++
					}
				}
			}
		}
	}
	for _, ti := range st.Tensors {
		for i, c := range covered[ti.Name] {
			if c != 1 {
				return nil, 0, fmt.Errorf("checkpoint %s: element %d of the moments of %s is in %d data-parallel files, want 1", dir, i, ti.Name, c)
			}
		}
	}
	return out, adamStep, nil
}
