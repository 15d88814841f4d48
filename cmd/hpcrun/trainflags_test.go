package main

import (
	"flag"
	"reflect"
	"strconv"
	"strings"
	"testing"

	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/urfave/cli/v2"
)

// TestEveryTrainFlagSetsItsField: each training flag lands in the
// trainconfig.Config field of the same TOML name, and every such field but the
// preset has a flag.
func TestEveryTrainFlagSetsItsField(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var args []string
	for _, f := range trainFlags() {
		if err := f.Apply(fs); err != nil {
			t.Fatal(err)
		}
		name := f.Names()[0]
		switch f.(type) {
		case *cli.StringFlag:
			args = append(args, "--"+name, "v-"+name)
		case *cli.BoolFlag:
			args = append(args, "--"+name+"=false") // the defaults are true
		default:
			args = append(args, "--"+name, "7")
		}
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	c := cli.NewContext(cli.NewApp(), fs, nil)
	cfg := trainconfig.DefaultConfig()
	if err := applyTrainFlags(c, &cfg); err == nil || !strings.Contains(err.Error(), "preset") {
		// "v-preset" is no preset: the one error applyTrainFlags gives.
		t.Fatalf("applyTrainFlags with a bad preset: %v", err)
	}
	fs.Set("preset", "tiny")
	if err := applyTrainFlags(c, &cfg); err != nil {
		t.Fatal(err)
	}
	v := reflect.ValueOf(cfg)
	for i := 0; i < v.NumField(); i++ {
		key, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("toml"), ",")
		if key == "" || key == "preset" {
			continue
		}
		name := strings.ReplaceAll(key, "_", "-")
		want := any(7)
		switch v.Field(i).Kind() {
		case reflect.String:
			want = "v-" + name
		case reflect.Int64:
			want = int64(7)
		case reflect.Float64:
			want = 7.0
		case reflect.Bool:
			want = false
		}
		if got := v.Field(i).Interface(); got != want {
			t.Errorf("--%s set %s to %v, want %v (no flag for it?)", name, v.Type().Field(i).Name, got, want)
		}
	}
}

// TestRunHelpSaysWhatTheCodeDoes runs hpcrun run --help: its default beta2
// of each model is the one trainconfig.Config.Adam gives (it said nothing
// of llama), the clipping is stated as ClipNorm applies it and the
// validation split as the data's preparation takes it (a tenth, rounded
// down, at least one).
func TestRunHelpSaysWhatTheCodeDoes(t *testing.T) {
	out, err := runApp(t, "run", "--help")
	if err != nil {
		t.Fatal(err)
	}
	line := func(flag string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "--"+flag+" ") {
				return l
			}
		}
		t.Fatalf("run --help has no --%s:\n%s", flag, out)
		return ""
	}
	beta2 := line("adam-beta2")
	_, defaults, ok := strings.Cut(beta2, "(0 = ")
	defaults, _, _ = strings.Cut(defaults, ")")
	said := map[string]string{} // model -> the beta2 the help gives it
	for _, part := range strings.Split(defaults, ", ") {
		value, models, found := strings.Cut(part, " for ")
		if !ok || !found {
			t.Fatalf("--adam-beta2's defaults: %q", beta2)
		}
		for _, m := range strings.Split(models, " and ") {
			said[m] = value
		}
	}
	for _, model := range []string{"bert", "gpt", "llama"} {
		_, b2, _ := trainconfig.Config{Model: model}.Adam()
		if want := strconv.FormatFloat(b2, 'g', -1, 64); said[model] != want {
			t.Errorf("run --help gives %s beta2 %q, the code %s: %q", model, said[model], want, beta2)
		}
	}
	for flag, want := range map[string]string{
		"grad-clip":    "C/(norm+1e-6)",
		"eval-samples": "last max(1, windows/10) windows (divisions rounded down)",
	} {
		if l := line(flag); !strings.Contains(l, want) {
			t.Errorf("--%s: %q lacks %q", flag, l, want)
		}
	}
}
