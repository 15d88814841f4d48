package main

import "github.com/urfave/cli/v2"

func queueCommand() *cli.Command {
	return pendingCommand("queue", "list your jobs, their state and their execids", 3)
}
