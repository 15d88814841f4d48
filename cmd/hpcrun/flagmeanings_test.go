package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestFlagSuggestions runs commands as typed with a flag hpcrun spells
// otherwise: it is answered by meaning where the command has the flags
// meant (--dp got -d, --dependency; --batch-size -c; --gpus --gpu), by
// spelling otherwise, and by nothing when no flag is near.
func TestFlagSuggestions(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"submit --dp 2", "-dp: dp is not a flag: it comes from --ntasks / (--tp x --pp) (see hpcrun submit --help)"},
		{"plan --dp=4", "-dp: dp is not a flag: it comes from --ntasks / (--tp x --pp) (see hpcrun plan --help)"},
		{"run --data-parallel 2", "-data-parallel: dp is not a flag: it comes from --ntasks / (--tp x --pp) (see hpcrun run --help)"},
		{"submit --batch-size 8", "-batch-size: did you mean --bsz? (see hpcrun submit --help)"},
		{"run --batch_size 8", "-batch_size: did you mean --bsz? (see hpcrun run --help)"},
		{"eval x --batch-size 8", "-batch-size: did you mean --bsz? (see hpcrun eval --help)"},
		{"submit --gpus 4", "-gpus: did you mean --gpus-per-node? (see hpcrun submit --help)"},
		{"plan --gpus 4", "-gpus: did you mean --gpus-per-node? (see hpcrun plan --help)"},
		{"bench step --gpus 1", "-gpus: did you mean --gpu? (see hpcrun bench step --help)"},
		{"submit --tensor-parallel 2", "-tensor-parallel: did you mean --tp? (see hpcrun submit --help)"},
		{"plan --tensor-model-parallel-size 2", "-tensor-model-parallel-size: did you mean --tp? (see hpcrun plan --help)"},
		{"submit --world-size 8", "-world-size: did you mean --ntasks? (see hpcrun submit --help)"},
		{"eval x --world-size 2", "-world-size: did you mean --nproc? (see hpcrun eval --help)"},
		{"run --nproc-per-node 4", "-nproc-per-node: did you mean --nproc? (see hpcrun run --help)"},
		{"submit --nnodes 2", "-nnodes: did you mean --nodes? (see hpcrun submit --help)"},
		{"submit --learning-rate 1e-3", "-learning-rate: did you mean --lr? (see hpcrun submit --help)"},
		{"submit --ntask 4", "-ntask: did you mean --ntasks? (see hpcrun submit --help)"},
		{"run --bsize 4", "-bsize: did you mean --bsz? (see hpcrun run --help)"},
		{"submit --gpus-per-task 1", "-gpus-per-task: hpcrun runs one task a GPU: give a node's GPUs with --gpus-per-node (see hpcrun submit --help)"},
		{"submit --gres gpu:4", "-gres: did you mean --gpus-per-node? (see hpcrun submit --help)"},
		{"submit --cpu-per-task 4", "-cpu-per-task: did you mean --cpus-per-task? (see hpcrun submit --help)"},
		{"submit --xyzzy 1", "-xyzzy (see hpcrun submit --help)"},
		{"submit --job-name x", "-job-name: did you mean --name? (see hpcrun submit --help)"},
	} {
		_, err := runApp(t, strings.Fields(tc.args)...)
		var exit cli.ExitCoder
		if want := "flag provided but not defined: " + tc.want; !errors.As(err, &exit) || exit.ExitCode() != 2 || err.Error() != want {
			t.Errorf("hpcrun %s: %v, want exit 2 with %q", tc.args, err, want)
		}
	}
}

// TestFlagMeaningsNameRealFlags: every flag the table means is a flag of
// some command, and no name it answers for is one, so that renaming a
// flag cannot leave an entry that never applies.
func TestFlagMeaningsNameRealFlags(t *testing.T) {
	flags := map[string]bool{}
	var walk func(cmds []*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, c := range cmds {
			for _, f := range c.Flags {
				for _, n := range f.Names() {
					flags[n] = true
				}
			}
			walk(c.Subcommands)
		}
	}
	walk(newApp().Commands)
	for name, means := range flagMeanings {
		if flags[name] {
			t.Errorf("%s is a flag of a command, not another tool's name for one", name)
		}
		for _, m := range means {
			for _, f := range m.Flags {
				if !flags[f] {
					t.Errorf("%s means --%s, which no command has", name, f)
				}
			}
		}
	}
}
