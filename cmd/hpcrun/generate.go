package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train"
	"github.com/hpcrun/hpcrun/train/plan"
	"github.com/urfave/cli/v2"
)

func generateCommand() *cli.Command {
	return &cli.Command{
		Name:      "generate",
		Usage:     "sample text from a GPT or a Llama: a run, a checkpoint, a Hugging Face GPT-2 or Llama (LlamaForCausalLM) dir or an llm.c .bin",
		ArgsUsage: "EXECID|CKPT|HF-DIR|LLMC.bin",
		Description: "Tokens stream to stdout as they are sampled. The model is split over --nproc local ranks\n" +
			"(tensor parallel), or over the tasks of `srun hpcrun generate ...`; every rank draws the same\n" +
			"tokens from the same seed. Temperature 0 is greedy. Each layer caches its keys and values: the\n" +
			"prompt is forwarded once, then each new token alone (until the sequence outgrows the model's\n" +
			"positions, when every step forwards the last window of them).",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "prompt", Usage: "the text to continue"},
			&cli.IntFlag{Name: "tokens", Value: 64, Usage: "tokens to sample"},
			&cli.Float64Flag{Name: "temperature", Value: 1, Usage: "softmax temperature (0 = greedy)"},
			&cli.IntFlag{Name: "top-k", Value: 50, Usage: "sample among the k most likely tokens (0 = all)"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "sampler seed"},
		}, ranksFlags()...),
		Action: func(c *cli.Context) error {
			src, err := modelSource(c)
			if err != nil {
				return err
			}
			opt := train.GenerateOptions{Source: src, Prompt: c.String("prompt"), Tokens: c.Int("tokens"),
				Temperature: c.Float64("temperature"), TopK: c.Int("top-k"), Seed: c.Uint64("seed"), Device: c.String("device")}
			asJSON := wantJSON(c)
			return onRanks(c, "generate", src, func(world nccl.Comm) error {
				var sampled strings.Builder
				text := &afterPrompt{w: os.Stdout, prompt: opt.Prompt}
				if world.Rank() == 0 {
					opt.Out = text
					if asJSON {
						opt.Out = &sampled
					}
				}
				ids, err := train.Generate(c.Context, world, opt)
				if world.Rank() != 0 {
					return err
				}
				if !asJSON && (err == nil || text.started) {
					// The prompt goes out with the first text, so that a
					// model that cannot generate fails on a line of its own.
					text.Write(nil)
					fmt.Println()
				}
				if err != nil || !asJSON {
					return err
				}
				// The sampled tokens, their text, and the prompt's.
				return json.NewEncoder(os.Stdout).Encode(map[string]any{
					"prompt": opt.Prompt, "completion": sampled.String(), "text": opt.Prompt + sampled.String(), "token_ids": ids})
			})
		},
	}
}

// ranksFlags are the flags of a command that runs a model over ranks.
func ranksFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "nproc", Value: 1, Usage: "local ranks the model is split over (tensor parallel); under srun, the job's tasks"},
		&cli.StringFlag{Name: "device", Usage: "auto, cpu or cuda (default: the run's, auto for pretrained weights)"},
		&cli.DurationFlag{Name: "timeout", Value: 5 * time.Minute, Usage: "how long a rank waits for its peers"},
	}
}

// modelSource turns the command's argument into a path: an existing path
// as it is, else a run named by execid, prefix or job id.
func modelSource(c *cli.Context) (string, error) {
	if c.NArg() != 1 {
		return "", cli.Exit(fmt.Sprintf("usage: hpcrun %s EXECID|CKPT|HF-DIR|LLMC.bin", c.Command.Name), 2)
	}
	src := c.Args().First()
	if _, err := os.Stat(src); err == nil {
		return filepath.Clean(src), nil
	}
	dir, err := runsDir(c)
	if err != nil {
		return "", err
	}
	r, err := rundir.Find(dir, src)
	if err != nil {
		return "", cli.Exit(err.Error(), 1)
	}
	return r.Dir.Path(), nil
}

// onRanks runs fn on every rank of the world: one in-process rank for
// --nproc 1, --nproc local processes of this same command, or this task of
// an srun job.
func onRanks(c *cli.Context, what, src string, fn func(world nccl.Comm) error) error {
	env, err := idrenv.Detect()
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	c.Context = ctx
	nproc := c.Int("nproc")
	if env.Source == idrenv.Single && !slurm.Launched() {
		if nproc < 1 {
			return cli.Exit(fmt.Sprintf("--nproc %d: must be at least 1", nproc), 2)
		}
		if err := refuseModelUnfitHere(src, c.String("device")); err != nil {
			return err
		}
		if nproc == 1 {
			if err := nccl.RunInProcess(1, fn); err != nil {
				return cli.Exit(err.Error(), 1)
			}
			return nil
		}
		return launchRanks(c, nproc, src)
	}
	token, err := slurm.RankToken(env, "")
	if err != nil {
		return err
	}
	world, err := joinWorld(ctx, env, nccl.Options{Token: token, Timeout: c.Duration("timeout")})
	if err != nil {
		return cli.Exit(fmt.Sprintf("%s rank %d: %v", what, env.Rank, err), 1)
	}
	defer world.Close()
	if err := fn(world); err != nil {
		return cli.Exit(fmt.Sprintf("%s rank %d: %v", what, env.Rank, err), 1)
	}
	return nil
}

// refuseModelUnfitHere refuses, before any rank loads it, a model whose
// weights alone (fp32) do not fit this machine's memory, which the ranks
// started here share; its shape comes from the checkpoint's state.json or
// the pretrained model's config.json, not from its weights files. A run
// on a GPU is not refused: the plan cannot name it here.
func refuseModelUnfitHere(src, device string) error {
	mem := plan.MemTotal()
	if device == "cuda" {
		mem = 0
	}
	if err := train.CheckWeightsFit(src, mem); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	return nil
}

// launchRanks starts n ranks of this command on this machine, with the
// flags the user set and src (resolved: the ranks look nothing up), the
// variables torchrun would set and a fresh token, and waits.
func launchRanks(c *cli.Context, n int, src string) error {
	args := []string{c.Command.Name}
	for _, name := range c.LocalFlagNames() {
		args = append(args, "--"+name+"="+fmt.Sprint(c.Value(name)))
	}
	args = append(args, "--", src)
	return launchSelf(c.Context, c.Command.Name, n, args, c.Duration("timeout"))
}

// afterPrompt writes the prompt before the first text written to it.
type afterPrompt struct {
	w       io.Writer
	prompt  string
	started bool
}

func (p *afterPrompt) Write(b []byte) (int, error) {
	if !p.started {
		p.started = true
		if _, err := io.WriteString(p.w, p.prompt); err != nil {
			return 0, err
		}
	}
	return p.w.Write(b)
}
