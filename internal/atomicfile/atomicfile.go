// Package atomicfile writes files whole or not at all: the data goes to a
// temporary file in the destination's directory, which is synced and then
// renamed over the destination, so a reader sees the old file or the new
// one, never half of either, and a crash leaves no partial file behind.
//
// It is hpcrun's one write-temp-then-rename helper; run directories, configs,
// checkpoints, plots and the NVRTC cache all write through it.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
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

// Update rewrites path with what change makes of its content (nil when
// there is no file yet), atomically, while holding an exclusive lock on
// path's directory (flock: no lock file is left behind): writers in other
// processes update it one after the other, each from the file the one
// before left, so none drops what another added (a read-modify-write
// without the lock keeps only the last one's).
func Update(path string, perm os.FileMode, change func(old []byte) ([]byte, error)) error {
	lock, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("update %s: %w", path, err)
	}
	defer lock.Close() // and with it the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("update %s: lock: %w", path, err)
	}
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("update %s: %w", path, err)
	}
	data, err := change(old)
	if err != nil {
		return err
	}
	return WriteFile(path, data, perm)
}
