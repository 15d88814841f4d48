package main

import "github.com/urfave/cli/v2"

func cancelCommand() *cli.Command {
	return pendingCommand("cancel", "cancel a run by execid or jobid", 3)
}
