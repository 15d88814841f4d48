package main

import "github.com/urfave/cli/v2"

func submitCommand() *cli.Command {
	return pendingCommand("submit", "write and submit the sbatch script for a training run", 3)
}
