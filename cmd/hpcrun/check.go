package main

import "github.com/urfave/cli/v2"

func checkCommand() *cli.Command {
	return pendingCommand("check", "check tensor-parallel layers against the unsharded ones", 7)
}
