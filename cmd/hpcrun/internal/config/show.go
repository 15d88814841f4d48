package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// Entry is one resolved value and where it came from.
type Entry struct {
	Key    string `json:"key"`
	Value  any    `json:"value"`
	Source string `json:"source"`
}

// Entries lists the resolved values that matter for the profile in effect:
// the top-level keys, the chosen profile's keys (as "profile.<key>") and
// the training defaults (as "train.<key>"), each with its source.
func (r *Resolved) Entries() []Entry {
	out := []Entry{
		{Key: "profile", Value: r.ProfileName, Source: r.sourceOf("profile")},
		{Key: "default_profile", Value: r.DefaultProfile, Source: r.sourceOf("default_profile")},
		{Key: "runs_dir", Value: r.RunsDir, Source: r.sourceOf("runs_dir")},
	}
	prefix := "profiles." + r.ProfileName + "."
	out = append(out, structEntries(reflect.ValueOf(r.Profile), "profile.", func(k string) string { return r.sourceOf(prefix + k) })...)
	// The training values a run uses: a zero that means "the default"
	// shows as the default it stands for.
	out = append(out, structEntries(reflect.ValueOf(r.Train.Effective()), "train.", func(k string) string { return r.sourceOf("train." + k) })...)
	return out
}

func structEntries(v reflect.Value, prefix string, source func(string) string) []Entry {
	var out []Entry
	for _, tf := range tomlFields(v.Type()) {
		name, f := tf.name, v.FieldByIndex(tf.index)
		if f.Kind() == reflect.Map {
			keys := f.MapKeys()
			sort.Slice(keys, func(a, b int) bool { return keys[a].String() < keys[b].String() })
			if len(keys) == 0 {
				out = append(out, Entry{Key: prefix + name, Value: map[string]string{}, Source: source(name)})
			}
			for _, k := range keys {
				sub := name + "." + k.String()
				src := source(sub)
				if src == "default" {
					src = source(name)
				}
				out = append(out, Entry{Key: prefix + sub, Value: f.MapIndex(k).Interface(), Source: src})
			}
			continue
		}
		out = append(out, Entry{Key: prefix + name, Value: f.Interface(), Source: source(name)})
	}
	return out
}

// FormatValue writes v the way it would be written in a TOML file.
func FormatValue(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case []string:
		q := make([]string, len(x))
		for i, s := range x {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	case map[string]string:
		if len(x) == 0 {
			return "{}"
		}
	}
	return fmt.Sprint(v)
}
