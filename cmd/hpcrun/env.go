package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/internal/cudalib"
	"github.com/urfave/cli/v2"
)

func envCommand() *cli.Command {
	return &cli.Command{
		Name:  "env",
		Usage: "print the in-job environment detected from Slurm variables",
		Description: "Prints who this process is inside its job: rank, world size, local rank,\n" +
			"node layout, master address and port, job id, CPUs and GPU, read from\n" +
			"srun's step variables, the job's, or torchrun's. Run it under srun:\n" +
			"  srun -n 4 hpcrun env --json\n" +
			"Then the CUDA libraries: where each is found, by the rule of\n" +
			"HPCRUN_CUDA_LIB_PATH, LD_LIBRARY_PATH, the python3 wheels' nvidia/*/lib,\n" +
			"CUDA_HOME's lib64, then the dynamic linker.\n" +
			"The master port is derived from the job id (" + fmt.Sprint(idrenv.PortBase) + " + id mod " +
			fmt.Sprint(idrenv.PortSpan) + ") unless MASTER_PORT or --master-port is set.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "master-port", Usage: "use this `PORT` instead of the one derived from the job id (MASTER_PORT still wins)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("env takes no arguments, got %q", c.Args().Slice())
			}
			e, err := idrenv.DetectFrom(os.LookupEnv, idrenv.Options{MasterPort: c.Int("master-port")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return writeJSON(c, e)
			}
			if err := printEnv(c.App.Writer, e); err != nil {
				return err
			}
			return printLibs(c.App.Writer, cudalib.SearchDirs(), findLibs())
		},
	}
}

// printEnv writes e as aligned "key  value" lines, keys as in the JSON.
func printEnv(w io.Writer, e idrenv.Env) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("source", e.Source)
	row("rank", e.Rank)
	row("world_size", e.WorldSize)
	row("local_rank", e.LocalRank)
	row("local_world_size", e.LocalWorldSize)
	row("node_rank", e.NodeRank)
	row("num_nodes", e.NumNodes)
	row("node", e.Node)
	if len(e.Nodes) > 0 {
		row("nodes", strings.Join(e.Nodes, ","))
		row("tasks_per_node", idrenv.CompressTasksPerNode(e.TasksPerNode))
	}
	port := fmt.Sprint(e.MasterPort)
	if e.MasterPort == 0 {
		port = "0 (any free port)"
	}
	row("master_addr", e.MasterAddr)
	row("master_port", port)
	row("is_master", e.IsMaster)
	row("job_id", orDash(e.JobID))
	row("step_id", orDash(e.StepID))
	row("restart_count", e.RestartCount)
	if e.CPUsPerTask == 0 {
		row("cpus_per_task", "- (not set by the launcher)")
	} else {
		row("cpus_per_task", e.CPUsPerTask)
	}
	switch {
	case e.GPU < 0:
		row("gpu", "none visible")
	case e.GPUs == nil:
		row("gpu", fmt.Sprintf("%d (local rank; no GPU variables set)", e.GPU))
	default:
		row("gpu", fmt.Sprintf("%d (launcher lists %s)", e.GPU, strings.Join(e.GPUs, ",")))
	}
	return tw.Flush()
}

// libFound is where one CUDA library was found (Found.Path "" when not).
type libFound struct {
	What  string
	Found cudalib.Found
}

// findLibs looks up every CUDA library the project loads.
func findLibs() []libFound {
	var out []libFound
	for _, l := range cudalib.Libraries {
		f, _ := cudalib.Find(l.Names)
		out = append(out, libFound{l.What, f})
	}
	return out
}

// printLibs writes the search directories of the CUDA libraries, then
// where each library is found and by which rule.
func printLibs(w io.Writer, dirs []cudalib.Dir, libs []libFound) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\ncuda library search, in order:")
	for _, d := range dirs {
		fmt.Fprintf(tw, "  %s\t%s\n", d.Path, d.Source)
	}
	fmt.Fprintf(tw, "  (by name)\t%s\n", cudalib.Linker)
	if err := tw.Flush(); err != nil {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range libs {
		if l.Found.Path == "" {
			fmt.Fprintf(tw, "%s\tnot found\n", l.What)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s (%s)\n", l.What, l.Found.Path, l.Found.Source)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
