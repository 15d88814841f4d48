package main

import (
	"slices"

	"github.com/urfave/cli/v2"
)

// globalFlags are accepted before the command or after it:
// `hpcrun --profile jz queue` and `hpcrun queue --profile jz` mean the same.
func globalFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "read this config `FILE` instead of ./hpcrun.toml", EnvVars: []string{"HPCRUN_CONFIG"}},
		&cli.StringFlag{Name: "profile", Usage: "cluster profile to use (`NAME`; env HPCRUN_PROFILE; see hpcrun config show)"},
		&cli.StringFlag{Name: "runs-dir", Usage: "directory holding one folder per run (`DIR`; env HPCRUN_RUNS_DIR; default runs)"},
		&cli.BoolFlag{Name: "json", Usage: "machine-readable JSON output"},
	}
}

// inheritGlobalFlags gives every command a copy of the global flags and,
// before it runs, copies a value set on an outer command line level into
// the command's own flag (urfave/cli v2 reads the innermost definition).
func inheritGlobalFlags(cmds []*cli.Command) {
	for _, cmd := range cmds {
		if cmd.SkipFlagParsing {
			continue
		}
		inheritGlobalFlags(cmd.Subcommands)
		var names []string
		for _, f := range globalFlags() {
			name := f.Names()[0]
			if slices.ContainsFunc(cmd.Flags, func(g cli.Flag) bool { return slices.Contains(g.Names(), name) }) {
				continue
			}
			cmd.Flags = append(cmd.Flags, f)
			names = append(names, name)
		}
		before := cmd.Before
		cmd.Before = func(c *cli.Context) error {
			for _, name := range names {
				if slices.Contains(c.LocalFlagNames(), name) {
					continue
				}
				for _, outer := range c.Lineage()[1:] {
					if slices.Contains(outer.LocalFlagNames(), name) {
						if err := c.Set(name, outer.String(name)); err != nil {
							return err
						}
						break
					}
				}
			}
			if before != nil {
				return before(c)
			}
			return nil
		}
	}
}
