package main

import (
	"fmt"
	"reflect"

	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

// jobFlags override the profile's resource request for one submission, the
// way sbatch's own options would: one flag for each field of
// slurm.Resources, named and described there.
func jobFlags() []cli.Flag {
	const cat = "job (override the profile)"
	var flags []cli.Flag
	for _, o := range slurm.Options() {
		switch o.Kind {
		case reflect.String:
			flags = append(flags, &cli.StringFlag{Name: o.Flag, Aliases: o.Aliases, Usage: o.Usage, Category: cat})
		case reflect.Int:
			// The default is the profile's, not the flag's zero.
			def := "the profile's"
			if o.Key == "cpus_per_task" {
				def += ", else 1"
			}
			flags = append(flags, &cli.IntFlag{Name: o.Flag, Aliases: o.Aliases, Usage: o.Usage, Category: cat, DefaultText: def})
		case reflect.Bool:
			flags = append(flags, &cli.BoolFlag{Name: o.Flag, Aliases: o.Aliases, Usage: o.Usage, Category: cat})
		default:
			panic(fmt.Sprintf("job option %s: kind %v has no flag", o.Key, o.Kind))
		}
	}
	return flags
}

// applyJobFlags copies the job flags the user set over the profile's
// resources; the job spec's validation then checks them like profile values.
func applyJobFlags(c *cli.Context, r *slurm.Resources) error {
	for _, o := range slurm.Options() {
		if !c.IsSet(o.Flag) {
			continue
		}
		var v any
		switch o.Kind {
		case reflect.String:
			v = c.String(o.Flag)
		case reflect.Int:
			v = c.Int(o.Flag)
		case reflect.Bool:
			v = c.Bool(o.Flag)
		}
		if err := r.Set(o.Key, v); err != nil {
			return err
		}
	}
	return nil
}
