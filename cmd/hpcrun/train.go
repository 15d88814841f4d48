package main

import "github.com/urfave/cli/v2"

func trainCommand() *cli.Command {
	return pendingCommand("train", "run one training task (what srun runs inside the job)", 8)
}
