package config

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/hpcrun/hpcrun/internal/atomicfile"
)

// ReadConfigFile reads a train.toml. Keys it lacks keep DefaultConfig's
// values; a key it does not know is an error (a typo would otherwise train
// something else than asked). The result is validated.
func ReadConfigFile(path string) (Config, error) {
	cfg := DefaultConfig()
	md, err := toml.DecodeFile(path, &cfg)
	if err != nil {
		return Config{}, fmt.Errorf("training config: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		sort.Strings(keys)
		return Config{}, fmt.Errorf("training config %s: unknown key(s) %s", path, strings.Join(keys, ", "))
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("training config %s: %w", path, err)
	}
	return cfg, nil
}

// WriteConfigFile writes cfg as TOML to path, through a temporary file and a
// rename so that no reader sees half a file.
func WriteConfigFile(path string, cfg Config, header string) error {
	var buf bytes.Buffer
	if header != "" {
		for _, line := range strings.Split(strings.TrimRight(header, "\n"), "\n") {
			fmt.Fprintf(&buf, "# %s\n", line)
		}
	}
	if err := toml.NewEncoder(&buf).Encode(cfg); err != nil {
		return fmt.Errorf("training config: %w", err)
	}
	if err := atomicfile.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("training config: %w", err)
	}
	return nil
}
