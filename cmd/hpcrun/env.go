package main

import (
	"fmt"
	"os"

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
			if err := e.WriteText(c.App.Writer); err != nil {
				return err
			}
			return cudalib.WriteReport(c.App.Writer, cudalib.SearchDirs(), cudalib.FindAll())
		},
	}
}
