package main

import (
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
