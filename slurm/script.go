package slurm

import (
	"bytes"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/hpcrun/hpcrun/templates"
)

// ScriptData is what the sbatch template is executed with. Fields used on
// #SBATCH lines are validated values; RunDirQ, Command, Modules and Env values
// are shell-quoted words, safe to paste into the shell part of the script.
type ScriptData struct {
	Version, ExecID string
	Name            string
	RunDir          string // validated: no spaces, quotes, '%' or control characters
	RunDirQ         string // RunDir, shell-quoted
	Layout
	// GPUsPerNode is the layout's (--gres), not the profile's request.
	GPUsPerNode int
	Resources            // each value validated; .Time, .QOS, ... for user templates
	Options     []string // Resources as whole #SBATCH options, e.g. "--time=01:00:00"
	Array       string   // sbatch --array; "" for one job
	Checkpoint  bool
	SignalSecs  int
	Signal      string   // USR1 or USR2
	Extra       []string // whole #SBATCH options, validated
	Modules     []string // shell-quoted module names
	Env         []EnvVar // sorted by name
	Command     string   // program and arguments, each shell-quoted
}

// EnvVar is one export of the job script; Value is shell-quoted.
type EnvVar struct{ Name, Value string }

// Script renders the job script for s from the template source tmpl ("" =
// the built-in templates.Sbatch). version and execID only go into a comment.
func Script(s JobSpec, tmpl, version, execID string) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	lay, _ := s.Layout()
	d := ScriptData{
		Version: oneLine(version), ExecID: oneLine(execID),
		Name: s.Name, RunDir: s.RunDir, RunDirQ: Quote(s.RunDir), Layout: lay, GPUsPerNode: lay.GPUsPerNode,
		Resources: s.Resources, Options: s.Resources.SbatchLines(),
		Checkpoint: s.Checkpoint, SignalSecs: s.SignalSecs, Extra: s.Extra, Array: s.Array,
	}
	if d.Signal = s.Signal; d.Signal == "" {
		d.Signal = "USR1"
	}
	if d.Checkpoint && d.SignalSecs == 0 {
		d.SignalSecs = DefaultSignalSecs
	}
	for _, m := range s.Modules {
		d.Modules = append(d.Modules, Quote(m))
	}
	names := make([]string, 0, len(s.Env))
	for k := range s.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		d.Env = append(d.Env, EnvVar{Name: k, Value: Quote(s.Env[k])})
	}
	words := []string{Quote(s.Program)}
	for _, a := range s.Args {
		words = append(words, Quote(a))
	}
	d.Command = strings.Join(words, " ")

	name := "sbatch.tmpl"
	if tmpl == "" {
		tmpl = templates.Sbatch
	} else {
		name = "user template"
	}
	t, err := template.New(name).Option("missingkey=error").Funcs(template.FuncMap{"quote": Quote}).Parse(tmpl)
	if err != nil {
		return nil, fmt.Errorf("sbatch template: %w", err)
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, d); err != nil {
		return nil, fmt.Errorf("sbatch template: %w", err)
	}
	return buf.Bytes(), nil
}

// ReadTemplate reads a user template file and checks that it parses.
func ReadTemplate(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("sbatch template: %w", err)
	}
	if _, err := template.New(path).Funcs(template.FuncMap{"quote": Quote}).Parse(string(b)); err != nil {
		return "", fmt.Errorf("sbatch template %s: %w", path, err)
	}
	return string(b), nil
}

// Quote returns s as one POSIX shell word that the shell reads back as s,
// byte for byte: nothing inside is expanded or run.
func Quote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./=:,+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func oneLine(s string) string {
	return strconv.Quote(s)[1 : len(strconv.Quote(s))-1]
}
