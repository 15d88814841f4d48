package main

import (
	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/config"
	"github.com/hpcrun/hpcrun/train"
	"github.com/urfave/cli/v2"
)

// resolveConfig loads the configuration layers for the running command,
// honouring the global --config, --profile and --runs-dir flags.
func resolveConfig(c *cli.Context) (*config.Resolved, error) {
	// Placeholder until the layered loader lands: built-in defaults only.
	return &config.Resolved{
		Config:      config.Config{RunsDir: "runs", Train: train.DefaultConfig()},
		ProfileName: "local",
		Profile:     config.Profile{Executor: "auto", CPUsPerTask: 1, Time: "00:10:00", Hint: "nomultithread"},
	}, nil
}
