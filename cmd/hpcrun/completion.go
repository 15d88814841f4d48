package main

import (
	"fmt"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/cmdline"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/urfave/cli/v2"
)

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script (bash or zsh)",
		ArgsUsage: "bash|zsh",
		Action: func(c *cli.Context) error {
			switch shell := c.Args().First(); shell {
			case "", "bash":
				fmt.Fprint(c.App.Writer, cmdline.BashCompletion)
			case "zsh":
				fmt.Fprint(c.App.Writer, cmdline.ZshCompletion)
			default:
				return cli.Exit(fmt.Sprintf("completion: unknown shell %q; use bash or zsh", shell), 2)
			}
			return nil
		},
	}
}

// listRuns is the execids (sweeps: the sweep ids) that complete a run's
// argument.
func listRuns(c *cli.Context, sweeps bool) []string {
	runs, err := runsDir(c)
	if err != nil {
		return nil
	}
	if sweeps {
		runs = rundir.Sweeps(runs)
	}
	all, _ := rundir.List(runs)
	ids := make([]string, len(all))
	for i, r := range all {
		ids[i] = r.ExecID
	}
	return ids
}
