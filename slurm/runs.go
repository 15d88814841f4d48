package slurm

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/internal/rundir"
)

// Meta is runs/<execid>/meta.json: what was submitted, how, and what came of
// it. Submit writes it; queue may add Final once the job is over.
type Meta struct {
	ExecID       string    `json:"execid"`
	JobID        string    `json:"jobid,omitempty"`
	PastJobs     []string  `json:"past_jobs,omitempty"` // the jobs of earlier segments (before resumes), oldest first
	Cluster      string    `json:"cluster,omitempty"`   // from sbatch --parsable, on federations
	Executor     string    `json:"executor"`            // slurm, local, or run (hpcrun run: ranks started in the foreground)
	Sweep        string    `json:"sweep,omitempty"`     // the sweep whose job array runs this point
	Host         string    `json:"host"`                // the machine that submitted
	Spec         JobSpec   `json:"spec"`
	SubmitTime   time.Time `json:"submit_time"`
	Version      string    `json:"hpcrun_version"`
	Binary       string    `json:"binary"`
	BinarySHA256 string    `json:"binary_sha256,omitempty"`
	SubmitError  string    `json:"submit_error,omitempty"` // sbatch's own words when submission failed
	Final        *JobInfo  `json:"final,omitempty"`        // last state seen once the job was over
	// Plan is what hpcrun plan predicted for the run when it was submitted
	// (per-rank memory, step time), kept as written: slurm does not read it.
	Plan json.RawMessage `json:"plan,omitempty"`
}

// NewJob records jobID as the run's job, the one before it (if any) among
// its past jobs, and forgets the old job's end.
func (m *Meta) NewJob(jobID string) {
	if m.JobID != "" && m.JobID != jobID {
		m.PastJobs = append(m.PastJobs, m.JobID)
	}
	m.JobID, m.Final, m.SubmitError = jobID, nil, ""
}

// WriteMeta writes m as the run's meta.json, atomically.
func WriteMeta(d rundir.Dir, m *Meta) error { return rundir.WriteJSON(d.Meta(), m) }

// ReadMeta reads the run's meta.json.
func ReadMeta(d rundir.Dir) (*Meta, error) {
	b, err := os.ReadFile(d.Meta())
	if err != nil {
		return nil, err
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", d.Meta(), err)
	}
	return &m, nil
}

// Run is one run directory with its meta.
type Run struct {
	Dir  rundir.Dir
	Meta *Meta
	// Err, from ListRuns, says why meta.json could not be read; Meta then
	// holds only the execid (the folder's name).
	Err error
}

// OpenRun finds a run the way every command does (rundir.Find: execid, job
// id or unique prefix) and reads its meta.
func OpenRun(runsDir, ref string) (Run, error) {
	r, err := rundir.Find(runsDir, ref)
	if err != nil {
		return Run{}, err
	}
	m, err := ReadMeta(r.Dir)
	if err != nil {
		return Run{}, fmt.Errorf("run %s: %w", r.ExecID, err)
	}
	return Run{Dir: r.Dir, Meta: m}, nil
}

// ListRuns reads the meta of every run under runsDir, oldest first. A run
// whose meta.json cannot be read or is not JSON is listed with Err set; a
// folder without one (a submission being written) is skipped.
func ListRuns(runsDir string) ([]Run, error) {
	all, err := rundir.List(runsDir)
	if err != nil {
		return nil, err
	}
	var runs []Run
	for _, r := range all {
		m, err := ReadMeta(r.Dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			m = &Meta{ExecID: r.Dir.ExecID()}
		}
		runs = append(runs, Run{Dir: r.Dir, Meta: m, Err: err})
	}
	return runs, nil
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

// BinarySHA256 is FileSHA256 of a program (the hpcrun binary that a job
// runs, for Meta.BinarySHA256), cached in the user cache dir under its
// path, size, modification time and inode: hashing a large binary on every
// submit would cost more than sbatch itself.
func BinarySHA256(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	var ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	key := fmt.Sprintf("%s\x00%d\x00%d\x00%d", path, fi.Size(), fi.ModTime().UnixNano(), ino)
	cache := ""
	if dir, err := os.UserCacheDir(); err == nil {
		cache = filepath.Join(dir, "hpcrun", "binary-sha256")
		if b, err := os.ReadFile(cache); err == nil {
			if k, sum, ok := strings.Cut(string(b), "\n"); ok && k == key && len(sum) == 64 {
				return sum, nil
			}
		}
	}
	sum, err := FileSHA256(path)
	if err != nil {
		return "", err
	}
	if cache != "" && os.MkdirAll(filepath.Dir(cache), 0o755) == nil {
		_ = atomicfile.WriteFile(cache, []byte(key+"\n"+sum), 0o644) // a cache: failing to write it costs only time
	}
	return sum, nil
}
