package train

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"
)

// A pipeline's checkpoint is laid out as at pp 1 (one model and one
// optimizer file per TP rank, every tensor by name), so that it loads at
// any pp and tp and merges and exports as any other: each stage of DP
// rank 0 writes its tensors to a part file, then stage 0 of each TP rank
// joins the parts, in stage order, into that TP rank's files and removes
// them. Under ZeRO every DP rank (of the first group, under hybrid sharding) of each stage writes its moments'
// pieces (as ckpt.WriteOptimZero, in a directory per stage) and stage 0 of
// each (DP, TP) rank joins them into its optimizer file.

// partFile is the part of stage pp, TP rank tp, in the temporary dir.
func partFile(dir string, pp, tp int) string {
	return filepath.Join(dir, fmt.Sprintf("part-pp%d-tp%d.safetensors", pp, tp))
}

// zeroPartDir holds stage pp's ZeRO pieces in the temporary dir.
func zeroPartDir(dir string, pp int) string {
	return filepath.Join(dir, fmt.Sprintf("zero-part-pp%d", pp))
}

// stageParams are the parameters this stage saves: its own, without the
// last stage's copy of the tied embedding (the first stage saves it).
func (t *trainer) stageParams() []*parallel.Param {
	skip := t.pipe.uncounted()
	var out []*parallel.Param
	for _, q := range t.pipe.t.params {
		if q != skip {
			out = append(out, q)
		}
	}
	return out
}

// savePipeline writes this rank's part of the checkpoint and, on stage 0,
// joins the parts; every rank agrees on each phase. It returns, on rank
// 0, the tensor list of the whole model for state.json.
func (t *trainer) savePipeline(dir string, step int) ([]ckpt.TensorInfo, error) {
	what := fmt.Sprintf("checkpoint at step %d", step)
	var tensors []ckpt.Tensor
	var err error
	if t.mesh.DPRank() == 0 || t.model.ParamSet().ShardsValues() {
		tensors, err = paramsToHost(t.model.ParamSet(), t.stageParams(), t.mesh.DPRank() == 0)
	}
	if err == nil && t.mesh.DPRank() == 0 {
		err = t.writePart(dir, step, tensors)
	}
	if err == nil && t.writesZeroPieces() {
		err = t.writeZeroPart(dir, step)
	}
	if err = agree(t.world, err, what); err != nil {
		return nil, err
	}
	var infos []ckpt.TensorInfo
	if t.mesh.DPRank() == 0 && t.mesh.PPRank() == 0 {
		infos, err = t.joinParts(dir, step)
	}
	if err == nil && t.writesZeroPieces() && t.mesh.PPRank() == 0 {
		err = t.joinZeroParts(dir, step)
	}
	return infos, agree(t.world, err, what)
}

// removeZeroParts removes the stages' ZeRO pieces once joined (rank 0).
func (t *trainer) removeZeroParts(dir string) error {
	if t.zero == nil {
		return nil
	}
	for s := 0; s < t.mesh.PPSize(); s++ {
		if err := os.RemoveAll(zeroPartDir(dir, s)); err != nil {
			return err
		}
	}
	return nil
}

// writePart writes this stage's tensors (their values, on the host),
// AdamW moments (m.<name>, v.<name>; not under ZeRO) and their cut
// (metadata "tensors") for this TP rank.
func (t *trainer) writePart(dir string, step int, tensors []ckpt.Tensor) error {
	params := t.stageParams()
	all := t.model.Params()
	kinds := []string{"m", "v"}
	if t.zero != nil {
		kinds = nil
	}
	for _, kind := range kinds {
		for _, p := range params {
			i := indexOf(all, p)
			mt, vt := t.opt.Moments(i)
			x := mt
			if kind == "v" {
				x = vt
			}
			tensors = append(tensors, hostTensor(t.dev, kind+"."+p.Name, x))
		}
	}
	infos, err := json.Marshal(t.tensorInfosOf(params))
	if err != nil {
		return err
	}
	meta := map[string]string{"format": "hpcrun-part", "step": strconv.Itoa(step), "adam_step": strconv.Itoa(t.opt.Steps()), "tensors": string(infos)}
	return ckpt.WriteFile(partFile(dir, t.mesh.PPRank(), t.mesh.TPRank()), tensors, meta)
}

func indexOf(params []*parallel.Param, p *parallel.Param) int {
	for i, q := range params {
		if q == p {
			return i
		}
	}
	return -1
}

// joinParts writes this TP rank's model and optimizer files from every
// stage's part, in stage order (the order of the parameters at pp 1), and
// removes the parts. It returns the tensors' cut.
func (t *trainer) joinParts(dir string, step int) ([]ckpt.TensorInfo, error) {
	tp := t.mesh.TPRank()
	var infos []ckpt.TensorInfo
	var model, m, v []ckpt.Tensor
	adamStep := -1
	for s := 0; s < t.mesh.PPSize(); s++ {
		path := partFile(dir, s, tp)
		f, err := ckpt.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("checkpoint part of stage %d: %w", s, err)
		}
		var part []ckpt.TensorInfo
		if err := json.Unmarshal([]byte(f.Metadata["tensors"]), &part); err != nil {
			return nil, fmt.Errorf("checkpoint %s: tensors: %v", path, err)
		}
		as, err := strconv.Atoi(f.Metadata["adam_step"])
		if err != nil || (adamStep >= 0 && as != adamStep) {
			return nil, fmt.Errorf("checkpoint %s: adam_step %q, stage 0 has %d", path, f.Metadata["adam_step"], adamStep)
		}
		adamStep = as
		kinds := []struct {
			out    *[]ckpt.Tensor
			prefix string
		}{{&model, ""}, {&m, "m."}, {&v, "v."}}
		if t.zero != nil {
			kinds = kinds[:1]
		}
		for _, ti := range part {
			for _, dst := range kinds {
				x, err := f.Tensor(dst.prefix + ti.Name)
				if err != nil {
					return nil, fmt.Errorf("checkpoint %s: %w", path, err)
				}
				x.Name = ti.Name
				*dst.out = append(*dst.out, x)
			}
		}
		infos = append(infos, part...)
	}
	if err := ckpt.WriteModel(dir, tp, t.cfg.TP, step, model); err != nil {
		return nil, err
	}
	if t.zero == nil {
		if err := ckpt.WriteOptim(dir, tp, 0, step, adamStep, m, v); err != nil {
			return nil, err
		}
	}
	for s := 0; s < t.mesh.PPSize(); s++ {
		if err := os.Remove(partFile(dir, s, tp)); err != nil {
			return nil, err
		}
	}
	return infos, nil
}

// writeZeroPart writes this rank's ZeRO pieces of its stage's
// parameters (without the uncounted copy of the tied embedding).
func (t *trainer) writeZeroPart(dir string, step int) error {
	skip := t.pipe.uncounted()
	var pieces []ckpt.ZeroPiece
	for _, pc := range t.zero.Pieces() {
		if skip == nil || pc.Name != skip.Name {
			pieces = append(pieces, pc)
		}
	}
	sub := zeroPartDir(dir, t.mesh.PPRank())
	if err := os.MkdirAll(sub, 0o755); err != nil {
		return err
	}
	return ckpt.WriteOptimZero(sub, t.mesh.TPRank(), t.mesh.DPRank(), step, t.opt.Steps(), pieces)
}

// joinZeroParts writes this (DP, TP) rank's ZeRO optimizer file from
// every stage's pieces.
func (t *trainer) joinZeroParts(dir string, step int) error {
	tp, dp := t.mesh.TPRank(), t.mesh.DPRank()
	var pieces []ckpt.ZeroPiece
	for s := 0; s < t.mesh.PPSize(); s++ {
		path := filepath.Join(zeroPartDir(dir, s), ckpt.OptimFile(tp, dp))
		f, err := ckpt.ReadFile(path)
		if err != nil {
			return fmt.Errorf("checkpoint part of stage %d: %w", s, err)
		}
		var offsets map[string]int
		if err := json.Unmarshal([]byte(f.Metadata["offsets"]), &offsets); err != nil {
			return fmt.Errorf("checkpoint %s: offsets: %v", path, err)
		}
		for _, e := range f.Tensors {
			name, ok := strings.CutPrefix(e.Name, "m.")
			if !ok {
				continue
			}
			m, err := f.Tensor("m." + name)
			if err != nil {
				return fmt.Errorf("checkpoint %s: %w", path, err)
			}
			v, err := f.Tensor("v." + name)
			if err != nil {
				return fmt.Errorf("checkpoint %s: %w", path, err)
			}
			pieces = append(pieces, ckpt.ZeroPiece{Name: name, Offset: offsets[name], M: m.Data, V: v.Data})
		}
	}
	return ckpt.WriteOptimZero(dir, tp, dp, step, t.opt.Steps(), pieces)
}
