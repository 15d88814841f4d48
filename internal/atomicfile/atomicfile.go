// Package atomicfile writes files whole or not at all: the data goes to a
// temporary file in the destination's directory, which is synced and then
// renamed over the destination, so a reader sees the old file or the new
// one, never half of either, and a crash leaves no partial file behind.
//
// It is hpcrun's one write-temp-then-rename helper; run directories, configs,
// checkpoints, plots and the NVRTC cache all write through it.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteFile writes data to path with permissions perm, atomically.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return Write(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Write creates path with permissions perm from what fill writes, atomically:
// when fill or any step after it fails, path is left as it was and the
// temporary file is removed.
func Write(path string, perm os.FileMode, fill func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	err = fill(f)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
