package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/hpcrun/hpcrun/slurm"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
)

var typeErrRE = regexp.MustCompile(`^toml: line (\d+) \(last key ("[^"]*")\): (.*)$`)

// BuiltinProfile is the profile that exists even with no config file: run on
// whatever this machine offers (Slurm if sbatch is on PATH, else locally).
const BuiltinProfile = "local"

// Defaults returns the built-in layer: one CPU profile and the tiny model.
func Defaults() Config {
	return Config{
		DefaultProfile: BuiltinProfile,
		RunsDir:        "runs",
		Profiles:       map[string]Profile{BuiltinProfile: DefaultProfileValues()},
		Train:          trainconfig.DefaultConfig(),
	}
}

// DefaultProfileValues are the values a profile starts from before a file
// sets its keys.
func DefaultProfileValues() Profile {
	return Profile{
		Executor: "auto",
		// No --hint: on a cluster without CPU binding (task/affinity) srun
		// warns about it in every job; a profile for a cluster that binds
		// sets hint = "nomultithread" (examples/jean-zay.toml does).
		Resources:  slurm.Resources{CPUsPerTask: 1, Time: "00:30:00"},
		SignalSecs: 120,
	}
}

// Options say where the layers come from. The zero value reads the user file
// and ./hpcrun.toml with the process environment.
type Options struct {
	// UserFile overrides the user config path; "" means the XDG location.
	UserFile string
	// ProjectFile is --config; "" means ./hpcrun.toml when it exists.
	ProjectFile string
	// Profile is --profile; "" falls back to HPCRUN_PROFILE, then default_profile.
	Profile string
	// RunsDir is --runs-dir; "" keeps the lower layers' value.
	RunsDir string
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
}

// UserFilePath is the user layer's file: $XDG_CONFIG_HOME/hpcrun/config.toml,
// else ~/.config/hpcrun/config.toml. It returns "" when no home is known.
func UserFilePath() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "hpcrun", "config.toml")
}

// Load merges the layers: defaults < user file < project file < HPCRUN_*
// environment < flags, and picks the profile in effect.
func Load(opt Options) (*Resolved, error) {
	getenv := opt.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	r := &Resolved{Config: Defaults(), Sources: map[string]string{}}

	user := opt.UserFile
	if user == "" {
		user = UserFilePath()
	}
	if err := r.mergeFileIfExists(user); err != nil {
		return nil, err
	}
	if opt.ProjectFile != "" {
		if _, err := os.Stat(opt.ProjectFile); err != nil {
			return nil, fmt.Errorf("config file %s: %w (check the --config path)", opt.ProjectFile, err)
		}
		if err := r.mergeFile(opt.ProjectFile); err != nil {
			return nil, err
		}
	} else if err := r.mergeFileIfExists("hpcrun.toml"); err != nil {
		return nil, err
	}

	if v := getenv("HPCRUN_RUNS_DIR"); v != "" && opt.RunsDir == "" {
		r.RunsDir = v
		r.Sources["runs_dir"] = "env HPCRUN_RUNS_DIR"
	}
	if opt.RunsDir != "" {
		r.RunsDir = opt.RunsDir
		r.Sources["runs_dir"] = "flag --runs-dir"
	}
	if strings.TrimSpace(r.RunsDir) == "" {
		return nil, errors.New("runs_dir is empty: set it to a directory, e.g. runs_dir = \"runs\"")
	}

	if err := r.pickProfile(opt.Profile, getenv); err != nil {
		return nil, err
	}
	if err := r.applyEnv(getenv); err != nil {
		return nil, err
	}
	r.Profile = r.Profiles[r.ProfileName]
	return r, nil
}

func (r *Resolved) mergeFileIfExists(path string) error {
	if path == "" {
		return nil
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return r.mergeFile(path)
}

// mergeFile decodes one TOML file on its own (so that type errors and unknown
// keys name this file), checks each value it sets, then copies exactly the
// keys it defines over the lower layers.
func (r *Resolved) mergeFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	text := string(data)
	var layer Config
	md, err := toml.Decode(text, &layer)
	if err != nil {
		return fileError(path, text, err)
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		k := undecoded[0]
		return fmt.Errorf("%s:%d: unknown key %q (%s)", path, keyLine(text, k), k.String(), knownKeysHint(k))
	}
	for name := range layer.Profiles {
		if _, ok := r.Profiles[name]; !ok {
			r.Profiles[name] = DefaultProfileValues()
		}
	}
	src := reflect.ValueOf(&layer).Elem()
	dst := reflect.ValueOf(&r.Config).Elem()
	for _, k := range md.Keys() {
		if t := md.Type(k...); t == "Hash" || t == "ArrayHash" {
			continue
		}
		if isInsideArray(md, k) {
			continue
		}
		loc := fmt.Sprintf("%s:%d", path, keyLine(text, k))
		if err := checkValue(k, fieldAt(src, k)); err != nil {
			return fmt.Errorf("%s: key %q: %v", loc, k.String(), err)
		}
		copyPath(dst, src, k)
		r.Sources[k.String()] = loc
	}
	return nil
}

// isInsideArray reports whether k names an element of an array value rather
// than a key of its own (arrays are copied whole through their parent key).
func isInsideArray(md toml.MetaData, k toml.Key) bool {
	for i := 1; i < len(k); i++ {
		if md.Type(k[:i]...) == "Array" {
			return true
		}
	}
	return false
}

func fileError(path, text string, err error) error {
	var perr toml.ParseError
	if errors.As(err, &perr) {
		line := perr.Position.Line
		// The lexer counts a newline it stops at as the next line; the
		// byte offset tells the line the user must fix.
		if start := perr.Position.Start; start > 0 && start <= len(text) {
			line = strings.Count(text[:start], "\n") + 1
		}
		if line == 0 && perr.LastKey != "" {
			line = keyLine(text, toml.Key(strings.Split(perr.LastKey, ".")))
		}
		if perr.LastKey != "" {
			return fmt.Errorf("%s:%d: key %q: %s", path, line, perr.LastKey, perr.Message)
		}
		return fmt.Errorf("%s:%d: %s", path, line, perr.Message)
	}
	// Type mismatches come back as `toml: line N (last key "k"): ...`.
	m := typeErrRE.FindStringSubmatch(err.Error())
	if m == nil {
		return fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "toml: "))
	}
	msg := strings.Replace(m[3], "incompatible types: TOML value has type", "wrong type: the file has", 1)
	msg = strings.Replace(msg, "; destination has type", " but hpcrun wants", 1)
	return fmt.Errorf("%s:%s: key %s: %s", path, m[1], m[2], msg)
}

func knownKeysHint(k toml.Key) string {
	var t reflect.Type
	switch {
	case len(k) == 1:
		t = reflect.TypeOf(Config{})
	case k[0] == "profiles" && len(k) == 3:
		t = reflect.TypeOf(Profile{})
	case k[0] == "train" && len(k) == 2:
		t = reflect.TypeOf(trainconfig.Config{})
	case k[0] == "profiles" && len(k) == 2:
		return "profiles are tables: [profiles." + k[1] + "]"
	default:
		return "not a setting hpcrun knows"
	}
	var names []string
	for _, f := range tomlFields(t) {
		names = append(names, f.name)
	}
	sort.Strings(names)
	return "known keys here: " + strings.Join(names, ", ")
}

// pickProfile chooses the profile: --profile, HPCRUN_PROFILE, default_profile.
func (r *Resolved) pickProfile(flag string, getenv func(string) string) error {
	name, src := r.DefaultProfile, r.sourceOf("default_profile")
	if v := getenv("HPCRUN_PROFILE"); v != "" {
		name, src = v, "env HPCRUN_PROFILE"
	}
	if flag != "" && flag != getenv("HPCRUN_PROFILE") {
		name, src = flag, "flag --profile"
	}
	if _, ok := r.Profiles[name]; !ok {
		return fmt.Errorf("profile %q (from %s) is not defined; defined profiles: %s", name, src, strings.Join(r.ProfileNames(), ", "))
	}
	r.ProfileName = name
	r.Sources["profile"] = src
	return nil
}

// ProfileNames lists the defined profiles in order.
func (r *Resolved) ProfileNames() []string {
	names := make([]string, 0, len(r.Profiles))
	for n := range r.Profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (r *Resolved) sourceOf(key string) string {
	if s, ok := r.Sources[key]; ok {
		return s
	}
	return "default"
}

// applyEnv applies HPCRUN_<KEY> to the chosen profile's scalar keys and
// HPCRUN_TRAIN_<KEY> to the training defaults (e.g. HPCRUN_PARTITION,
// HPCRUN_TRAIN_TP).
func (r *Resolved) applyEnv(getenv func(string) string) error {
	prof := r.Profiles[r.ProfileName]
	pv := reflect.ValueOf(&prof).Elem()
	for _, f := range tomlFields(pv.Type()) {
		name, fv := f.name, pv.FieldByIndex(f.index)
		env := "HPCRUN_" + strings.ToUpper(name)
		s := getenv(env)
		if s == "" || !isScalar(fv.Kind()) {
			continue
		}
		key := toml.Key{"profiles", r.ProfileName, name}
		if err := setScalar(fv, s); err != nil {
			return fmt.Errorf("env %s=%q: %v", env, s, err)
		}
		if err := checkValue(key, fv); err != nil {
			return fmt.Errorf("env %s=%q: %v", env, s, err)
		}
		r.Sources[key.String()] = "env " + env
	}
	r.Profiles[r.ProfileName] = prof

	tv := reflect.ValueOf(&r.Train).Elem()
	for i := 0; i < tv.NumField(); i++ {
		name := tomlName(tv.Type().Field(i))
		env := "HPCRUN_TRAIN_" + strings.ToUpper(name)
		s := getenv(env)
		if s == "" || !isScalar(tv.Field(i).Kind()) {
			continue
		}
		if err := setScalar(tv.Field(i), s); err != nil {
			return fmt.Errorf("env %s=%q: %v", env, s, err)
		}
		r.Sources["train."+name] = "env " + env
	}
	return nil
}

func isScalar(k reflect.Kind) bool {
	switch k {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Float64:
		return true
	}
	return false
}

func setScalar(v reflect.Value, s string) error {
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("want true or false")
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("want an integer")
		}
		v.SetInt(n)
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("want a number")
		}
		v.SetFloat(f)
	default:
		return fmt.Errorf("cannot be set from the environment")
	}
	return nil
}

func tomlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	return name
}

// tomlField is one key of a struct as TOML sees it.
type tomlField struct {
	name  string
	index []int // for FieldByIndex
}

// tomlFields lists t's keys, the fields of an embedded struct (a profile's
// slurm.Resources) as t's own, as the TOML decoder reads them.
func tomlFields(t reflect.Type) []tomlField {
	var out []tomlField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("toml") == "" {
			for _, sub := range tomlFields(f.Type) {
				out = append(out, tomlField{sub.name, append([]int{i}, sub.index...)})
			}
			continue
		}
		if name := tomlName(f); name != "" {
			out = append(out, tomlField{name, []int{i}})
		}
	}
	return out
}

// tomlIndex finds the field of t called name in TOML.
func tomlIndex(t reflect.Type, name string) ([]int, bool) {
	for _, f := range tomlFields(t) {
		if f.name == name {
			return f.index, true
		}
	}
	return nil, false
}

// fieldAt returns the value at key inside v (structs by toml tag, maps by
// key), or the zero Value when the path does not exist.
func fieldAt(v reflect.Value, key toml.Key) reflect.Value {
	for _, part := range key {
		switch v.Kind() {
		case reflect.Struct:
			idx, ok := tomlIndex(v.Type(), part)
			if !ok {
				return reflect.Value{}
			}
			v = v.FieldByIndex(idx)
		case reflect.Map:
			v = v.MapIndex(reflect.ValueOf(part))
			if !v.IsValid() {
				return v
			}
		default:
			return reflect.Value{}
		}
	}
	return v
}

// copyPath sets dst's value at key to src's; both have the same type. Map
// entries along the way are created or updated in place.
func copyPath(dst, src reflect.Value, key toml.Key) {
	if len(key) == 0 {
		dst.Set(src)
		return
	}
	switch dst.Kind() {
	case reflect.Struct:
		if idx, ok := tomlIndex(dst.Type(), key[0]); ok {
			copyPath(dst.FieldByIndex(idx), src.FieldByIndex(idx), key[1:])
		}
	case reflect.Map:
		k := reflect.ValueOf(key[0])
		elem := reflect.New(dst.Type().Elem()).Elem()
		if old := dst.MapIndex(k); old.IsValid() {
			elem.Set(old)
		}
		copyPath(elem, src.MapIndex(k), key[1:])
		if dst.IsNil() {
			dst.Set(reflect.MakeMap(dst.Type()))
		}
		dst.SetMapIndex(k, elem)
	}
}
