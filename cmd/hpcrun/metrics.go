package main

import "github.com/urfave/cli/v2"

func metricsCommand() *cli.Command {
	return pendingCommand("metrics", "loss, accuracy, throughput, step time and memory of runs", 10)
}
