package main

import (
	"context"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/nccl"
	"github.com/hpcrun/hpcrun/slurm"
)

// joinWorld forms this task's world (nccl.Init) from what its launcher
// said: env's rank, size and master, and the master's listener when this
// task inherited it (slurm.MasterListener); o brings the rest (token, timeout,
// backend). hpcrun train, check, generate and eval ranks join this way.
func joinWorld(ctx context.Context, env idrenv.Env, o nccl.Options) (nccl.Comm, error) {
	master, err := slurm.MasterListener()
	if err != nil {
		return nil, err
	}
	o.Rank, o.Size, o.MasterAddr, o.MasterPort, o.Listener = env.Rank, env.WorldSize, env.MasterAddr, env.MasterPort, master
	return nccl.Init(ctx, o)
}
