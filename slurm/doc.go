// Package slurm turns a job spec into an sbatch script and runs it: on a real
// Slurm through sbatch/squeue/scontrol/sacct/scancel, or through the Local
// executor that starts the tasks itself with the variables srun would set.
// A run's job state (Run.Status, kept in meta.json once the job is over) and
// the queue joined to the runs dir (ListQueue) are here too, as are the one
// local launcher (Tasks, Torchrun, LaunchSelf) and what a task does with the
// signals that ask it to stop (HoldSignals, StopOnSignals, StopReason,
// Requeue). It knows nothing of training.
package slurm
