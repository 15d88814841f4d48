package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"

	"github.com/hpcrun/hpcrun/internal/units"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/train"
	"github.com/urfave/cli/v2"
)

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:      "eval",
		Usage:     "a GPT's or a Llama's loss and perplexity on a text or token file (a run, a checkpoint, a Hugging Face GPT-2 or Llama dir, an llm.c .bin)",
		ArgsUsage: "EXECID|CKPT|HF-DIR|LLMC.bin --data FILE",
		Description: "Every window of --seq + 1 tokens (stride --seq) of the data is scored; the model is split\n" +
			"over --nproc local ranks or the tasks of srun.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "data", Usage: "a text file or token files (a .bin or a glob of shards) (required)"},
			&cli.IntFlag{Name: "seq", Usage: "window length (0 = the run's, also for its export (ckpt export records it), else up to 1024 of a pretrained model's positions)"},
			&cli.IntFlag{Name: "bsz", Value: 8, Usage: "windows per forward pass"},
		}, ranksFlags()...),
		Action: func(c *cli.Context) error {
			src, err := modelSource(c)
			if err != nil {
				return err
			}
			if c.String("data") == "" {
				return cli.Exit("usage: hpcrun eval EXECID|CKPT|HF-DIR --data FILE", 2)
			}
			opt := train.EvalOptions{Source: src, Data: c.String("data"), Seq: c.Int("seq"), BatchSize: c.Int("bsz"), Device: c.String("device")}
			asJSON := wantJSON(c)
			return onRanks(c, "eval", src, func(world nccl.Comm) error {
				e, err := train.EvaluateSource(c.Context, world, opt)
				if err != nil || world.Rank() != 0 {
					return err
				}
				if asJSON { // the loss to full precision
					return json.NewEncoder(os.Stdout).Encode(map[string]any{"source": src, "data": opt.Data, "loss": e.Loss, "perplexity": math.Exp(e.Loss),
						"seq": e.Seq, "windows": e.Windows})
				}
				fmt.Printf("loss %.4f perplexity %.2f (%s of seq %d)\n", e.Loss, math.Exp(e.Loss), units.Count(e.Windows, "window"), e.Seq)
				return nil
			})
		},
	}
}
