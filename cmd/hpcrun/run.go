package main

import "github.com/urfave/cli/v2"

func runCommand() *cli.Command {
	return pendingCommand("run", "run all ranks of a training locally, without Slurm", 8)
}
