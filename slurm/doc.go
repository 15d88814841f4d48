// Package slurm turns a job spec into an sbatch script and runs it: on a real
// Slurm through sbatch/squeue/scontrol/sacct/scancel, or through the Local
// executor that starts the tasks itself with the variables srun would set. It
// knows nothing of training.
package slurm
