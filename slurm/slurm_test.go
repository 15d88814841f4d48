package slurm

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseSbatch(t *testing.T) {
	for in, want := range map[string][2]string{
		"12345\n":                      {"12345", ""},
		"12345;jeanzay\n":              {"12345", "jeanzay"},
		"sbatch: warning: x\n777;c1\n": {"777", "c1"},
		"Submitted batch job 12\n":     {"", "error"},
		"":                             {"", "error"},
		"12a\n":                        {"", "error"},
	} {
		id, cl, err := ParseSbatch([]byte(in))
		if want[1] == "error" {
			if err == nil {
				t.Errorf("ParseSbatch(%q) = %q, want an error", in, id)
			}
			continue
		}
		if err != nil || id != want[0] || cl != want[1] {
			t.Errorf("ParseSbatch(%q) = %q, %q, %v; want %q, %q", in, id, cl, err, want[0], want[1])
		}
	}
}

func TestParseSqueue(t *testing.T) {
	jobs, err := ParseSqueue(readTestdata(t, "squeue.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 7 {
		t.Fatalf("%d jobs, want 7", len(jobs))
	}
	byID := map[string]JobInfo{}
	for _, j := range jobs {
		byID[j.ID] = j
	}
	if j := byID["5"]; j.Name != "a b|c" || j.State != Running || j.NodeList != "vm" || j.Reason != "" || j.Elapsed != 4*time.Second || j.Nodes != 1 ||
		j.WorkDir != "/home/u/runs/20261121-043825-a3f9" || j.Comment != "hpcrun:20261121-043825-a3f9" || !j.SubmitTime.Equal(time.Date(2026, 11, 21, 4, 38, 25, 0, time.Local)) {
		t.Errorf("running job: %+v", j)
	}
	if j := byID["7"]; j.State != Pending || j.Reason != "PartitionConfig" || j.NodeList != "" || j.Nodes != 2 || j.TimeLimit != "UNLIMITED" {
		t.Errorf("pending job: %+v", j)
	}
	if j := byID["6"]; j.State != Failed || j.Reason != "NonZeroExitCode" || !j.State.Done() {
		t.Errorf("failed job: %+v", j)
	}
	if _, err := ParseSqueue([]byte("1|RUNNING|0:01\n")); err == nil {
		t.Error("short line: no error")
	}
}

func TestParseScontrol(t *testing.T) {
	tests := []struct {
		file string
		want JobInfo
	}{
		{"scontrol-running.txt", JobInfo{ID: "5", Name: "a b|c", State: Running, Elapsed: 4 * time.Second, Nodes: 1, NodeList: "vm", Partition: "debug", TimeLimit: "UNLIMITED", Source: "scontrol"}},
		{"scontrol-failed.txt", JobInfo{ID: "6", Name: "fail", State: Failed, Reason: "NonZeroExitCode", Nodes: 1, NodeList: "vm", Partition: "debug", TimeLimit: "UNLIMITED", ExitCode: 3, Source: "scontrol"}},
		{"scontrol-pending.txt", JobInfo{ID: "7", Name: "big", State: Pending, Reason: "PartitionConfig", Nodes: 2, Partition: "debug", TimeLimit: "UNLIMITED", Source: "scontrol"}},
	}
	for _, tt := range tests {
		tt.want.WorkDir, tt.want.SubmitTime = "/tmp", time.Date(2026, 11, 21, 4, 38, 25, 0, time.Local)
		got, err := ParseScontrol(readTestdata(t, tt.file))
		if err != nil {
			t.Fatalf("%s: %v", tt.file, err)
		}
		if got != tt.want {
			t.Errorf("%s:\ngot  %+v\nwant %+v", tt.file, got, tt.want)
		}
	}
	got, err := ParseScontrol(readTestdata(t, "scontrol-cancelled.txt"))
	if err != nil || got.State != Cancelled || !got.State.Done() || got.ExitCode != 128+15 {
		t.Errorf("cancelled: %+v, %v", got, err)
	}
	if _, err := ParseScontrol([]byte("slurm_load_jobs error: Invalid job id specified")); err == nil {
		t.Error("error text: no error")
	}
}

func TestParseSacct(t *testing.T) {
	jobs, err := ParseSacct(readTestdata(t, "sacct.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := []JobInfo{
		{ID: "812345", Name: "bert-tp2", State: Completed, Elapsed: 751 * time.Second, Nodes: 2, NodeList: "jzxh[101-102]", Partition: "gpu_p5", TimeLimit: "01:00:00", Source: "sacct"},
		{ID: "812346", Name: "gpt a|b", State: Failed, Elapsed: 7 * time.Second, Nodes: 1, NodeList: "jzxh103", Partition: "gpu_p5", TimeLimit: "01:00:00", ExitCode: 3, Reason: "NonZeroExitCode", Source: "sacct"},
		{ID: "812347", Name: "big", State: Cancelled, Nodes: 4, Partition: "gpu_p5", TimeLimit: "20:00:00", ExitCode: 128 + 15, Source: "sacct"},
		{ID: "812348", Name: "slow", State: Timeout, Elapsed: 3601 * time.Second, Nodes: 1, NodeList: "jzxh104", Partition: "gpu_p5", TimeLimit: "01:00:00", Reason: "TimeLimit", Source: "sacct"},
	}
	if len(jobs) != len(want) {
		t.Fatalf("%d jobs, want %d", len(jobs), len(want))
	}
	for i := range want {
		if jobs[i] != want[i] {
			t.Errorf("line %d:\ngot  %+v\nwant %+v", i+1, jobs[i], want[i])
		}
	}
	if _, err := ParseSacct([]byte("1|x|RUNNING\n")); err == nil {
		t.Error("short line: no error")
	}
}

func TestElapsed(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"0:04": 4 * time.Second, "12:31": 751 * time.Second, "1:00:01": 3601 * time.Second,
		"2-03:04:05": (2*86400 + 3*3600 + 4*60 + 5) * time.Second, "INVALID": 0,
	} {
		if got := parseElapsed(in); got != want {
			t.Errorf("parseElapsed(%q) = %v, want %v", in, got, want)
		}
	}
	for d, want := range map[time.Duration]string{4 * time.Second: "0:04", 3601 * time.Second: "1:00:01", 90000 * time.Second: "1-01:00:00"} {
		if got := FormatElapsed(d); got != want {
			t.Errorf("FormatElapsed(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestTaskInRange(t *testing.T) {
	for _, tc := range []struct {
		list, task string
		want       bool
	}{
		{"3", "3", true}, {"0-7", "7", true}, {"0-7", "8", false}, {"1,4-5", "4", true}, {"1,4-5", "2", false},
		{"0-9%2", "9", true}, {"4294967294", "1", false}, {"", "0", false}, {"0-3", "x", false},
	} {
		if got := taskInRange(tc.list, tc.task); got != tc.want {
			t.Errorf("taskInRange(%q, %q) = %v, want %v", tc.list, tc.task, got, tc.want)
		}
	}
}
