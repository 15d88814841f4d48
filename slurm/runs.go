package slurm

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"
)

// Meta is runs/<execid>/meta.json: what was submitted, how, and what came of
// it. Submit writes it; queue may add Final once the job is over.
type Meta struct {
	ExecID       string    `json:"execid"`
	JobID        string    `json:"jobid,omitempty"`
	Cluster      string    `json:"cluster,omitempty"` // from sbatch --parsable, on federations
	Executor     string    `json:"executor"`          // slurm or local
	Host         string    `json:"host"`              // the machine that submitted
	Spec         JobSpec   `json:"spec"`
	SubmitTime   time.Time `json:"submit_time"`
	Version      string    `json:"hpcrun_version"`
	Binary       string    `json:"binary"`
	BinarySHA256 string    `json:"binary_sha256,omitempty"`
	SubmitError  string    `json:"submit_error,omitempty"` // sbatch's own words when submission failed
	Final        *JobInfo  `json:"final,omitempty"`        // last state seen once the job was over
}

// MetaFile is the name of the meta file in a run directory.
const MetaFile = "meta.json"

var execIDRE = regexp.MustCompile(`^\d{8}-\d{6}-[0-9a-f]{4}$`)

// IsExecID reports whether s has the shape of an execid.
func IsExecID(s string) bool { return execIDRE.MatchString(s) }

// NewRun creates runs/<execid>/ under runsDir with a fresh execid such as
// 20261121-143005-a3f9: the time of day keeps them sortable and the random
// suffix, checked against what exists, keeps them unique.
func NewRun(runsDir string, now time.Time) (execID, dir string, err error) {
	if err := os.MkdirAll(runsDir, 0o755); err != nil {
		return "", "", fmt.Errorf("runs dir: %w", err)
	}
	for range 64 {
		var b [2]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", "", err
		}
		id := now.Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
		dir := filepath.Join(runsDir, id)
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			return id, dir, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", "", fmt.Errorf("run dir: %w", err)
		}
	}
	return "", "", fmt.Errorf("run dir: no free execid in %s for %s", runsDir, now.Format(time.DateTime))
}

// WriteFileAtomic writes data to path through a temporary file in the same
// directory and a rename, so readers see the old file or the new one whole.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
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

// WriteMeta writes m as dir/meta.json, atomically.
func WriteMeta(dir string, m *Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(filepath.Join(dir, MetaFile), append(b, '\n'), 0o644)
}

// ReadMeta reads dir/meta.json.
func ReadMeta(dir string) (*Meta, error) {
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return nil, err
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, MetaFile), err)
	}
	return &m, nil
}

// Run is one run directory with its meta.
type Run struct {
	Dir  string
	Meta *Meta
}

// ListRuns reads the meta of every run under runsDir, oldest first. Folders
// without a readable meta.json are skipped; a missing runsDir is no runs.
func ListRuns(runsDir string) ([]Run, error) {
	ents, err := os.ReadDir(runsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runs dir: %w", err)
	}
	var runs []Run
	for _, e := range ents {
		if !e.IsDir() || !IsExecID(e.Name()) {
			continue
		}
		dir := filepath.Join(runsDir, e.Name())
		m, err := ReadMeta(dir)
		if err != nil {
			continue
		}
		runs = append(runs, Run{Dir: dir, Meta: m})
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].Meta.ExecID < runs[j].Meta.ExecID })
	return runs, nil
}

// FindRun finds a run by execid, or by jobid among the runs' meta (the newest
// wins when a jobid was reused).
func FindRun(runsDir, ref string) (Run, error) {
	if IsExecID(ref) {
		dir := filepath.Join(runsDir, ref)
		m, err := ReadMeta(dir)
		if errors.Is(err, os.ErrNotExist) {
			return Run{}, fmt.Errorf("no run %s in %s (see hpcrun queue --all, or pass --runs-dir)", ref, runsDir)
		}
		if err != nil {
			return Run{}, err
		}
		return Run{Dir: dir, Meta: m}, nil
	}
	runs, err := ListRuns(runsDir)
	if err != nil {
		return Run{}, err
	}
	for i := len(runs) - 1; i >= 0; i-- {
		if runs[i].Meta.JobID == ref {
			return runs[i], nil
		}
	}
	return Run{}, fmt.Errorf("%q is neither the execid (like 20261121-143005-a3f9) nor the jobid of a run in %s (see hpcrun queue --all)", ref, runsDir)
}

// FileSHA256 is the hex sha256 of a file's contents.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("sha256 %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
