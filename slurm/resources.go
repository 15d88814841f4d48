package slurm

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
)

// Resources is the one list of what a job asks the scheduler for. Every
// field is at once a profile key (toml tag), a flag of hpcrun submit (flag
// tag: its name, then its aliases; usage tag: its help), and an #SBATCH
// option of the job script (sbatch tag; the line is left out while the value
// is the zero value). The check tag names the rule in optionRules that its
// value must pass, in profiles, flags and scripts alike. Adding a scheduler
// option is one field here, and a rule in optionRules when none fits.
type Resources struct {
	CPUsPerTask int    `toml:"cpus_per_task" json:"cpus_per_task" sbatch:"cpus-per-task" flag:"cpus-per-task,c" check:"positive" usage:"CPUs a task"`
	Hint        string `toml:"hint" json:"hint,omitempty" sbatch:"hint" flag:"hint" check:"hint" usage:"Slurm hint, e.g. nomultithread; \"\" to leave it out"`
	Time        string `toml:"time" json:"time,omitempty" sbatch:"time" flag:"time,t" check:"time" usage:"time limit, e.g. 00:20:00 or 1-00:00:00"`
	QOS         string `toml:"qos" json:"qos,omitempty" sbatch:"qos" flag:"qos" check:"word" usage:"quality of service"`
	Account     string `toml:"account" json:"account,omitempty" sbatch:"account" flag:"account,A" check:"word" usage:"Slurm account (Jean Zay: name@a100)"`
	Partition   string `toml:"partition" json:"partition,omitempty" sbatch:"partition" flag:"partition,p" check:"word" usage:"Slurm partition, or a comma-separated list"`
	Constraint  string `toml:"constraint" json:"constraint,omitempty" sbatch:"constraint" flag:"constraint,C" check:"constraint" usage:"node features, e.g. a100 or v100&ib"`
	Exclusive   bool   `toml:"exclusive" json:"exclusive,omitempty" sbatch:"exclusive" flag:"exclusive" usage:"whole nodes only"`
	Reservation string `toml:"reservation" json:"reservation,omitempty" sbatch:"reservation" flag:"reservation" check:"word" usage:"run in this reservation"`
	Dependency  string `toml:"dependency" json:"dependency,omitempty" sbatch:"dependency" flag:"dependency,d" check:"dependency" usage:"start after other jobs, e.g. afterok:1234 or singleton"`
	MailType    string `toml:"mail_type" json:"mail_type,omitempty" sbatch:"mail-type" flag:"mail-type" check:"mail_type" usage:"mail events: NONE, BEGIN, END, FAIL, REQUEUE, ALL, TIME_LIMIT_90, ... comma-separated"`
	MailUser    string `toml:"mail_user" json:"mail_user,omitempty" sbatch:"mail-user" flag:"mail-user" check:"mail_user" usage:"address for --mail-type's mails"`
	// GPUsPerNode sizes the job (--nodes, --ntasks-per-node, --gres) rather
	// than landing on a line of its own.
	GPUsPerNode int `toml:"gpus_per_node" json:"gpus_per_node" flag:"gpus-per-node" check:"nonnegative" usage:"GPUs a node (0 for CPU nodes)"`
}

// Option describes one field of Resources.
type Option struct {
	Key     string       // profile key, e.g. "mail_type"
	Flag    string       // flag name, e.g. "mail-type"
	Aliases []string     // short flag names
	Usage   string       // the flag's help
	Sbatch  string       // the #SBATCH option without dashes; "" when it has no line of its own
	Kind    reflect.Kind // reflect.String, reflect.Int or reflect.Bool
	index   int
	check   string
}

var options = func() []Option {
	t := reflect.TypeOf(Resources{})
	out := make([]Option, t.NumField())
	for i := range out {
		f := t.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		names := strings.Split(f.Tag.Get("flag"), ",")
		out[i] = Option{Key: key, Flag: names[0], Aliases: names[1:], Usage: f.Tag.Get("usage"),
			Sbatch: f.Tag.Get("sbatch"), Kind: f.Type.Kind(), index: i, check: f.Tag.Get("check")}
		if _, ok := optionRules[out[i].check]; out[i].check != "" && !ok {
			panic("slurm: Resources." + f.Name + " names an unknown check " + out[i].check)
		}
	}
	return out
}()

// Options lists the fields of Resources, in the order their #SBATCH lines
// are written.
func Options() []Option { return append([]Option(nil), options...) }

func optionByKey(key string) (Option, bool) {
	for _, o := range options {
		if o.Key == key {
			return o, true
		}
	}
	return Option{}, false
}

var (
	wordRE       = regexp.MustCompile(`^[A-Za-z0-9_.,@-]+$`) // qos, account (Jean Zay's are name@a100), partition (a list)
	constrRE     = regexp.MustCompile(`^[A-Za-z0-9_.,&|*:!()\[\]-]+$`)
	hintRE       = regexp.MustCompile(`^[a-z_]+$`)
	dependencyRE = regexp.MustCompile(`^(singleton|[a-z]+(:[0-9_+]+)+)([,?](singleton|[a-z]+(:[0-9_+]+)+))*$`)
	mailTypeRE   = regexp.MustCompile(`^(NONE|BEGIN|END|FAIL|REQUEUE|ALL|INVALID_DEPEND|STAGE_OUT|TIME_LIMIT|TIME_LIMIT_90|TIME_LIMIT_80|TIME_LIMIT_50|ARRAY_TASKS)(,(NONE|BEGIN|END|FAIL|REQUEUE|ALL|INVALID_DEPEND|STAGE_OUT|TIME_LIMIT|TIME_LIMIT_90|TIME_LIMIT_80|TIME_LIMIT_50|ARRAY_TASKS))*$`)
	mailUserRE   = regexp.MustCompile(`^[A-Za-z0-9._%+-]+(@[A-Za-z0-9.-]+)?$`)
)

// optionRules are the checks a Resources field's check tag can name. A
// rule gets the value as a string (ints in decimal) and says what to write
// instead; "" always passes, since it leaves the option out.
var optionRules = map[string]func(key, v string) error{
	"word": func(key, v string) error {
		return match(wordRE, v, "%s %q: use letters, digits, '_', '.', ',', '@' or '-'", key, v)
	},
	"constraint": func(_, v string) error {
		return match(constrRE, v, "constraint %q: use a Slurm feature expression without spaces or quotes (e.g. a100 or v100&ib)", v)
	},
	"hint": func(_, v string) error {
		return match(hintRE, v, "hint %q: use a Slurm hint such as nomultithread, multithread, compute_bound or memory_bound", v)
	},
	"time": func(_, v string) error { return ValidateTime(v) },
	"dependency": func(_, v string) error {
		return match(dependencyRE, v, "dependency %q: use type:jobid[:jobid...] (after, afterok, afternotok, afterany, aftercorr, afterburstbuffer), several joined by ',' or '?', or singleton", v)
	},
	"mail_type": func(_, v string) error {
		return match(mailTypeRE, v, "mail_type %q: use NONE, BEGIN, END, FAIL, REQUEUE, ALL, TIME_LIMIT, TIME_LIMIT_90, TIME_LIMIT_80, TIME_LIMIT_50 or ARRAY_TASKS, comma-separated, in capitals", v)
	},
	"mail_user": func(_, v string) error {
		return match(mailUserRE, v, "mail_user %q: give one address, e.g. name@example.org", v)
	},
	"positive": func(key, v string) error {
		if n, err := strconv.Atoi(v); err != nil || n < 1 {
			return fmt.Errorf("%s = %s: must be at least 1", key, v)
		}
		return nil
	},
	"nonnegative": func(key, v string) error {
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			return fmt.Errorf("%s = %s: must be 0 or more", key, v)
		}
		return nil
	},
}

func match(re *regexp.Regexp, v, format string, args ...any) error {
	if v == "" || re.MatchString(v) {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// IsOption reports whether key is a profile key of Resources.
func IsOption(key string) bool {
	_, ok := optionByKey(key)
	return ok
}

// CheckOption checks the value v (a string, int or bool) of the Resources
// field whose profile key is key, with the rule its tag names. The config
// loader uses it, so a profile is refused with its file and line by the
// same rule the job script applies.
func CheckOption(key string, v any) error {
	o, ok := optionByKey(key)
	if !ok {
		return fmt.Errorf("%s: not a job option (known: %s)", key, optionKeys())
	}
	rule := optionRules[o.check]
	if rule == nil {
		return nil
	}
	s := fmt.Sprint(v)
	if o.Kind == reflect.String && s == "" {
		return nil
	}
	return rule(key, s)
}

func optionKeys() string {
	keys := make([]string, len(options))
	for i, o := range options {
		keys[i] = o.Key
	}
	return strings.Join(keys, ", ")
}

// Get returns the value of the field whose profile key is key.
func (r *Resources) Get(key string) (any, bool) {
	o, ok := optionByKey(key)
	if !ok {
		return nil, false
	}
	return reflect.ValueOf(r).Elem().Field(o.index).Interface(), true
}

// Set sets the field whose profile key is key to v, which must be of the
// field's kind (a string, int or bool).
func (r *Resources) Set(key string, v any) error {
	o, ok := optionByKey(key)
	if !ok {
		return fmt.Errorf("%s: not a job option (known: %s)", key, optionKeys())
	}
	f := reflect.ValueOf(r).Elem().Field(o.index)
	val := reflect.ValueOf(v)
	if val.Kind() != f.Kind() {
		return fmt.Errorf("%s: want a %s, got %T", key, f.Kind(), v)
	}
	f.Set(val.Convert(f.Type()))
	return nil
}

// Validate checks every field with its rule and returns one message a
// problem.
func (r Resources) Validate() []string {
	var errs []string
	v := reflect.ValueOf(r)
	for _, o := range options {
		if err := CheckOption(o.Key, v.Field(o.index).Interface()); err != nil {
			errs = append(errs, err.Error())
		}
	}
	return errs
}

// SbatchLines are the #SBATCH options the fields ask for, in field order:
// "--time=01:00:00", "--exclusive". Fields at their zero value, and those
// without an sbatch tag, give none.
func (r Resources) SbatchLines() []string {
	var lines []string
	v := reflect.ValueOf(r)
	for _, o := range options {
		if o.Sbatch == "" || v.Field(o.index).IsZero() {
			continue
		}
		if o.Kind == reflect.Bool {
			lines = append(lines, "--"+o.Sbatch)
			continue
		}
		lines = append(lines, fmt.Sprintf("--%s=%v", o.Sbatch, v.Field(o.index).Interface()))
	}
	return lines
}
