package main

import (
	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/config"
	"github.com/urfave/cli/v2"
)

// resolveConfig loads the configuration layers for the running command,
// honouring the global --config, --profile and --runs-dir flags. The
// HPCRUN_PROFILE and HPCRUN_RUNS_DIR variables are read by config.Load, so
// that `hpcrun config show` can tell an environment value from a flag.
func resolveConfig(c *cli.Context) (*config.Resolved, error) {
	return config.Load(config.Options{
		ProjectFile: c.String("config"),
		Profile:     c.String("profile"),
		RunsDir:     c.String("runs-dir"),
	})
}
