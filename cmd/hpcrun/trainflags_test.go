package main

import (
	"flag"
	"reflect"
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
