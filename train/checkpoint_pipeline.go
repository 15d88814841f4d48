package train

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hpcrun/hpcrun/parallel"
	"github.com/hpcrun/hpcrun/train/ckpt"
)

// A pipeline's checkpoint is laid out as at pp 1 (one model and one
// optimizer file per TP rank, every tensor by name), so that it loads at
// any pp and tp and merges and exports as any other: each stage of DP
// rank 0 writes its tensors to a part file, then stage 0 of each TP rank
// joins the parts, in stage order, into that TP rank's files and removes
// them.

// partFile is the part of stage pp, TP rank tp, in the temporary dir.
func partFile(dir string, pp, tp int) string {
	return filepath.Join(dir, fmt.Sprintf("part-pp%d-tp%d.safetensors", pp, tp))
}

// stageParams are the parameters this stage saves: its own, without the
// last stage's copy of the tied embedding (the first stage saves it).
func (t *trainer) stageParams() []*parallel.Param { return t.pipe.normParams() }

// savePipeline writes this rank's part of the checkpoint and, on stage 0,
// joins the parts; every rank agrees on each phase. It returns, on rank
// 0, the tensor list of the whole model for state.json.
func (t *trainer) savePipeline(dir string, step int) ([]ckpt.TensorInfo, error) {
	what := fmt.Sprintf("checkpoint at step %d", step)
	var err error
	if t.mesh.DPRank() == 0 {
		err = t.writePart(dir, step)
	}
	if err = agree(t.world, err, what); err != nil {
		return nil, err
	}
	var infos []ckpt.TensorInfo
	if t.mesh.DPRank() == 0 && t.mesh.PPRank() == 0 {
		infos, err = t.joinParts(dir, step)
	}
	return infos, agree(t.world, err, what)
}

// writePart writes this stage's tensors, AdamW moments (m.<name>,
// v.<name>) and their cut (metadata "tensors") for this TP rank.
func (t *trainer) writePart(dir string, step int) error {
	params := t.stageParams()
	all := t.model.Params()
	var tensors []ckpt.Tensor
	for _, p := range params {
		tensors = append(tensors, hostTensor(t.dev, p.Name, p.Data))
	}
	for _, kind := range []string{"m", "v"} {
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
		for _, ti := range part {
			for _, dst := range []struct {
				out    *[]ckpt.Tensor
				prefix string
			}{{&model, ""}, {&m, "m."}, {&v, "v."}} {
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
	if err := ckpt.WriteOptim(dir, tp, 0, step, adamStep, m, v); err != nil {
		return nil, err
	}
	for s := 0; s < t.mesh.PPSize(); s++ {
		if err := os.Remove(partFile(dir, s, tp)); err != nil {
			return nil, err
		}
	}
	return infos, nil
}
