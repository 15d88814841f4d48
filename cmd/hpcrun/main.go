// Command hpcrun submits tensor-, data- and pipeline-parallel transformer
// training to a Slurm cluster (or runs it locally), runs the training
// inside the job, and reads the metrics of finished and running jobs back.
//
// Every command lives in its own file of this package; this file wires the
// global flags and the command list, and hands the Local executor's srun
// (hpcrun local-srun, whose arguments are srun's) to slurm.LocalSrun.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/cmdline"
	"github.com/hpcrun/hpcrun/slurm"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/urfave/cli/v2"
)

// version is set at link time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// The Local executor's srun: its arguments are srun's, not hpcrun's.
	if len(os.Args) > 1 && os.Args[1] == slurm.SrunCommand {
		os.Exit(slurm.LocalSrun(os.Args[2:]))
	}
	app := newApp()
	if err := app.Run(cmdline.Interspersed(app, os.Args)); err != nil {
		code := 1
		var exit cli.ExitCoder
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		}
		if msg := err.Error(); msg != "" {
			if cmdline.JSONAsked(os.Args[1:]) {
				// --json: the error as JSON too, on stderr.
				b, _ := json.Marshal(map[string]any{"error": msg, "exit_code": code})
				fmt.Fprintln(os.Stderr, string(b))
			} else {
				fmt.Fprintln(os.Stderr, "hpcrun:", msg)
			}
		}
		os.Exit(code)
	}
}

// newApp builds the command tree; tests run it in-process.
func newApp() *cli.App {
	app := &cli.App{
		Name:                 "hpcrun",
		Usage:                "tensor-, data- and pipeline-parallel transformer training on Slurm, in one command",
		Version:              version,
		EnableBashCompletion: true,
		Suggest:              true,
		HideHelpCommand:      false,
		// Errors are printed once, by main, as one line.
		ExitErrHandler: func(*cli.Context, error) {},
		Flags:          globalFlags(),
		Commands: []*cli.Command{
			submitCommand(),
			planCommand(),
			sweepCommand(),
			queueCommand(),
			cancelCommand(),
			rmCommand(),
			logsCommand(),
			metricsCommand(),
			watchCommand(),
			serveCommand(),
			trainCommand(),
			runCommand(),
			checkCommand(),
			benchCommand(),
			ckptCommand(),
			dataCommand(),
			generateCommand(),
			evalCommand(),
			envCommand(),
			configCommand(),
			completionCommand(),
		},
	}
	cmdline.OneDefault()
	cmdline.InheritFlags(app.Commands, globalFlags)
	cmdline.Strict(app, presetHint, flagMeanings)
	cmdline.CompleteRuns(app.Commands, listRuns)
	return app
}

// presetHint is what a stray argument to a command meant when it names a
// preset and the command has --preset.
func presetHint(cmd *cli.Command, arg string) string {
	if _, err := trainconfig.LookupPreset(arg); err == nil && cmdline.HasFlag(cmd, "preset") {
		return "did you mean --preset " + arg + "?"
	}
	return ""
}
