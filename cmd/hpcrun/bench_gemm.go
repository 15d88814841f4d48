package main

import "github.com/urfave/cli/v2"

func benchGemmCommand() *cli.Command {
	return pendingCommand("gemm", "GEMM GFLOP/s next to OpenBLAS sgemm", 6)
}
