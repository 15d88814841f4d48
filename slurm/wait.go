package slurm

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrStoppedWaiting is Wait's error when its context ends before the job
// does; the job goes on.
var ErrStoppedWaiting = errors.New("stopped waiting")

// Wait asks status for a job's state every interval until the job is over
// (State.Done) and returns that last answer. each, when not nil, sees
// every answer, the last included, before Wait looks at it; an error of
// status or each ends the wait with that error, and the end of ctx with
// ErrStoppedWaiting (wrapping ctx's error).
func Wait(ctx context.Context, interval time.Duration, status func(context.Context) (JobInfo, error), each func(JobInfo) error) (JobInfo, error) {
	for {
		j, err := status(ctx)
		if err != nil {
			return j, err
		}
		if each != nil {
			if err := each(j); err != nil {
				return j, err
			}
		}
		if j.State.Done() {
			return j, nil
		}
		select {
		case <-ctx.Done():
			return j, fmt.Errorf("%w: %w", ErrStoppedWaiting, context.Cause(ctx))
		case <-time.After(interval):
		}
	}
}
