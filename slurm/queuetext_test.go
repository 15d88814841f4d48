package slurm

import (
	"bytes"
	"testing"
)

func TestStatesFilter(t *testing.T) {
	rows := []QueueRow{{JobID: "1", State: Running}, {JobID: "2", State: Failed}, {JobID: "3", State: Cancelled}}
	if got := ParseStates(nil).Filter(rows); len(got) != 3 {
		t.Errorf("no states kept %d rows", len(got))
	}
	states := ParseStates([]string{" failed, Cancelled", ""})
	if len(states) != 2 || !states[Failed] || !states[Cancelled] {
		t.Fatalf("ParseStates = %v", states)
	}
	got := states.Filter(rows)
	if len(got) != 2 || got[0].JobID != "2" || got[1].JobID != "3" {
		t.Errorf("kept %+v", got)
	}
}

// TestWriteQueue: where a job runs, else why it waits (first line), else
// how it failed; "-" for what a row lacks.
func TestWriteQueue(t *testing.T) {
	var b bytes.Buffer
	err := WriteQueue(&b, []QueueRow{
		{ExecID: "e1", JobID: "7", Name: "tiny", State: Running, Elapsed: "0:05", Nodes: 2, NodeList: "n[1-2]", Executor: "slurm"},
		{ExecID: "e2", JobID: "8", Name: "big", State: Pending, Elapsed: "0:00", Reason: "Resources\nmore", Executor: "slurm"},
		{ExecID: "e3", JobID: "9", Name: "oom", State: Failed, Elapsed: "1:00", Nodes: 1, NodeList: "n1", Reason: "OutOfMemory", Failure: "oom", Executor: "local"},
		{Name: "never", State: "NOT_SUBMITTED", Executor: "slurm"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "EXECID  JOBID  NAME   STATE          ELAPSED  NODES  NODELIST(REASON)  EXECUTOR\n" +
		"e1      7      tiny   RUNNING        0:05     2      n[1-2]            slurm\n" +
		"e2      8      big    PENDING        0:00     -      (Resources)       slurm\n" +
		"e3      9      oom    FAILED         1:00     1      (oom)             local\n" +
		"-       -      never  NOT_SUBMITTED           -                        slurm\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	if FirstLine("a\nb") != "a" || FirstLine("a") != "a" {
		t.Error("FirstLine")
	}
}
