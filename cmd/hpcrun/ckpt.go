package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/ckpt"
	"github.com/urfave/cli/v2"
)

func ckptCommand() *cli.Command {
	return &cli.Command{
		Name:  "ckpt",
		Usage: "inspect and merge checkpoints",
		Description: "A checkpoint is named by its step dir (runs/<execid>/ckpt/step-000200), a checkpoint\n" +
			"root or run dir (its latest checkpoint), or an execid in --runs-dir.",
		Subcommands: []*cli.Command{
			{
				Name:      "info",
				Usage:     "show a checkpoint's step, config, mesh and tensors",
				ArgsUsage: "DIR|EXECID|PREFIX|JOBID",
				Action:    ckptInfo,
			},
			{
				Name:      "merge",
				Usage:     "merge a checkpoint's shards into one safetensors file of full tensors",
				ArgsUsage: "DIR|EXECID|PREFIX|JOBID",
				Description: "GPT checkpoints come out with Hugging Face GPT-2 names and layouts (wte.weight,\n" +
					"h.N.attn.c_attn.weight as Conv1D (in, 3*out), ..., the vocabulary unpadded); BERT ones\n" +
					"keep hpcrun's names and (out, in) layout.",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "the merged `FILE` (required)"},
					&cli.BoolFlag{Name: "force", Usage: "replace FILE when it exists"},
				},
				Action: ckptMerge,
			},
			{
				Name:      "export",
				Usage:     "write a checkpoint as a Hugging Face GPT-2, Llama or BERT directory (config.json + model.safetensors)",
				ArgsUsage: "DIR|EXECID|PREFIX|JOBID --hf OUTDIR",
				Description: "OUTDIR holds config.json (GPT2LMHeadModel, n_positions from the position table, hpcrun_seq\n" +
					"the run's --seq, which eval takes as its default window) and\n" +
					"model.safetensors (F32, or --dtype bf16 or fp16; GPT2Model names, Conv1D (in, out) weights, the vocabulary unpadded);\n" +
					"a Llama becomes LlamaForCausalLM (q_proj, k_proj, v_proj and gate_proj, up_proj split back out,\n" +
					"its tokenizer.json copied beside it); a BERT of --arch hf becomes BertForSequenceClassification.\n" +
					"The run's tokenizer comes with it: GPT-2's BPE as tokenizer.json, vocab.json and merges.txt,\n" +
					"the byte tokenizer as a byte-level tokenizer.json of 256 ids (tokenizer_config.json beside).\n" +
					"transformers' from_pretrained and\n" +
					"hpcrun's --init-from read it.",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "hf", Usage: "the Hugging Face model `DIR` to write (required)"},
					&cli.BoolFlag{Name: "force", Usage: "write into DIR when it exists"},
					&cli.StringFlag{Name: "dtype", Value: "fp32", Usage: "the weights' `DTYPE` in model.safetensors: fp32, bf16 or fp16 (rounded to nearest even from the checkpoint's fp32)"},
				},
				Action: ckptExport,
			},
		},
	}
}

// openCkpt resolves args (one) to a step dir and reads it.
func openCkpt(c *cli.Context, args []string, usage string, withOptim bool) (*ckpt.Checkpoint, error) {
	if len(args) != 1 {
		return nil, cli.Exit("usage: hpcrun ckpt "+usage, 2)
	}
	path := args[0]
	if _, err := os.Stat(path); err != nil {
		// Not a path: a run, named the way every command names one.
		dir, err := runsDir(c)
		if err != nil {
			return nil, err
		}
		r, err := rundir.Find(dir, path)
		if err != nil {
			return nil, cli.Exit(err.Error(), 1)
		}
		path = r.Dir.Path()
	}
	dir, err := ckpt.Resolve(path)
	if err != nil {
		return nil, cli.Exit(err.Error(), 1)
	}
	ck, err := ckpt.Open(dir, withOptim)
	if err != nil {
		return nil, cli.Exit(err.Error(), 1)
	}
	return ck, nil
}

func ckptInfo(c *cli.Context) error {
	ck, err := openCkpt(c, c.Args().Slice(), "info DIR|EXECID", true)
	if err != nil {
		return err
	}
	st, in := ck.State, ck.Summary()
	if c.Bool("json") {
		out, err := json.MarshalIndent(map[string]any{
			"dir": ck.Dir, "step": st.Step, "epoch": st.Epoch, "sampler_pos": st.SamplerPos,
			"model": st.Model, "vocab": st.Vocab, "mesh": st.Mesh, "adam_step": ck.AdamStep,
			"saved": st.Saved, "config": st.Config, "params": in.Params, "bytes": in.Bytes, "tensors": in.Tensors,
		}, "", "  ")
		if err != nil {
			return err
		}
		fmt.Println(string(out))
		return nil
	}
	return ck.WriteInfo(os.Stdout, in)
}

func ckptMerge(c *cli.Context) error {
	args, out, force := c.Args().Slice(), c.String("output"), c.Bool("force")
	if out == "" {
		return cli.Exit("usage: hpcrun ckpt merge DIR|EXECID -o FILE", 2)
	}
	ck, err := openCkpt(c, args, "merge DIR|EXECID -o FILE", false)
	if err != nil {
		return err
	}
	if err := outsideCkpt(out, ck.Dir); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if _, err := os.Stat(out); err == nil && !force {
		return cli.Exit(fmt.Sprintf("%s exists: choose another -o or pass --force to replace it", out), 2)
	}
	if err := ck.WriteMerged(out); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	fi, _ := os.Stat(out)
	if wantJSON(c) {
		return json.NewEncoder(c.App.Writer).Encode(map[string]any{"step": ck.State.Step, "checkpoint": ck.Dir, "tp": ck.State.Mesh.TP, "output": out, "bytes": fi.Size()})
	}
	fmt.Fprintf(os.Stderr, "merged step %d of %s (tp %d) into %s (%.1f MiB)\n", ck.State.Step, ck.Dir, ck.State.Mesh.TP, out, float64(fi.Size())/(1<<20))
	return nil
}

// outsideCkpt refuses an output file inside the checkpoint dir dir (or dir
// itself): the merge would replace a shard or state.json of the checkpoint
// it reads. Both are compared with symlinks resolved and made absolute. Of
// out, only the directory is resolved: the merge renames its file over out,
// which replaces a symlink there rather than the file it points to.
func outsideCkpt(out, dir string) error {
	d, err := realPath(dir)
	if err != nil {
		return err
	}
	parent, base := filepath.Split(out)
	if parent == "" {
		parent = "."
	}
	o, err := realPath(parent)
	if err != nil {
		// No such directory: the write fails later, and nothing is replaced.
		return nil
	}
	if base != "" && base != "." && base != ".." {
		o = filepath.Join(o, base)
	} else {
		o = filepath.Clean(filepath.Join(o, base))
	}
	rel, err := filepath.Rel(d, o)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil
	}
	named := out
	if abs, err := filepath.Abs(out); err != nil || abs != o {
		named = fmt.Sprintf("%s (%s)", out, o)
	}
	return fmt.Errorf("-o %s is inside the checkpoint being merged, %s: merging would replace its files; write the merged file outside that dir", named, d)
}

// realPath is path absolute and cleaned, with its symlinks resolved.
func realPath(path string) (string, error) {
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	return filepath.Abs(p)
}

func ckptExport(c *cli.Context) error {
	args, out, force := c.Args().Slice(), c.String("hf"), c.Bool("force")
	if out == "" {
		return cli.Exit("usage: hpcrun ckpt export DIR|EXECID --hf OUTDIR", 2)
	}
	dtype, ok := map[string]string{"fp32": "F32", "bf16": "BF16", "fp16": "F16"}[c.String("dtype")]
	if !ok {
		return cli.Exit(fmt.Sprintf("--dtype %q: use fp32, bf16 or fp16", c.String("dtype")), 2)
	}
	if _, err := os.Stat(out); err == nil && !force {
		return cli.Exit(fmt.Sprintf("%s exists: choose another --hf or pass --force to write into it", out), 2)
	}
	ck, err := openCkpt(c, args, "export DIR|EXECID --hf OUTDIR", false)
	if err != nil {
		return err
	}
	if err := train.ExportHF(ck, out, dtype); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	if wantJSON(c) {
		return json.NewEncoder(c.App.Writer).Encode(map[string]any{"step": ck.State.Step, "checkpoint": ck.Dir, "tp": ck.State.Mesh.TP, "output": out})
	}
	fmt.Fprintf(os.Stderr, "exported step %d of %s (tp %d) to %s\n", ck.State.Step, ck.Dir, ck.State.Mesh.TP, out)
	return nil
}
