package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLayersAndSources(t *testing.T) {
	dir := t.TempDir()
	user := write(t, dir, "user.toml", `
default_profile = "jz"
[profiles.jz]
account = "abc@a100"
partition = "gpu_p5"
gpus_per_node = 8
[train]
tp = 2
`)
	project := write(t, dir, "project.toml", `
[profiles.jz]
partition = "gpu_p13"   # overrides the user file
gpus_per_node = 4
modules = ["pytorch-gpu/py3/2.4.0"]
env = { OMP_NUM_THREADS = "8" }
`)
	r, err := Load(Options{
		UserFile:    user,
		ProjectFile: project,
		Getenv:      env(map[string]string{"HPCRUN_QOS": "qos_gpu-dev", "HPCRUN_TRAIN_LAYERS": "6"}),
		RunsDir:     "elsewhere",
	})
	if err != nil {
		t.Fatal(err)
	}
	p := r.Profile
	if r.ProfileName != "jz" || p.Account != "abc@a100" || p.Partition != "gpu_p13" || p.GPUsPerNode != 4 || p.QOS != "qos_gpu-dev" {
		t.Errorf("profile = %s %+v", r.ProfileName, p)
	}
	if p.CPUsPerTask != 1 || p.Executor != "auto" {
		t.Errorf("profile defaults not applied: %+v", p)
	}
	if r.Train.TP != 2 || r.Train.Layers != 6 || r.Train.Model != "bert" {
		t.Errorf("train = %+v", r.Train)
	}
	if r.RunsDir != "elsewhere" {
		t.Errorf("runs_dir = %q", r.RunsDir)
	}
	wantSources := map[string]string{
		"profiles.jz.account":             user + ":4",
		"profiles.jz.partition":           project + ":3",
		"profiles.jz.env.OMP_NUM_THREADS": project + ":6",
		"profiles.jz.modules":             project + ":5",
		"profiles.jz.qos":                 "env HPCRUN_QOS",
		"train.tp":                        user + ":8",
		"train.layers":                    "env HPCRUN_TRAIN_LAYERS",
		"runs_dir":                        "flag --runs-dir",
		"profile":                         user + ":2",
	}
	for k, want := range wantSources {
		if got := r.Sources[k]; got != want {
			t.Errorf("source of %s = %q, want %q", k, got, want)
		}
	}
	entries := map[string]Entry{}
	for _, e := range r.Entries() {
		entries[e.Key] = e
	}
	if e := entries["profile.partition"]; e.Value != "gpu_p13" || e.Source != project+":3" {
		t.Errorf("entry profile.partition = %+v", e)
	}
	if e := entries["profile.cpus_per_task"]; e.Source != "default" {
		t.Errorf("entry profile.cpus_per_task = %+v", e)
	}
}

func TestProfileChoice(t *testing.T) {
	dir := t.TempDir()
	project := write(t, dir, "p.toml", "default_profile = \"a\"\n[profiles.a]\n[profiles.b]\n")
	for _, tc := range []struct {
		flag, env, want, source string
	}{
		{"", "", "a", project + ":1"},
		{"", "b", "b", "env HPCRUN_PROFILE"},
		{"local", "b", "local", "flag --profile"},
	} {
		r, err := Load(Options{UserFile: "-", ProjectFile: project, Profile: tc.flag, Getenv: env(map[string]string{"HPCRUN_PROFILE": tc.env})})
		if err != nil {
			t.Fatal(err)
		}
		if r.ProfileName != tc.want || r.Sources["profile"] != tc.source {
			t.Errorf("flag=%q env=%q: got %s from %s, want %s from %s", tc.flag, tc.env, r.ProfileName, r.Sources["profile"], tc.want, tc.source)
		}
	}
}

func TestErrorsNameFileLineAndKey(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string // substrings of the error
	}{
		{"syntax", "default_profile = \"a\"\n[profiles.a\n", []string{":2:", "table name"}},
		{"unknown top key", "runs_dir = \"r\"\nrundir = \"x\"\n", []string{":2:", `unknown key "rundir"`, "runs_dir"}},
		{"unknown profile key", "[profiles.jz]\nacount = \"x\"\n", []string{":2:", `"profiles.jz.acount"`, "account"}},
		{"unknown train key", "[train]\nlayer = 3\n", []string{":2:", `"train.layer"`, "layers"}},
		{"type", "[profiles.jz]\ngpus_per_node = \"four\"\n", []string{":2:", "gpus_per_node", "wrong type"}},
		{"type train", "[train]\n\ntp = 1.5\n", []string{":3:", "train.tp"}},
		{"bad executor", "[profiles.jz]\n\n\nexecutor = \"pbs\"\n", []string{":4:", "executor", "slurm, local or auto"}},
		{"bad time", "[profiles.jz]\ntime = \"1 hour\"\n", []string{":2:", "time", "HH:MM:SS"}},
		{"negative gpus", "[profiles.jz]\ngpus_per_node = -1\n", []string{":2:", "gpus_per_node"}},
		{"zero cpus", "[profiles.jz]\ncpus_per_task = 0\n", []string{":2:", "cpus_per_task"}},
		{"bad env name", "[profiles.jz]\nenv = { \"A B\" = \"x\" }\n", []string{":2:", "environment variable name"}},
		{"injection in account", "[profiles.jz]\naccount = \"a; rm -rf /\"\n", []string{":2:", "account"}},
		{"extra not an option", "[profiles.jz]\nsbatch_extra = [\"mail-type=END\"]\n", []string{":2:", "--mail-type=END"}},
		{"bad profile name", "[profiles.\"a b\"]\ntime = \"10\"\n", []string{"profile name"}},
		{"undefined default", "default_profile = \"nope\"\n", []string{`profile "nope"`, "defined profiles: local"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := write(t, t.TempDir(), "hpcrun.toml", tc.text)
			_, err := Load(Options{UserFile: "-", ProjectFile: p, Getenv: env(nil)})
			if err == nil {
				t.Fatalf("no error for %q", tc.text)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error has several lines: %q", msg)
			}
			for _, w := range append([]string{}, tc.want...) {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestMissingConfigFlagFile(t *testing.T) {
	_, err := Load(Options{UserFile: "-", ProjectFile: filepath.Join(t.TempDir(), "nope.toml"), Getenv: env(nil)})
	if err == nil || !strings.Contains(err.Error(), "--config") {
		t.Fatalf("err = %v", err)
	}
}

func TestEnvErrors(t *testing.T) {
	for k, v := range map[string]string{"HPCRUN_GPUS_PER_NODE": "x", "HPCRUN_TIME": "soon", "HPCRUN_TRAIN_TP": "two"} {
		_, err := Load(Options{UserFile: "-", Getenv: env(map[string]string{k: v})})
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: err = %v", k, v, err)
		}
	}
}

func TestExamplesLoad(t *testing.T) {
	files, _ := filepath.Glob("../../../../examples/*.toml")
	if len(files) == 0 {
		t.Skip("no example profiles found")
	}
	for _, f := range files {
		if _, err := Load(Options{UserFile: "-", ProjectFile: f, Getenv: env(nil)}); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestKeyLine(t *testing.T) {
	text := "a = 1 # [x]\n[profiles.jz]\n  account = \"x#y\"\nenv = { A = \"1\" }\n[\"train\"]\ntp = 2\n"
	for key, want := range map[string]int{
		"a": 1, "profiles.jz": 2, "profiles.jz.account": 3, "profiles.jz.env.A": 4, "train.tp": 6, "nope": 0,
	} {
		if got := keyLine(text, strings.Split(key, ".")); got != want {
			t.Errorf("keyLine(%s) = %d, want %d", key, got, want)
		}
	}
}

func FuzzLoad(f *testing.F) {
	f.Add("[profiles.x]\ntime = \"10\"\n")
	f.Add("default_profile = \"x\"\n[profiles.x]\nenv = { A = \"1\" }\n[train]\ntp = 2\n")
	f.Add("[profiles.x\n")
	f.Fuzz(func(t *testing.T, text string) {
		p := filepath.Join(t.TempDir(), "f.toml")
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := Load(Options{UserFile: "-", ProjectFile: p, Getenv: env(nil)})
		if err == nil {
			_ = r.Entries()
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("multi-line error: %q", err)
		}
	})
}
