package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/cmdline"
	"github.com/hpcrun/hpcrun/idrenv"
)

// setLauncherEnv clears every launcher variable of this process for the
// test, then sets kv.
func setLauncherEnv(t *testing.T, kv ...string) {
	t.Helper()
	for _, pair := range os.Environ() {
		k, _, _ := strings.Cut(pair, "=")
		if strings.HasPrefix(k, "SLURM") || strings.HasPrefix(k, "TORCHELASTIC_") ||
			k == "MASTER_PORT" || k == "MASTER_ADDR" || k == "CUDA_VISIBLE_DEVICES" {
			t.Setenv(k, "") // restores the value after the test
			os.Unsetenv(k)
		}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		t.Setenv(kv[i], kv[i+1])
	}
}

var twoNodeStep = []string{
	"SLURM_JOB_ID", "4242",
	"SLURM_STEP_NODELIST", "jz[001-002]",
	"SLURM_STEP_TASKS_PER_NODE", "2,1",
	"SLURM_STEP_NUM_TASKS", "3",
	"SLURM_PROCID", "2",
	"SLURM_LOCALID", "0",
	"SLURM_NODEID", "1",
	"CUDA_VISIBLE_DEVICES", "3",
}

func runApp(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	app.ErrWriter = &out
	err := app.Run(cmdline.Interspersed(app, append([]string{"hpcrun"}, args...)))
	return out.String(), err
}

func TestEnvCommandJSON(t *testing.T) {
	setLauncherEnv(t, twoNodeStep...)
	for _, args := range [][]string{{"env", "--json"}, {"--json", "env"}} {
		out, err := runApp(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		var e idrenv.Env
		if err := json.Unmarshal([]byte(out), &e); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		if e.Source != idrenv.SlurmStep || e.Rank != 2 || e.WorldSize != 3 || e.LocalWorldSize != 1 ||
			e.Node != "jz002" || e.MasterAddr != "jz001" || e.MasterPort != idrenv.PortBase+4242 || e.GPU != 0 {
			t.Errorf("%v: got %+v", args, e)
		}
	}
}

func TestEnvCommandText(t *testing.T) {
	setLauncherEnv(t, twoNodeStep...)
	out, err := runApp(t, "env", "--master-port", "31000")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"source            slurm-step\n",
		"rank              2\n",
		"nodes             jz001,jz002\n",
		"tasks_per_node    2,1\n",
		"master_addr       jz001\n",
		"master_port       31000\n",
		"is_master         false\n",
		"gpu               0 (launcher lists 3)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestEnvCommandErrors(t *testing.T) {
	setLauncherEnv(t, append(twoNodeStep, "SLURM_PROCID", "3")...)
	_, err := runApp(t, "env")
	if err == nil || !strings.Contains(err.Error(), "SLURM_PROCID=3") {
		t.Errorf("rank beyond world: error %v, want one naming SLURM_PROCID=3", err)
	}
	setLauncherEnv(t)
	if _, err := runApp(t, "env", "extra"); err == nil {
		t.Error("env with an argument: no error")
	}
}
