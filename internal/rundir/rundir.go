// Package rundir owns the run directory: where a run's files live, how a
// new run gets its execid, and how a run is found again (by execid, a unique
// prefix of one, or its Slurm job id) or listed. Every command, the job
// executors and the training task go through it, so the layout is spelled
// once:
//
//	runs/<execid>/meta.json            what was submitted, how, what came of it
//	runs/<execid>/token                the rendezvous secret (mode 0600)
//	runs/<execid>/job.sbatch           the job script
//	runs/<execid>/train.toml           the full training config
//	runs/<execid>/slurm-<jobid>.out    the job's output (.err: its errors)
//	runs/<execid>/metrics/rank-NNNNN.jsonl
//	runs/<execid>/ckpt/                checkpoints
//	runs/<execid>/.local/              the Local executor's own files
//	runs/sweeps/<sweepid>/             a sweep: its grid, job array and logs (sweep.go)
//
// It is a leaf: it knows the names of the files, not what they hold (beyond
// the job id in meta.json, which Find matches).
package rundir

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
)

// The files and folders of a run directory.
const (
	MetaFile   = "meta.json"
	TokenFile  = "token"
	ScriptFile = "job.sbatch"
	ConfigFile = "train.toml"
	MetricsDir = "metrics"
	CkptDir    = "ckpt"
	LocalDir   = ".local"
	LockFile   = ".lock"
)

// Dir is the path of one run directory.
type Dir string

// ExecID is the run's execid: the directory's name.
func (d Dir) ExecID() string { return filepath.Base(string(d)) }

// Path is the directory itself.
func (d Dir) Path() string { return string(d) }

// Meta is the path of meta.json.
func (d Dir) Meta() string { return filepath.Join(string(d), MetaFile) }

// Token is the path of the rendezvous token.
func (d Dir) Token() string { return filepath.Join(string(d), TokenFile) }

// Script is the path of the job script.
func (d Dir) Script() string { return filepath.Join(string(d), ScriptFile) }

// Config is the path of train.toml.
func (d Dir) Config() string { return filepath.Join(string(d), ConfigFile) }

// Metrics is the folder of the rank metrics files.
func (d Dir) Metrics() string { return filepath.Join(string(d), MetricsDir) }

// RankMetrics is the metrics file of one rank.
func (d Dir) RankMetrics(rank int) string {
	return filepath.Join(string(d), MetricsDir, fmt.Sprintf("rank-%05d.jsonl", rank))
}

// MetricsFiles lists the rank metrics files that exist, in rank order.
func (d Dir) MetricsFiles() ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(string(d), MetricsDir, "rank-*.jsonl"))
	sort.Strings(paths)
	return paths, err
}

// Ckpt is the checkpoint folder.
func (d Dir) Ckpt() string { return filepath.Join(string(d), CkptDir) }

// Local is the Local executor's folder.
func (d Dir) Local() string { return filepath.Join(string(d), LocalDir) }

// Log is the output file of job jobID as its script's #SBATCH lines name
// it: slurm-<jobid>.out, or slurm-<jobid>.err when errStream is set.
func (d Dir) Log(jobID string, errStream bool) string {
	ext := ".out"
	if errStream {
		ext = ".err"
	}
	return filepath.Join(string(d), "slurm-"+jobID+ext)
}

var execIDRE = regexp.MustCompile(`^\d{8}-\d{6}-[0-9a-f]{4}$`)

// IsExecID reports whether s has the shape of an execid.
func IsExecID(s string) bool { return execIDRE.MatchString(s) }

// New creates a run directory under runsDir with a fresh execid such as
// 20261121-143005-a3f9: the time of day keeps execids sortable and the
// random suffix, checked against what exists, keeps them unique.
func New(runsDir string, now time.Time) (Dir, error) {
	if err := os.MkdirAll(runsDir, 0o755); err != nil {
		return "", fmt.Errorf("runs dir: %w", err)
	}
	for range 64 {
		var b [2]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", err
		}
		dir := filepath.Join(runsDir, now.Format("20060102-150405")+"-"+hex.EncodeToString(b[:]))
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			return Dir(dir), nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("run dir: %w", err)
		}
	}
	return "", fmt.Errorf("run dir: no free execid in %s for %s", runsDir, now.Format(time.DateTime))
}

// WriteToken creates the run's rendezvous token: 16 random bytes from
// crypto/rand in hex, in a file only its owner can read. It refuses to
// replace an existing token.
func (d Dir) WriteToken() error {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("rendezvous token: %w", err)
	}
	f, err := os.OpenFile(d.Token(), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("rendezvous token: %w", err)
	}
	_, err = f.WriteString(hex.EncodeToString(b[:]) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(d.Token())
		return fmt.Errorf("rendezvous token: %w", err)
	}
	return nil
}

// ReadToken reads the run's rendezvous token. A missing, empty or
// world-readable token file is an error: the tasks never fall back to a
// secret someone else could work out.
func (d Dir) ReadToken() (string, error) {
	f, err := os.Open(d.Token())
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s is missing: the run dir was not made by hpcrun submit or hpcrun run, so its tasks have no shared secret; submit the run with hpcrun", d.Token())
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%s has mode %#o: others can read the rendezvous secret; chmod 600 it", d.Token(), fi.Mode().Perm())
	}
	b := make([]byte, 256)
	n, _ := f.Read(b)
	tok := strings.TrimSpace(string(b[:n]))
	if tok == "" {
		return "", fmt.Errorf("%s is empty: remove the run dir and submit again", d.Token())
	}
	return tok, nil
}

// ErrBusy means another hpcrun holds the run's lock.
var ErrBusy = errors.New("another hpcrun is changing this run")

// Lock takes the run's lock (an flock on runs/<execid>/.lock) without
// waiting: the steps from a run's liveness check to the record of its new
// job hold it, so that two resumes of one run cannot both start a job. It
// fails with ErrBusy while another process holds it; the lock goes with
// the process, so a killed hpcrun leaves none behind.
func (d Dir) Lock() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(string(d), LockFile), os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock run %s: %w", d.ExecID(), err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("run %s: %w (a resume of it is starting now): try again once it has", d.ExecID(), ErrBusy)
		}
		return nil, fmt.Errorf("lock run %s: %w", d.ExecID(), err)
	}
	var once sync.Once
	return func() { once.Do(func() { f.Close() }) }, nil
}

// WriteJSON writes v as indented JSON to path, atomically.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return atomicfile.WriteFile(path, append(b, '\n'), 0o644)
}
