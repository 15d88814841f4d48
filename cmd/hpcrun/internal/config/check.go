package config

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/hpcrun/hpcrun/slurm"
)

var (
	profileNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	envNameRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// checkValue checks one value a layer sets; key says which. The messages say
// what to write instead.
func checkValue(key toml.Key, v reflect.Value) error {
	if len(key) >= 2 && key[0] == "profiles" && !profileNameRE.MatchString(key[1]) {
		return fmt.Errorf("profile name %q: use letters, digits, '_', '-' and '.'", key[1])
	}
	if !v.IsValid() {
		return nil
	}
	path := key.String()
	last := key[len(key)-1]
	switch {
	case len(key) == 1 && last == "default_profile":
		if !profileNameRE.MatchString(v.String()) {
			return fmt.Errorf("%q: name a profile (letters, digits, '_', '-', '.')", v.String())
		}
	case len(key) == 1 && last == "runs_dir":
		if strings.TrimSpace(v.String()) == "" {
			return fmt.Errorf("empty: name a directory, e.g. \"runs\"")
		}
	case len(key) == 3 && key[0] == "profiles":
		return checkProfileKey(last, v)
	case len(key) == 4 && key[0] == "profiles" && key[2] == "env":
		if !envNameRE.MatchString(last) {
			return fmt.Errorf("%q is not a valid environment variable name", last)
		}
		if strings.ContainsAny(v.String(), "\n\x00") {
			return fmt.Errorf("value contains a newline or NUL")
		}
	case strings.HasPrefix(path, "train."):
		return nil // checked as a whole by trainconfig.Config.Validate at submit time
	}
	return nil
}

func checkProfileKey(name string, v reflect.Value) error {
	if slurm.IsOption(name) {
		return slurm.CheckOption(name, v.Interface())
	}
	switch name {
	case "executor":
		switch v.String() {
		case "slurm", "local", "auto":
		default:
			return fmt.Errorf("%q: use slurm, local or auto", v.String())
		}
	case "signal_secs":
		if v.Int() < 0 || v.Int() > 65535 {
			return fmt.Errorf("%d: seconds before the time limit, 0 to 65535", v.Int())
		}
	case "modules", "sbatch_extra":
		for i := 0; i < v.Len(); i++ {
			s := v.Index(i).String()
			if strings.TrimSpace(s) == "" || strings.ContainsAny(s, "\n\r\x00") {
				return fmt.Errorf("entry %d (%q): must be one non-empty line", i+1, s)
			}
			if name == "sbatch_extra" && !strings.HasPrefix(s, "-") {
				return fmt.Errorf("entry %d (%q): write the sbatch option, e.g. \"--mail-type=END\"", i+1, s)
			}
		}
	}
	return nil
}

// keyLine finds the line (1-based) that defines key in a TOML text, following
// [table] headers and dotted keys; inline tables match by their parent key.
// BurntSushi/toml keeps key positions private, hence this small scan; it
// returns 0 when the key cannot be found.
func keyLine(text string, key toml.Key) int {
	want := key.String()
	best, bestLen := 0, 0
	var table []string
	for i, raw := range strings.Split(text, "\n") {
		line := strings.TrimSpace(stripComment(raw))
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "[") {
			h := strings.Trim(line, "[] \t")
			table = splitDotted(h)
			if matchLen := prefixLen(table, key); matchLen == len(table) && matchLen > bestLen {
				best, bestLen = i+1, matchLen
			}
			continue
		}
		name, _, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		full := append(append([]string{}, table...), splitDotted(strings.TrimSpace(name))...)
		if toml.Key(full).String() == want {
			return i + 1
		}
		if matchLen := prefixLen(full, key); matchLen == len(full) && matchLen > bestLen {
			best, bestLen = i+1, matchLen
		}
	}
	return best
}

func prefixLen(have []string, key toml.Key) int {
	if len(have) > len(key) {
		return 0
	}
	for i := range have {
		if have[i] != key[i] {
			return 0
		}
	}
	return len(have)
}

func splitDotted(s string) []string {
	var parts []string
	for _, p := range strings.Split(s, ".") {
		parts = append(parts, strings.Trim(strings.TrimSpace(p), `"'`))
	}
	return parts
}

func stripComment(s string) string {
	inQuote := byte(0)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inQuote != 0 && c == inQuote:
			inQuote = 0
		case inQuote == 0 && (c == '"' || c == '\''):
			inQuote = c
		case inQuote == 0 && c == '#':
			return s[:i]
		}
	}
	return s
}
