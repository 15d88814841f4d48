package main

import "github.com/urfave/cli/v2"

func logsCommand() *cli.Command {
	return pendingCommand("logs", "print a run's stdout or stderr", 3)
}
