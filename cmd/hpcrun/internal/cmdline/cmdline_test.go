package cmdline

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// testApp has a global --json and --profile, a command taking an argument
// (show), one taking none (submit, with --preset and --ntasks) and one whose
// arguments are not flags (raw); --dp means --ntasks and --preset together,
// --world-size a --nosuch the app lacks, else --ntasks.
func testApp(out *bytes.Buffer, got *[]string) *cli.App {
	global := func() []cli.Flag {
		return []cli.Flag{&cli.BoolFlag{Name: "json"}, &cli.StringFlag{Name: "profile"}}
	}
	record := func(c *cli.Context) error {
		*got = append(*got, c.Command.Name, "profile="+c.String("profile"), "preset="+c.String("preset"))
		*got = append(*got, c.Args().Slice()...)
		return nil
	}
	app := &cli.App{Name: "hp", EnableBashCompletion: true, Writer: out, ErrWriter: out, ExitErrHandler: func(*cli.Context, error) {}, Flags: global(),
		Commands: []*cli.Command{
			{Name: "show", ArgsUsage: "<execid>", Flags: []cli.Flag{&cli.BoolFlag{Name: "plot"}, &cli.StringFlag{Name: "png"}}, Action: record},
			{Name: "submit", Flags: []cli.Flag{&cli.StringFlag{Name: "preset"}, &cli.IntFlag{Name: "ntasks"}}, Action: record},
			{Name: "raw", SkipFlagParsing: true, Action: record},
		}}
	OneDefault()
	InheritFlags(app.Commands, global)
	Strict(app, func(cmd *cli.Command, arg string) string {
		if arg == "tiny" && HasFlag(cmd, "preset") {
			return "did you mean --preset tiny?"
		}
		return ""
	}, Meanings{
		"dp":         {{Flags: []string{"ntasks", "preset"}, Note: "dp comes from --ntasks"}},
		"world-size": {{Flags: []string{"nosuch"}}, {Flags: []string{"ntasks"}}},
	})
	CompleteRuns(app.Commands, func(c *cli.Context, sweeps bool) []string { return []string{"e1", "e2"} })
	return app
}

func TestInterspersed(t *testing.T) {
	var out bytes.Buffer
	var got []string
	app := testApp(&out, &got)
	for _, tc := range []struct{ in, want string }{
		{"show X --plot", "show --plot X"},
		{"--json show X --png a.png", "--json show --png a.png X"},
		{"show X --png=a.png", "show --png=a.png X"},
		{"show X -- --plot", "show X -- --plot"},
		{"raw X --plot", "raw X --plot"},
		{"show X --nosuch Y", "show --nosuch X Y"},
		{"", ""},
	} {
		in := append([]string{"hp"}, strings.Fields(tc.in)...)
		want := append([]string{"hp"}, strings.Fields(tc.want)...)
		if got := Interspersed(app, in); !slices.Equal(got, want) {
			t.Errorf("%q: got %q, want %q", tc.in, strings.Join(got[1:], " "), tc.want)
		}
	}
}

func TestJSONAsked(t *testing.T) {
	for args, want := range map[string]bool{"--json show": true, "show -json=true": true, "show -- --json": false, "show": false} {
		if got := JSONAsked(strings.Fields(args)); got != want {
			t.Errorf("%q: %v", args, got)
		}
	}
}

// TestStrictAndInherit runs the app: a global flag given after the command
// reaches it, a stray argument and an unknown flag are one-line errors; a
// flag is suggested by meaning where the command has the flags meant,
// else by spelling when one is near, never as a one-letter alias.
func TestStrictAndInherit(t *testing.T) {
	var out bytes.Buffer
	var got []string
	app := testApp(&out, &got)
	if err := app.Run(Interspersed(app, strings.Fields("hp --profile jz submit --preset small"))); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, " ") != "submit profile=jz preset=small" {
		t.Errorf("ran %q", got)
	}
	for _, tc := range []struct{ args, want string }{
		{"hp submit tiny", `submit takes no arguments, got "tiny": did you mean --preset tiny?`},
		{"hp submit other", `submit takes no arguments, got "other" (see hp submit --help)`},
		{"hp submit --ntask 2", "flag provided but not defined: -ntask: did you mean --ntasks? (see hp submit --help)"},
		{"hp submit --dp 2", "flag provided but not defined: -dp: dp comes from --ntasks (see hp submit --help)"},
		{"hp submit --world_size 2", "flag provided but not defined: -world_size: did you mean --ntasks? (see hp submit --help)"},
		{"hp show --dp 2", "flag provided but not defined: -dp (see hp show --help)"},
		{"hp submit --xyz 2", "flag provided but not defined: -xyz (see hp submit --help)"},
		{"hp --profil jz submit", "flag provided but not defined: -profil: did you mean --profile? (see hp --help)"},
	} {
		err := app.Run(strings.Fields(tc.args))
		var exit cli.ExitCoder
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || err.Error() != tc.want {
			t.Errorf("%s: %v, want exit 2 with %q", tc.args, err, tc.want)
		}
	}
}

func TestCompleteRunsAndDefaults(t *testing.T) {
	var out bytes.Buffer
	var got []string
	app := testApp(&out, &got)
	saved := os.Args
	defer func() { os.Args = saved }()
	os.Args = []string{"hp", "show", "--generate-bash-completion"}
	if err := app.Run(os.Args); err != nil {
		t.Fatal(err)
	}
	if out.String() != "e1\ne2\n" {
		t.Errorf("completion of show: %q", out.String())
	}
	f := &cli.IntFlag{Name: "nodes", Usage: "nodes (0 = from the profile)"}
	if s := cli.FlagStringer(f); strings.Contains(s, "(default: 0)") {
		t.Errorf("help of a flag with its own default: %q", s)
	}
	if !strings.Contains(BashCompletion, "--generate-bash-completion") || !strings.Contains(ZshCompletion, "#compdef hpcrun") {
		t.Error("completion scripts")
	}
}
