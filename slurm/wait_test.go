package slurm

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// states answers the states in turn, then the last one for ever.
func states(s ...State) (func(context.Context) (JobInfo, error), *int) {
	calls := 0
	return func(context.Context) (JobInfo, error) {
		calls++
		return JobInfo{ID: "7", State: s[min(calls, len(s))-1]}, nil
	}, &calls
}

func TestWaitUntilDone(t *testing.T) {
	status, calls := states(Pending, Running, Running, Completed)
	var seen []State
	j, err := Wait(context.Background(), time.Millisecond, status, func(j JobInfo) error {
		seen = append(seen, j.State)
		return nil
	})
	if err != nil || j.State != Completed || *calls != 4 {
		t.Errorf("Wait = %+v, %v after %d calls; want COMPLETED after 4", j, err, *calls)
	}
	if want := []State{Pending, Running, Running, Completed}; !slices.Equal(seen, want) {
		t.Errorf("each saw %v, want %v", seen, want)
	}
	// A job already over is one question; each may be nil.
	status, calls = states(Failed)
	if j, err := Wait(context.Background(), time.Hour, status, nil); err != nil || j.State != Failed || *calls != 1 {
		t.Errorf("a finished job: %+v, %v after %d calls", j, err, *calls)
	}
}

func TestWaitErrors(t *testing.T) {
	bad := errors.New("squeue: connection refused")
	calls := 0
	_, err := Wait(context.Background(), time.Millisecond, func(context.Context) (JobInfo, error) {
		calls++
		if calls == 3 {
			return JobInfo{}, bad
		}
		return JobInfo{State: Running}, nil
	}, nil)
	if !errors.Is(err, bad) || errors.Is(err, ErrStoppedWaiting) || calls != 3 {
		t.Errorf("status failing at call 3: %v after %d calls", err, calls)
	}

	drawn := errors.New("the terminal went away")
	status, calls2 := states(Running)
	if _, err := Wait(context.Background(), time.Millisecond, status, func(JobInfo) error { return drawn }); !errors.Is(err, drawn) || *calls2 != 1 {
		t.Errorf("each failing: %v after %d calls", err, *calls2)
	}

	ctx, cancel := context.WithCancel(context.Background())
	status, calls2 = states(Running)
	j, err := Wait(ctx, time.Hour, status, func(JobInfo) error {
		cancel() // stopped (a signal) while the job runs
		return nil
	})
	if !errors.Is(err, ErrStoppedWaiting) || !errors.Is(err, context.Canceled) || j.State != Running || *calls2 != 1 {
		t.Errorf("stopped: %+v, %v after %d calls", j, err, *calls2)
	}
}
