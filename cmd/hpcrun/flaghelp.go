package main

import (
	"regexp"

	"github.com/urfave/cli/v2"
)

// ownDefault matches a usage that says its default itself: "(0 = 3)",
// "(default: from gpus_per_node)", "0 for CPU nodes", "default: the
// profile's".
var ownDefault = regexp.MustCompile(`\(0 = |; 0 = |\(0 for |default:|; 0: `)

// zeroDefault is the "(default: 0)" urfave/cli appends to a flag whose
// zero value stands for another default.
var zeroDefault = regexp.MustCompile(` \(default: (0|false)?\)$`)

func init() {
	// --help shows one default per flag: the usage's own when it has one,
	// not "(default: from gpus_per_node) (default: 0)".
	stringify := cli.FlagStringer
	cli.FlagStringer = func(f cli.Flag) string {
		s := stringify(f)
		if u, ok := f.(interface{ GetUsage() string }); ok && ownDefault.MatchString(u.GetUsage()) {
			s = zeroDefault.ReplaceAllString(s, "")
		}
		return s
	}
}
