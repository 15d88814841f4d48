package main

import "github.com/urfave/cli/v2"

func benchCommCommand() *cli.Command {
	return pendingCommand("comm", "collective bus bandwidth next to Open MPI", 5)
}
