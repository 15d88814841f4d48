package main

import (
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// interspersed moves the flags a user typed after a command's positional
// arguments in front of them: urfave/cli v2 stops reading flags at the first
// argument, but `hpcrun metrics <execid> --plot` should work like
// `hpcrun metrics --plot <execid>`. Everything after "--" stays as it is.
func interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	rest := args[1:]
	flags := app.Flags
	cmds := app.Commands
	// Walk the global flags and the command path.
	for len(rest) > 0 {
		a := rest[0]
		if a == "--" {
			return append(out, rest...)
		}
		if strings.HasPrefix(a, "-") {
			n := flagTokens(flags, rest)
			out, rest = append(out, rest[:n]...), rest[n:]
			continue
		}
		i := slices.IndexFunc(cmds, func(c *cli.Command) bool { return c.HasName(a) })
		if i < 0 {
			break
		}
		out, rest = append(out, a), rest[1:]
		if cmds[i].SkipFlagParsing {
			return append(out, rest...)
		}
		flags, cmds = cmds[i].Flags, cmds[i].Subcommands
	}
	var positional []string
	for len(rest) > 0 {
		a := rest[0]
		if a == "--" {
			positional = append(positional, rest...)
			break
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			n := flagTokens(flags, rest)
			out, rest = append(out, rest[:n]...), rest[n:]
			continue
		}
		positional, rest = append(positional, a), rest[1:]
	}
	return append(out, positional...)
}

// flagTokens is how many of args (starting with a flag) belong to that
// flag: 2 when it takes a value given as the next argument, else 1.
func flagTokens(flags []cli.Flag, args []string) int {
	name := strings.TrimLeft(args[0], "-")
	if strings.Contains(name, "=") || len(args) < 2 {
		return 1
	}
	for _, f := range flags {
		if !slices.Contains(f.Names(), name) {
			continue
		}
		if v, ok := f.(cli.DocGenerationFlag); ok && v.TakesValue() {
			return 2
		}
		return 1
	}
	return 1
}
