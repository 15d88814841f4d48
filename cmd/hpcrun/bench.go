package main

import "github.com/urfave/cli/v2"

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "benchmarks measured against a peer in the same run",
		Subcommands: []*cli.Command{
			benchGemmCommand(),
			benchCommCommand(),
			benchStepCommand(),
		},
	}
}
