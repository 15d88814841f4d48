package cmdline

import (
	"regexp"
	"slices"
	"sync"

	"github.com/urfave/cli/v2"
)

// ownDefault matches a usage that says its default itself: "(0 = 3)",
// "(default: from gpus_per_node)", "0 for CPU nodes", "default: the
// profile's".
var ownDefault = regexp.MustCompile(`\(0 = |; 0 = |\(0 for |default:|; 0: `)

// zeroDefault is the "(default: 0)" urfave/cli appends to a flag whose
// zero value stands for another default.
var zeroDefault = regexp.MustCompile(` \(default: (0|false)?\)$`)

// OneDefault makes --help show one default per flag: the usage's own when
// it has one, not "(default: from gpus_per_node) (default: 0)". It sets
// urfave/cli's FlagStringer, once.
func OneDefault() {
	oneDefault.Do(setOneDefault)
}

var oneDefault sync.Once

func setOneDefault() {
	stringify := cli.FlagStringer
	cli.FlagStringer = func(f cli.Flag) string {
		s := stringify(f)
		if u, ok := f.(interface{ GetUsage() string }); ok && ownDefault.MatchString(u.GetUsage()) {
			s = zeroDefault.ReplaceAllString(s, "")
		}
		return s
	}
}

// InheritFlags gives every command a copy of the flags global makes (the
// app's global flags) and, before it runs, copies a value set on an outer
// command line level into the command's own flag (urfave/cli v2 reads the
// innermost definition): `hpcrun --profile jz queue` and `hpcrun queue
// --profile jz` mean the same.
func InheritFlags(cmds []*cli.Command, global func() []cli.Flag) {
	for _, cmd := range cmds {
		if cmd.SkipFlagParsing {
			continue
		}
		InheritFlags(cmd.Subcommands, global)
		var names []string
		for _, f := range global() {
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
