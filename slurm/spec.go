package slurm

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// JobSpec is everything the job script is made from. Values that reach an
// #SBATCH line are validated (sbatch does not parse them like a shell); values
// that reach the shell part of the script are shell-quoted when rendered.
type JobSpec struct {
	Name   string `json:"name"`    // --job-name
	RunDir string `json:"run_dir"` // absolute; output, error and cwd of the job
	NTasks int    `json:"ntasks"`  // total tasks (ranks)
	// Nodes and TasksPerNode spread the tasks explicitly (--nodes,
	// --ntasks-per-node); 0 for both sizes the job from GPUsPerNode (Size).
	Nodes        int `json:"nodes,omitempty"`
	TasksPerNode int `json:"ntasks_per_node,omitempty"`
	Resources
	Checkpoint bool              `json:"checkpoint,omitempty"`  // --signal=USR1@SignalSecs and --requeue
	SignalSecs int               `json:"signal_secs,omitempty"` // seconds before the time limit; 0 = 120
	Signal     string            `json:"signal,omitempty"`      // the time-limit signal: USR1 or USR2; "" = USR1
	Modules    []string          `json:"modules,omitempty"`     // module load, in order
	Env        map[string]string `json:"env,omitempty"`         // exported in the script, values literal
	Extra      []string          `json:"extra,omitempty"`       // extra #SBATCH options, e.g. "--comment=x"
	Program    string            `json:"program"`               // absolute path of the program srun starts
	Args       []string          `json:"args,omitempty"`        // its arguments
	// Array makes the job a job array (--array, e.g. "0-5%2"): one task a
	// point of a sweep, logs slurm-%A_%a.out/.err; "" for one job.
	Array string `json:"array,omitempty"`
}

// DefaultSignalSecs is how long before the time limit a checkpointing job is
// sent USR1 when the spec does not say.
const DefaultSignalSecs = 120

// Layout is how a job's tasks are spread over nodes.
type Layout struct {
	Nodes        int // --nodes
	TasksPerNode int // --ntasks-per-node
	GPUsPerNode  int // --gres=gpu:N; 0 on CPU-only profiles
}

// Size spreads ntasks over nodes of gpusPerNode GPUs, one task a GPU, as
// IDRIS's gpu_jobs_submitter does: fewer tasks than a node's GPUs fit on one
// node; more must fill whole nodes. gpusPerNode 0 (a CPU-only profile) puts
// every task on one node.
func Size(ntasks, gpusPerNode int) (Layout, error) {
	switch {
	case ntasks < 1:
		return Layout{}, fmt.Errorf("ntasks = %d: must be at least 1", ntasks)
	case gpusPerNode < 0:
		return Layout{}, fmt.Errorf("gpus_per_node = %d: must not be negative", gpusPerNode)
	case gpusPerNode == 0:
		return Layout{Nodes: 1, TasksPerNode: ntasks}, nil
	case ntasks < gpusPerNode:
		return Layout{Nodes: 1, TasksPerNode: ntasks, GPUsPerNode: ntasks}, nil
	case ntasks%gpusPerNode == 0:
		return Layout{Nodes: ntasks / gpusPerNode, TasksPerNode: gpusPerNode, GPUsPerNode: gpusPerNode}, nil
	}
	lo := ntasks / gpusPerNode * gpusPerNode
	return Layout{}, fmt.Errorf("ntasks %d does not fill whole nodes of %d GPUs: use fewer than %d tasks, or a multiple of %d (%d or %d)",
		ntasks, gpusPerNode, gpusPerNode, gpusPerNode, lo, lo+gpusPerNode)
}

// Layout is how the job's tasks are spread over nodes: as asked with Nodes
// and TasksPerNode (the same count on every node), else by Size.
func (s JobSpec) Layout() (Layout, error) {
	if s.Nodes == 0 && s.TasksPerNode == 0 {
		return Size(s.NTasks, s.GPUsPerNode)
	}
	n, tpn := s.Nodes, s.TasksPerNode
	switch {
	case s.NTasks < 1:
		return Layout{}, fmt.Errorf("ntasks = %d: must be at least 1", s.NTasks)
	case n < 0 || tpn < 0:
		return Layout{}, fmt.Errorf("nodes = %d, ntasks_per_node = %d: must not be negative", n, tpn)
	case tpn == 0 && s.NTasks%n != 0:
		return Layout{}, fmt.Errorf("ntasks %d over %d nodes: every node must run as many tasks; use a multiple of %d tasks", s.NTasks, n, n)
	case tpn == 0:
		tpn = s.NTasks / n
	case n == 0 && s.NTasks%tpn != 0:
		return Layout{}, fmt.Errorf("ntasks %d in nodes of %d tasks: use a multiple of %d tasks", s.NTasks, tpn, tpn)
	case n == 0:
		n = s.NTasks / tpn
	case n*tpn != s.NTasks:
		return Layout{}, fmt.Errorf("%d nodes x %d tasks a node = %d, but ntasks = %d", n, tpn, n*tpn, s.NTasks)
	}
	lay := Layout{Nodes: n, TasksPerNode: tpn}
	if s.GPUsPerNode > 0 {
		if tpn > s.GPUsPerNode {
			return Layout{}, fmt.Errorf("%d tasks a node, but nodes have %d GPUs (one task a GPU): use more nodes", tpn, s.GPUsPerNode)
		}
		lay.GPUsPerNode = tpn
	}
	return lay, nil
}

var (
	nameRE      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`)
	envNameRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	arrayRE     = regexp.MustCompile(`^\d+(-\d+(:\d+)?)?(,\d+(-\d+(:\d+)?)?)*(%\d+)?$`)
	sbatchPathB = " \t\r\n\"'\\%#$`"
)

// clipValue is a string value cut to its first 48 bytes (whole UTF-8
// characters) with its length, so that a 100 KB --name is not echoed whole;
// any other value as it is.
func clipValue(v any) any {
	str, ok := v.(string)
	if !ok || len(str) <= 64 {
		return v
	}
	cut := 48
	for cut > 0 && !utf8.RuneStart(str[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", str[:cut], len(str))
}

// Validate checks every field of s and returns one error naming each problem
// and what to change.
func (s JobSpec) Validate() error {
	var errs []string
	bad := func(format string, args ...any) {
		for i, a := range args {
			args[i] = clipValue(a)
		}
		errs = append(errs, fmt.Sprintf(format, args...))
	}
	if !nameRE.MatchString(s.Name) {
		bad("job name %q: use 1 to 128 letters, digits, '.', '_', '+' or '-', starting with a letter or digit", s.Name)
	}
	if !filepath.IsAbs(s.RunDir) {
		bad("run dir %q: must be an absolute path", s.RunDir)
	} else if strings.ContainsAny(s.RunDir, sbatchPathB) || hasControl(s.RunDir) {
		bad("run dir %q: #SBATCH --output cannot hold spaces, quotes, '%%', '#', '$', backslashes or control characters; choose another runs dir", s.RunDir)
	}
	if _, err := s.Layout(); err != nil {
		bad("%v", err)
	}
	errs = append(errs, s.Resources.Validate()...)
	if s.Checkpoint && (s.SignalSecs < 0 || s.SignalSecs > 65535) {
		bad("signal_secs = %d: use 0 (default %d) to 65535 seconds before the time limit", s.SignalSecs, DefaultSignalSecs)
	}
	switch s.Signal {
	case "", "USR1", "USR2":
	default:
		bad("signal %q: use USR1 or USR2", s.Signal)
	}
	for _, m := range s.Modules {
		if m == "" || strings.ContainsRune(m, 0) {
			bad("module %q: must be non-empty and hold no NUL byte", m)
		}
	}
	for k, v := range s.Env {
		if !envNameRE.MatchString(k) {
			bad("env name %q: use letters, digits and '_', not starting with a digit", k)
		}
		if strings.ContainsRune(v, 0) {
			bad("env %s: value holds a NUL byte", k)
		}
	}
	for _, x := range s.Extra {
		if !strings.HasPrefix(x, "-") || hasControl(x) {
			bad("extra #SBATCH option %q: must start with '-' and be one line without control characters", x)
		}
	}
	if s.Array != "" && !arrayRE.MatchString(s.Array) {
		bad("array %q: use task ids such as 0-7, 0-7%%2 or 1,3,5 (sbatch --array)", s.Array)
	}
	if !filepath.IsAbs(s.Program) {
		bad("program %q: must be an absolute path (the job starts it on the compute nodes)", s.Program)
	}
	if strings.ContainsRune(s.Program, 0) {
		bad("program %q: holds a NUL byte", s.Program)
	}
	for _, a := range s.Args {
		if strings.ContainsRune(a, 0) {
			bad("argument %q: holds a NUL byte", a)
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// SignalWarning says when the stop signal would come too early to be of
// use: with a time limit no longer than the signal's lead (--time 00:01:00
// and USR1@120), Slurm signals the job as soon as it starts, and again at
// every requeue, so it saves and requeues without training. "" when fine.
func (s JobSpec) SignalWarning() string {
	if !s.Checkpoint || s.Time == "" {
		return ""
	}
	limit, err := ParseTime(s.Time)
	if err != nil || limit <= 0 {
		return ""
	}
	lead := s.SignalSecs
	if lead == 0 {
		lead = DefaultSignalSecs
	}
	if limit > lead {
		return ""
	}
	sig := s.Signal
	if sig == "" {
		sig = "USR1"
	}
	return fmt.Sprintf("time limit %s (%d s) is not longer than the stop signal's lead (%s@%d): the job is told to save and stop as soon as it starts, at every requeue; raise --time or lower signal_secs", s.Time, limit, sig, lead)
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}

// ValidateTime checks a Slurm --time value: "" (the partition default),
// "UNLIMITED" or "INFINITE", or one of MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM,
// D-HH:MM:SS.
func ValidateTime(t string) error {
	if t == "" || t == "UNLIMITED" || t == "INFINITE" {
		return nil
	}
	if _, err := ParseTime(t); err != nil {
		return err
	}
	return nil
}

// ParseTime converts a Slurm time limit to seconds.
func ParseTime(t string) (int, error) {
	bad := fmt.Errorf("time %q: use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 01:30:00 or 2-00:00:00)", t)
	days := -1
	rest := t
	if d, r, ok := strings.Cut(t, "-"); ok {
		n, err := num(d, 1<<20)
		if err != nil {
			return 0, bad
		}
		days, rest = n, r
	}
	parts := strings.Split(rest, ":")
	var v [3]int
	for i, p := range parts {
		limit := 59
		if i == 0 {
			limit = 1 << 30
		}
		n, err := num(p, limit)
		if err != nil || len(parts) > 3 {
			return 0, bad
		}
		v[i] = n
	}
	var secs int
	switch {
	case days >= 0 && len(parts) == 1: // D-HH
		secs = days*86400 + v[0]*3600
	case days >= 0 && len(parts) == 2: // D-HH:MM
		secs = days*86400 + v[0]*3600 + v[1]*60
	case days >= 0: // D-HH:MM:SS
		secs = days*86400 + v[0]*3600 + v[1]*60 + v[2]
	case len(parts) == 1: // MM
		secs = v[0] * 60
	case len(parts) == 2: // MM:SS
		secs = v[0]*60 + v[1]
	default: // HH:MM:SS
		secs = v[0]*3600 + v[1]*60 + v[2]
	}
	if days >= 0 && v[0] > 23 {
		return 0, bad
	}
	if secs <= 0 {
		return 0, fmt.Errorf("time %q: must be more than zero", t)
	}
	return secs, nil
}

func num(s string, max int) (int, error) {
	if s == "" || len(s) > 10 {
		return 0, errors.New("empty")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, errors.New("not a number")
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > max {
		return 0, errors.New("out of range")
	}
	return n, nil
}
