package main

import (
	"fmt"
	"strings"

	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/urfave/cli/v2"
)

// strictArgs makes every command refuse what it would otherwise ignore or
// bury under its help: an argument to a command that takes none (hpcrun
// submit bert-base trained a tiny BERT), and an unknown flag, which gets
// one line with the nearest flag (-ntask: did you mean --ntasks?).
func strictArgs(app *cli.App) {
	app.OnUsageError = usageError
	var walk func(cmds []*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, cmd := range cmds {
			if cmd.SkipFlagParsing {
				continue
			}
			walk(cmd.Subcommands)
			cmd.OnUsageError = usageError
			if cmd.Action == nil || strings.TrimSpace(cmd.ArgsUsage) != "" {
				continue
			}
			action := cmd.Action
			cmd.Action = func(c *cli.Context) error {
				if c.NArg() > 0 {
					return cli.Exit(strayArg(c), 2)
				}
				return action(c)
			}
		}
	}
	walk(app.Commands)
}

// strayArg says that the command takes no arguments, and what the first
// one may have meant.
func strayArg(c *cli.Context) string {
	arg := c.Args().First()
	msg := fmt.Sprintf("%s takes no arguments, got %q", strings.TrimPrefix(c.Command.HelpName, c.App.Name+" "), arg)
	if _, err := trainconfig.LookupPreset(arg); err == nil && hasFlag(c.Command, "preset") {
		return msg + ": did you mean --preset " + arg + "?"
	}
	return msg + " (see " + c.Command.HelpName + " --help)"
}

func hasFlag(cmd *cli.Command, name string) bool {
	for _, f := range cmd.Flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}

// usageError is a bad flag in one line, with the nearest flag the command
// has, instead of the error above the whole help.
func usageError(c *cli.Context, err error, _ bool) error {
	msg := err.Error()
	name, bad := strings.CutPrefix(msg, "flag provided but not defined: ")
	help := "hpcrun --help"
	var flags []cli.Flag
	if c.Command != nil && c.Command.Name != "" {
		help, flags = c.Command.HelpName+" --help", c.Command.Flags
	} else if c.App != nil {
		flags = c.App.Flags
	}
	if bad && cli.SuggestFlag != nil {
		if s := cli.SuggestFlag(flags, strings.TrimLeft(name, "-"), true); s != "" {
			msg += ": did you mean " + s + "?"
		}
	}
	return cli.Exit(msg+" (see "+help+")", 2)
}
