package ckpt

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/hpcrun/hpcrun/internal/units"
)

// Summary is what hpcrun ckpt info shows of a checkpoint beside its
// state: every tensor, the parameters and the bytes on disk.
type Summary struct {
	Tensors []TensorSummary
	Params  int64 // elements of the full tensors
	Bytes   int64 // the files of the step dir
}

// TensorSummary is one tensor of a Summary: its full shape, how the ranks split
// it, and its fp32 bytes.
type TensorSummary struct {
	Name  string `json:"name"`
	Shape []int  `json:"shape"`
	Shard string `json:"shard"` // "replicated", or "dim D over tp N" and its blocks
	Bytes int64  `json:"bytes"`
}

// Summary sums the checkpoint up.
func (c *Checkpoint) Summary() Summary {
	var in Summary
	for _, ti := range c.State.Tensors {
		n := int64(1)
		for _, d := range ti.Full {
			n *= int64(d)
		}
		in.Params += n
		sh := "replicated"
		if ti.Split {
			sh = fmt.Sprintf("dim %d over tp %d", ti.Dim, c.State.Mesh.TP)
			if ti.Blocks > 1 {
				sh += fmt.Sprintf(" (%d blocks)", ti.Blocks)
			}
		}
		in.Tensors = append(in.Tensors, TensorSummary{Name: ti.Name, Shape: ti.Full, Shard: sh, Bytes: 4 * n})
	}
	files, _ := filepath.Glob(filepath.Join(c.Dir, "*"))
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			in.Bytes += fi.Size()
		}
	}
	return in
}

// WriteInfo prints hpcrun ckpt info: the step, the model and mesh, the
// config, and a table of the tensors of in (c.Summary()).
func (c *Checkpoint) WriteInfo(w io.Writer, in Summary) error {
	st := c.State
	fmt.Fprintf(w, "checkpoint %s\n", c.Dir)
	fmt.Fprintf(w, "step %d (epoch %d, sample %d of it), saved %s\n", st.Step, st.Epoch, st.SamplerPos, st.Saved.Local().Format("2006-01-02 15:04:05"))
	fmt.Fprintf(w, "model %s, vocab %d, %.2fM parameters; mesh tp %d x dp %d (%s); %.1f MiB on disk\n",
		st.Model, st.Vocab, float64(in.Params)/1e6, st.Mesh.TP, st.Mesh.DP, units.Count(st.Mesh.World, "rank"), float64(in.Bytes)/(1<<20))
	var cfg bytes.Buffer
	json.Compact(&cfg, st.Config)
	fmt.Fprintf(w, "config %s\n\n", cfg.Bytes())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENSOR\tSHAPE\tSHARD\tBYTES")
	for _, t := range in.Tensors {
		fmt.Fprintf(tw, "%s\t%v\t%s\t%d\n", t.Name, t.Shape, t.Shard, t.Bytes)
	}
	return tw.Flush()
}
