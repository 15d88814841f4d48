package slurm

import (
	"fmt"
	"strconv"
)

// ArrayRange is the --array value (JobSpec.Array) of n tasks numbered
// 0..n-1, at most parallel of them at once, 0 for as many as Slurm
// allows: "0-4", "0-4%2".
func ArrayRange(n, parallel int) string {
	r := fmt.Sprintf("0-%d", n-1)
	if parallel > 0 {
		r += "%" + strconv.Itoa(parallel)
	}
	return r
}

// ArrayTaskID is the job id of task of the array jobID as Slurm writes it
// (%A_%a), which squeue, sacct and scancel take and the array's log files
// are named by: "1234_3".
func ArrayTaskID(jobID string, task int) string { return jobID + "_" + strconv.Itoa(task) }
