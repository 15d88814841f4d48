package main

import "github.com/urfave/cli/v2"

func watchCommand() *cli.Command {
	return pendingCommand("watch", "follow a running job with a progress bar", 10)
}
