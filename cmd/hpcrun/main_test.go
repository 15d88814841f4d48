package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func TestHelpListsEveryCommand(t *testing.T) {
	out, err := runApp(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"submit", "queue", "cancel", "logs", "metrics", "train", "check", "bench", "ckpt", "env", "config", "completion"} {
		if !strings.Contains(out, "   "+name) {
			t.Errorf("--help does not list %q:\n%s", name, out)
		}
	}
}

func TestEveryCommandHasHelp(t *testing.T) {
	var walk func(prefix []string, cmds []*cli.Command)
	walk = func(prefix []string, cmds []*cli.Command) {
		for _, c := range cmds {
			args := append(append([]string{}, prefix...), c.Name)
			if c.Usage == "" {
				t.Errorf("%v has no usage line", args)
			}
			if c.SkipFlagParsing {
				continue // a pending command: it only says it is not implemented
			}
			out, err := runApp(t, append(args, "--help")...)
			if err != nil || !strings.Contains(out, "USAGE") {
				t.Errorf("%v --help: err=%v\n%s", args, err, out)
			}
			walk(args, c.Subcommands)
		}
	}
	walk(nil, newApp().Commands)
}

func TestPendingCommandFails(t *testing.T) {
	for _, c := range newApp().Commands {
		if !c.SkipFlagParsing {
			continue
		}
		_, err := runApp(t, c.Name)
		var exit cli.ExitCoder
		if err == nil || !strings.Contains(err.Error(), "not implemented") {
			t.Errorf("%s: err = %v, want a not-implemented error", c.Name, err)
		} else if ok := asExit(err, &exit); !ok || exit.ExitCode() == 0 {
			t.Errorf("%s: exit code 0", c.Name)
		}
	}
}

func asExit(err error, target *cli.ExitCoder) bool {
	e, ok := err.(cli.ExitCoder)
	if ok {
		*target = e
	}
	return ok
}

func TestConfigShowExampleProfile(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	example, _ := filepath.Abs("../../examples/jean-zay.toml")
	out, err := runApp(t, "config", "show", "--config", example, "--profile", "jz-v100")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`profile                      = "jz-v100"`,
		`profile.partition            = "gpu_p13"`,
		`# flag --profile`,
		`jean-zay.toml:26`,
		`profile.cpus_per_task        = 10`,
		`train.precision              = "bf16"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("config show lacks %q:\n%s", want, out)
		}
	}
	out, err = runApp(t, "--json", "--config", example, "config", "show")
	if err != nil {
		t.Fatal(err)
	}
	var entries []struct{ Key, Source string }
	if err := json.Unmarshal([]byte(out), &entries); err != nil || len(entries) < 10 {
		t.Fatalf("config show --json: %v\n%s", err, out)
	}
}

// TestConfigShowLlamaDefaults: config show of a Llama prints the values a
// run uses where the config leaves the default (it printed norm_eps 0,
// rope_theta 0, comm_timeout "" and recompute "").
func TestConfigShowLlamaDefaults(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	conf := filepath.Join(t.TempDir(), "hpcrun.toml")
	if err := os.WriteFile(conf, []byte("[train]\nmodel = \"llama\"\nlayers = 2\ndim = 96\nheads = 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runApp(t, "config", "show", "--config", conf)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"train.norm_eps", "= 1e-05", "train.rope_theta", "= 10000", "train.kv_heads", "train.ffn", "= 256",
		"train.comm_timeout", `= "30s"`, "train.recompute", `= "none"`} {
		if !strings.Contains(out, want) {
			t.Errorf("config show of a llama lacks %q:\n%s", want, out)
		}
	}
	if regexp.MustCompile(`train\.(comm_timeout|recompute) += ""`).MatchString(out) {
		t.Errorf("config show prints an empty default:\n%s", out)
	}
	if bad := regexp.MustCompile(`train\.(norm_eps|rope_theta|kv_heads|ffn) += 0 `).FindString(out); bad != "" {
		t.Errorf("config show prints %q, not the default a run uses", bad)
	}
}

func TestMalformedConfigNamesLine(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	dir := t.TempDir()
	bad := filepath.Join(dir, "hpcrun.toml")
	os.WriteFile(bad, []byte("default_profile = \"x\"\n[profiles.x]\ngpus_per_node = 4\ncpus_per_task = \"many\"\n"), 0o644)
	_, err := runApp(t, "--config", bad, "config", "show")
	if err == nil || !strings.Contains(err.Error(), "hpcrun.toml:4") || !strings.Contains(err.Error(), "cpus_per_task") {
		t.Fatalf("err = %v, want file:4 and the key", err)
	}
}

func TestCompletion(t *testing.T) {
	out, err := runApp(t, "completion", "bash")
	if err != nil || !strings.Contains(out, "complete -o default -F _hpcrun_complete hpcrun") {
		t.Fatalf("completion bash: %v\n%s", err, out)
	}
	if _, err := runApp(t, "completion", "fish"); err == nil {
		t.Fatal("completion fish: no error")
	}
}

// TestHelpNamesLlama: the commands that take a Llama say so in their help
// (generate, eval and ckpt export named only GPT-2 and BERT).
func TestHelpNamesLlama(t *testing.T) {
	for _, cmd := range [][]string{{"generate"}, {"eval"}, {"ckpt", "export"}} {
		out, err := runApp(t, append(cmd, "--help")...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "Llama") {
			t.Errorf("%v --help does not name Llama:\n%s", cmd, out)
		}
	}
}
