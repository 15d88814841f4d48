// Package cmdline makes urfave/cli read a command line the way hpcrun's
// users type it: flags after the arguments (Interspersed), the global flags
// anywhere (InheritFlags), a stray argument or an unknown flag refused in
// one line, with the flag it meant by meaning or by spelling (Strict,
// Meanings), one default a flag in --help (OneDefault), --json
// errors (JSONAsked), and shell completion of flags and runs
// (BashCompletion, ZshCompletion, CompleteRuns).
package cmdline

import (
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
	"github.com/xrash/smetrics"
)

// Interspersed moves the flags a user typed after a command's positional
// arguments in front of them: urfave/cli v2 stops reading flags at the first
// argument, but `hpcrun metrics <execid> --plot` should work like
// `hpcrun metrics --plot <execid>`. Everything after "--" stays as it is.
func Interspersed(app *cli.App, args []string) []string {
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

// JSONAsked reports whether the command line asks for --json output
// (before a lone "--").
func JSONAsked(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--json", "-json", "--json=true", "-json=true":
			return true
		}
	}
	return false
}

// Strict makes every command refuse what it would otherwise ignore or bury
// under its help: an argument to a command that takes none (hpcrun submit
// bert-base trained a tiny BERT), and an unknown flag, which gets one line
// with the flag it meant: by meaning, and else by spelling (-ntask: did you
// mean --ntasks?). hint, when set, may say what a stray argument meant
// ("did you mean --preset X?"; "" when nothing).
func Strict(app *cli.App, hint func(cmd *cli.Command, arg string) string, meanings Meanings) {
	usageError := func(c *cli.Context, err error, _ bool) error { return meanings.usageError(c, err) }
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
					return cli.Exit(strayArg(c, hint), 2)
				}
				return action(c)
			}
		}
	}
	walk(app.Commands)
}

// strayArg says that the command takes no arguments, and what the first
// one may have meant.
func strayArg(c *cli.Context, hint func(cmd *cli.Command, arg string) string) string {
	arg := c.Args().First()
	msg := fmt.Sprintf("%s takes no arguments, got %q", strings.TrimPrefix(c.Command.HelpName, c.App.Name+" "), arg)
	if hint != nil {
		if h := hint(c.Command, arg); h != "" {
			return msg + ": " + h
		}
	}
	return msg + " (see " + c.Command.HelpName + " --help)"
}

// HasFlag reports whether cmd has a flag called name.
func HasFlag(cmd *cli.Command, name string) bool {
	for _, f := range cmd.Flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}

// Meaning is what a flag that hpcrun lacks, spelled as another tool spells
// it, means here: Flags, which the command must all have for it to apply,
// and Note, said instead of "did you mean --Flags[0]?" when one flag alone
// would mislead (--dp is not one flag).
type Meaning struct {
	Flags []string
	Note  string
}

// Meanings maps a flag name, without its dashes and with '-' for '_', to
// what it may mean: the first Meaning whose flags the command has applies.
type Meanings map[string][]Meaning

// nearEnough is the least Jaro-Winkler similarity at which a flag is
// suggested for a misspelt one: -ntask gives --ntasks (0.97), -bsize --bsz
// (0.89), but -tensor-parallel no longer --top (0.76).
const nearEnough = 0.8

// suggest is what to tell the user who typed the unknown flag name
// (without dashes) to a command with flags: its meaning when m has one the
// command takes, else the visible flag nearest in spelling, else "".
func (m Meanings) suggest(flags []cli.Flag, name string) string {
	var names []string
	for _, f := range flags {
		if v, ok := f.(cli.VisibleFlag); ok && !v.IsVisible() {
			continue
		}
		names = append(names, f.Names()...)
	}
	for _, mean := range m[strings.ReplaceAll(strings.ToLower(name), "_", "-")] {
		if !slices.ContainsFunc(mean.Flags, func(f string) bool { return !slices.Contains(names, f) }) {
			if mean.Note != "" {
				return mean.Note
			}
			return "did you mean " + dashed(mean.Flags[0]) + "?"
		}
	}
	best, score := "", 0.0
	for _, n := range names {
		// A one-letter alias is no spelling of a longer name: -dp got -d
		// (--dependency), -batch-size -c.
		if len(n) == 1 && len(name) > 1 {
			continue
		}
		// The same constants as urfave/cli's own suggestions.
		if s := smetrics.JaroWinkler(n, name, 0.7, 4); s > score {
			best, score = n, s
		}
	}
	if score < nearEnough {
		return ""
	}
	return "did you mean " + dashed(best) + "?"
}

// dashed is the flag name as typed: -n, --ntasks.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// usageError is a bad flag in one line, with the flag the user may have
// meant, instead of the error above the whole help.
func (m Meanings) usageError(c *cli.Context, err error) error {
	msg := err.Error()
	name, bad := strings.CutPrefix(msg, "flag provided but not defined: ")
	help := "hpcrun --help"
	var flags []cli.Flag
	if c.Command != nil && c.Command.Name != "" {
		help, flags = c.Command.HelpName+" --help", c.Command.Flags
	} else if c.App != nil {
		flags = c.App.Flags
	}
	if bad {
		if s := m.suggest(flags, strings.TrimLeft(name, "-")); s != "" {
			msg += ": " + s
		}
	}
	return cli.Exit(msg+" (see "+help+")", 2)
}
