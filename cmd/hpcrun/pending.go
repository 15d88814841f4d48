package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// pendingCommand is a command whose implementation has not landed yet: it is
// listed and has help, but running it says so and exits non-zero.
func pendingCommand(name, usage string, issue int) *cli.Command {
	return &cli.Command{
		Name:            name,
		Usage:           usage + " (not implemented yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return cli.Exit(fmt.Sprintf("%s: not implemented yet (issue #%d)", name, issue), 3)
		},
	}
}
