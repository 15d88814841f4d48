package main

import (
	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/config"
	"github.com/urfave/cli/v2"
)

// jobFlags override the profile's resource request for one submission, the
// way sbatch's own options would.
func jobFlags() []cli.Flag {
	const cat = "job (override the profile)"
	return []cli.Flag{
		&cli.StringFlag{Name: "time", Aliases: []string{"t"}, Usage: "time limit, e.g. 00:20:00 or 1-00:00:00", Category: cat},
		&cli.StringFlag{Name: "partition", Aliases: []string{"p"}, Usage: "Slurm partition", Category: cat},
		&cli.StringFlag{Name: "account", Aliases: []string{"A"}, Usage: "Slurm account", Category: cat},
		&cli.StringFlag{Name: "qos", Usage: "quality of service", Category: cat},
		&cli.StringFlag{Name: "constraint", Aliases: []string{"C"}, Usage: "node features, e.g. a100", Category: cat},
		&cli.IntFlag{Name: "gpus-per-node", Usage: "GPUs a node (0 for CPU nodes)", Category: cat},
		&cli.IntFlag{Name: "cpus-per-task", Aliases: []string{"c"}, Usage: "CPUs a task", Category: cat},
		&cli.BoolFlag{Name: "exclusive", Usage: "whole nodes only", Category: cat},
	}
}

// applyJobFlags copies the job flags the user set over the profile; the job
// spec's validation then checks them like profile values.
func applyJobFlags(c *cli.Context, p *config.Profile) {
	for name, dst := range map[string]*string{
		"time": &p.Time, "partition": &p.Partition, "account": &p.Account,
		"qos": &p.QOS, "constraint": &p.Constraint,
	} {
		if c.IsSet(name) {
			*dst = c.String(name)
		}
	}
	if c.IsSet("gpus-per-node") {
		p.GPUsPerNode = c.Int("gpus-per-node")
	}
	if c.IsSet("cpus-per-task") {
		p.CPUsPerTask = c.Int("cpus-per-task")
	}
	if c.IsSet("exclusive") {
		p.Exclusive = c.Bool("exclusive")
	}
}
