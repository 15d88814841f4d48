package slurm

import (
	"errors"
	"os/exec"
	"testing"
	"time"
)

func TestExitStatus(t *testing.T) {
	for _, c := range []struct {
		j    JobInfo
		code int
		msg  string
	}{
		{JobInfo{ID: "7", State: Completed}, 0, ""},
		{JobInfo{ID: "7", State: Failed, ExitCode: 3, Reason: "NonZeroExitCode"}, 3, "run e: job 7 ended FAILED with exit code 3; see hpcrun logs --err e"},
		{JobInfo{ID: "7", State: Timeout, Reason: "TimeLimit"}, 1, "run e: job 7 ended TIMEOUT (TimeLimit); see hpcrun logs --err e"},
		{JobInfo{ID: "7", State: Failed, ExitCode: 300}, 1, "run e: job 7 ended FAILED with exit code 300; see hpcrun logs --err e"},
	} {
		code, msg := c.j.ExitStatus("e")
		if code != c.code || msg != c.msg {
			t.Errorf("%+v: %d %q; want %d %q", c.j, code, msg, c.code, c.msg)
		}
	}
}

func TestTasksEnd(t *testing.T) {
	m := &Meta{JobID: "123", Host: "h", Spec: JobSpec{Name: "tiny"}}
	exit := func(code string) TaskExit { return TaskExit{Err: exec.Command("sh", "-c", "exit "+code).Run()} }
	f, by := TasksEnd(m, nil, nil, 1400*time.Millisecond)
	if f.State != Completed || by != "" || f.Elapsed != time.Second || f.ID != "123" || f.NodeList != "h" || f.Source != "run" {
		t.Errorf("all well: %+v, %q", f, by)
	}
	if f, by := TasksEnd(m, []TaskExit{exit("130"), exit("75")}, nil, 0); f.State != Cancelled || by != "SIGINT" || f.ExitCode != 130 || f.Reason != "stopped by SIGINT" {
		t.Errorf("Ctrl-C: %+v, %q", f, by)
	}
	if f, _ := TasksEnd(m, []TaskExit{exit("2"), exit("143")}, nil, 0); f.State != Failed || f.ExitCode != 2 || f.Reason != "NonZeroExitCode" {
		t.Errorf("a rank failed: %+v", f)
	}
	if f, _ := TasksEnd(m, nil, errors.New("no launcher"), 0); f.State != Failed || f.ExitCode != 1 {
		t.Errorf("the launcher failed: %+v", f)
	}
}
