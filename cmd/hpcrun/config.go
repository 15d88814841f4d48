package main

import "github.com/urfave/cli/v2"

func configCommand() *cli.Command {
	return pendingCommand("config", "show the resolved configuration", 2)
}
