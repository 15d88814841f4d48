package slurm

import (
	"reflect"
	"strings"
	"testing"
)

func TestSize(t *testing.T) {
	tests := []struct {
		n, gpn  int
		want    Layout
		wantErr string
	}{
		{1, 4, Layout{1, 1, 1}, ""},
		{3, 4, Layout{1, 3, 3}, ""},
		{4, 4, Layout{1, 4, 4}, ""},
		{8, 4, Layout{2, 4, 4}, ""},
		{16, 8, Layout{2, 8, 8}, ""},
		{6, 4, Layout{}, "use fewer than 4 tasks, or a multiple of 4 (4 or 8)"},
		{12, 8, Layout{}, "a multiple of 8 (8 or 16)"},
		{4, 0, Layout{1, 4, 0}, ""},
		{64, 0, Layout{1, 64, 0}, ""},
		{0, 4, Layout{}, "ntasks = 0"},
		{2, -1, Layout{}, "gpus_per_node = -1"},
	}
	for _, tt := range tests {
		got, err := Size(tt.n, tt.gpn)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Size(%d, %d) error = %v, want %q", tt.n, tt.gpn, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Size(%d, %d) = %+v, %v; want %+v", tt.n, tt.gpn, got, err, tt.want)
		}
	}
}

func TestParseTime(t *testing.T) {
	good := map[string]int{
		"30": 1800, "30:15": 1815, "01:00:00": 3600, "100:00:00": 360000, "2-00": 172800,
		"1-02:03": 93780, "1-02:03:04": 93784, "0:30": 30,
	}
	for in, want := range good {
		got, err := ParseTime(in)
		if err != nil || got != want {
			t.Errorf("ParseTime(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"abc", "1:2:3:4", "10:60", "1:61:00", "1-25", "-1", "1-", ":30", "0", "00:00:00", "1h", " 10", "1-2-3", "99999999999"} {
		if err := ValidateTime(in); err == nil {
			t.Errorf("ValidateTime(%q) = nil, want an error", in)
		}
	}
	for _, in := range []string{"", "UNLIMITED", "INFINITE", "20:00:00"} {
		if err := ValidateTime(in); err != nil {
			t.Errorf("ValidateTime(%q) = %v", in, err)
		}
	}
}

func validSpec() JobSpec {
	return JobSpec{
		Name: "bert-tp2", RunDir: "/scratch/u/runs/20261121-143005-a3f9", NTasks: 4,
		Resources: Resources{GPUsPerNode: 4, CPUsPerTask: 10, Time: "01:00:00", Hint: "nomultithread"},
		Program:   "/home/u/bin/hpcrun", Args: []string{"train", "--run-dir", "/scratch/u/runs/20261121-143005-a3f9"},
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		edit func(*JobSpec)
		want string
	}{
		{func(s *JobSpec) { s.Name = "a;b" }, "job name"},
		{func(s *JobSpec) { s.Name = "" }, "job name"},
		{func(s *JobSpec) { s.Name = "$(x)" }, "job name"},
		{func(s *JobSpec) { s.RunDir = "runs/x" }, "absolute"},
		{func(s *JobSpec) { s.RunDir = "/a b/x" }, "spaces"},
		{func(s *JobSpec) { s.RunDir = "/a%b" }, "spaces"},
		{func(s *JobSpec) { s.NTasks = 6 }, "whole nodes"},
		{func(s *JobSpec) { s.CPUsPerTask = 0 }, "cpus_per_task"},
		{func(s *JobSpec) { s.Time = "1h" }, "time \"1h\""},
		{func(s *JobSpec) { s.Account = "a b" }, "account"},
		{func(s *JobSpec) { s.QOS = "q`x`" }, "qos"},
		{func(s *JobSpec) { s.Partition = "p\n#SBATCH --x" }, "partition"},
		{func(s *JobSpec) { s.Constraint = "a100 x" }, "constraint"},
		{func(s *JobSpec) { s.Hint = "NoMulti" }, "hint"},
		{func(s *JobSpec) { s.Reservation = "r x" }, "reservation"},
		{func(s *JobSpec) { s.Dependency = "after ok:1" }, "dependency"},
		{func(s *JobSpec) { s.Dependency = "afterok:$(x)" }, "dependency"},
		{func(s *JobSpec) { s.MailType = "end" }, "mail_type"},
		{func(s *JobSpec) { s.MailType = "END,SOMETIMES" }, "mail_type"},
		{func(s *JobSpec) { s.MailUser = "a b@c" }, "mail_user"},
		{func(s *JobSpec) { s.GPUsPerNode = -1 }, "gpus_per_node"},
		{func(s *JobSpec) { s.Checkpoint, s.SignalSecs = true, -1 }, "signal_secs"},
		{func(s *JobSpec) { s.Env = map[string]string{"1X": "v"} }, "env name"},
		{func(s *JobSpec) { s.Extra = []string{"--mail-type=END\nrm -rf /"} }, "extra"},
		{func(s *JobSpec) { s.Extra = []string{"mail"} }, "extra"},
		{func(s *JobSpec) { s.Program = "hpcrun" }, "program"},
		{func(s *JobSpec) { s.Args = []string{"a\x00b"} }, "NUL"},
	}
	if err := validSpec().Validate(); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for _, tt := range tests {
		s := validSpec()
		tt.edit(&s)
		err := s.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Validate() = %v, want an error about %q", err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("Validate() error spans lines: %q", err)
		}
	}
}

func TestResourcesBecomeSbatchLines(t *testing.T) {
	s := validSpec()
	s.Reservation, s.Dependency, s.MailType, s.MailUser = "maint", "afterok:1234:1235,singleton", "END,FAIL", "a.user@example.org"
	if err := s.Validate(); err != nil {
		t.Fatalf("valid options refused: %v", err)
	}
	script, err := Script(s, "", "dev", "x")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"#SBATCH --reservation=maint\n", "#SBATCH --dependency=afterok:1234:1235,singleton\n",
		"#SBATCH --mail-type=END,FAIL\n", "#SBATCH --mail-user=a.user@example.org\n",
		"#SBATCH --cpus-per-task=10\n", "#SBATCH --gres=gpu:4\n",
	} {
		if !strings.Contains(string(script), want) {
			t.Errorf("script lacks %q:\n%s", want, script)
		}
	}
	if strings.Contains(string(script), "--exclusive") || strings.Contains(string(script), "--qos") {
		t.Errorf("options at their zero value were written:\n%s", script)
	}
}

func TestEveryOptionHasAFlagAKeyAndAValidRule(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range Options() {
		if o.Key == "" || o.Flag == "" || o.Usage == "" || seen[o.Flag] {
			t.Errorf("option %+v: needs a unique flag, a key and a usage", o)
		}
		seen[o.Flag] = true
		var r Resources
		var zero any
		switch o.Kind {
		case reflect.String:
			zero = ""
		case reflect.Int:
			zero = 0
		case reflect.Bool:
			zero = false
		default:
			t.Errorf("option %s: kind %v cannot be a flag", o.Key, o.Kind)
			continue
		}
		if err := r.Set(o.Key, zero); err != nil {
			t.Errorf("Set(%s): %v", o.Key, err)
		}
		if got, ok := r.Get(o.Key); !ok || got != zero {
			t.Errorf("Get(%s) = %v, %v", o.Key, got, ok)
		}
	}
	var r Resources
	if err := r.Set("time", 5); err == nil {
		t.Error("Set(time, 5) accepted an int for a string option")
	}
	if err := CheckOption("nonsense", "x"); err == nil || !strings.Contains(err.Error(), "mail_type") {
		t.Errorf("unknown key: %v, want the known keys listed", err)
	}
}

// A 100 KB job name is not echoed whole: the error shows its start and
// its length.
func TestValidateClipsLongValues(t *testing.T) {
	s := JobSpec{Name: strings.Repeat("é", 50000) + "!", RunDir: "/tmp/r", NTasks: 1, Program: "/bin/true"}
	err := s.Validate()
	if err == nil {
		t.Fatal("a 100 KB job name was accepted")
	}
	if len(err.Error()) > 400 || !strings.Contains(err.Error(), "... (100001 bytes)") {
		t.Errorf("error of %d bytes: %.300q", len(err.Error()), err.Error())
	}
}
