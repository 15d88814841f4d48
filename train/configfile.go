package train

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
)

// ConfigFile is the name of the training config in a run directory.
const ConfigFile = "train.toml"

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
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("training config: %w", err)
	}
	_, err = f.Write(buf.Bytes())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("training config: %w", err)
	}
	return nil
}
