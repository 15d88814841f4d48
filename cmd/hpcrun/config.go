package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/config"
	"github.com/urfave/cli/v2"
)

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "show the resolved configuration and where each value came from",
		Description: "Layers, lowest first: built-in defaults, " + displayUserFile() + ",\n" +
			"./hpcrun.toml (or --config FILE), HPCRUN_* environment variables, flags.\n" +
			"Environment: HPCRUN_PROFILE, HPCRUN_RUNS_DIR, HPCRUN_<KEY> for a key of the\n" +
			"profile in effect (HPCRUN_PARTITION, HPCRUN_TIME, ...), HPCRUN_TRAIN_<KEY> for\n" +
			"a training default (HPCRUN_TRAIN_TP, ...).",
		Subcommands: []*cli.Command{
			{
				Name:  "show",
				Usage: "print the merged configuration of the profile in effect, with sources",
				Action: func(c *cli.Context) error {
					r, err := resolveConfig(c)
					if err != nil {
						return err
					}
					entries := r.Entries()
					if c.Bool("json") {
						return writeJSON(c, entries)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
					for _, e := range entries {
						fmt.Fprintf(tw, "%s\t= %s\t# %s\n", e.Key, config.FormatValue(e.Value), e.Source)
					}
					return tw.Flush()
				},
			},
			{
				Name:  "profiles",
				Usage: "list the defined profiles",
				Action: func(c *cli.Context) error {
					r, err := resolveConfig(c)
					if err != nil {
						return err
					}
					type row struct {
						Name     string `json:"name"`
						Executor string `json:"executor"`
						GPUs     int    `json:"gpus_per_node"`
						Current  bool   `json:"current"`
					}
					var rows []row
					for _, n := range r.ProfileNames() {
						p := r.Profiles[n]
						rows = append(rows, row{n, p.Executor, p.GPUsPerNode, n == r.ProfileName})
					}
					if c.Bool("json") {
						return writeJSON(c, rows)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
					fmt.Fprintln(tw, "\tPROFILE\tEXECUTOR\tGPUS/NODE")
					for _, x := range rows {
						mark := ""
						if x.Current {
							mark = "*"
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", mark, x.Name, x.Executor, x.GPUs)
					}
					return tw.Flush()
				},
			},
			{
				Name:  "path",
				Usage: "print the config files hpcrun reads",
				Action: func(c *cli.Context) error {
					project := c.String("config")
					if project == "" {
						project = "hpcrun.toml"
					}
					fmt.Fprintf(c.App.Writer, "user:    %s\nproject: %s\n", config.UserFilePath(), project)
					return nil
				},
			},
		},
	}
}

func displayUserFile() string {
	if p := config.UserFilePath(); p != "" {
		return "the user file (" + p + ")"
	}
	return "the user file"
}

// writeJSON prints v as indented JSON on the command's output.
func writeJSON(c *cli.Context, v any) error {
	enc := json.NewEncoder(c.App.Writer)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
