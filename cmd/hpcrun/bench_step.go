package main

import "github.com/urfave/cli/v2"

func benchStepCommand() *cli.Command {
	return pendingCommand("step", "time one training step and its model GFLOP/s", 8)
}
