package main

import "github.com/urfave/cli/v2"

func ckptCommand() *cli.Command {
	return pendingCommand("ckpt", "inspect, merge and reshard checkpoints", 9)
}
