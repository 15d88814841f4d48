package main

import "github.com/urfave/cli/v2"

func envCommand() *cli.Command {
	return pendingCommand("env", "print the in-job environment detected from Slurm variables", 4)
}
