// Package idrenv tells a process inside a job who it is: global and local
// rank, world size, node list, master address and port, and the GPU to use,
// read from Slurm's (or torchrun's) environment variables.
package idrenv
