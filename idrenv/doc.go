// Package idrenv tells a process inside a job who it is: global and local
// rank, world size, node list, master address and port, and the GPU to use,
// read from Slurm's (or torchrun's) environment variables.
//
// Detect tries, in order: torchrun (TORCHELASTIC_RUN_ID set: RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT win);
// srun's step variables (SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST,
// SLURM_STEP_TASKS_PER_NODE with SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID),
// which are right when srun starts fewer tasks than the job holds; the
// job-level variables (SLURM_NTASKS, SLURM_JOB_NODELIST,
// SLURM_TASKS_PER_NODE); and otherwise a single process. Under Slurm the
// master is the first node of the step's node list, and the variables are
// checked against each other (rank below world, counts matching the node
// list, SLURMD_NODENAME and SLURM_GTIDS matching this task), so a batch
// script that forgot srun gets an error instead of a hang.
//
// The master port is MASTER_PORT if set, else the port the caller
// configured (Options.MasterPort), else PortBase + job id mod PortSpan
// (20000-29999), so jobs sharing a node do not collide. Concurrent steps of
// one job that share a node should set MASTER_PORT.
//
// Env.LimitThreads makes the process's threads the CPUs the launcher gave
// the task (SLURM_CPUS_PER_TASK, or its share of SLURM_CPUS_ON_NODE).
//
// ExpandHostlist and ExpandTasksPerNode parse Slurm's compressed node lists
// (jz[001-003,007],gpu5) and per-node counts (2(x3),1) exactly as Slurm
// expands them.
package idrenv
