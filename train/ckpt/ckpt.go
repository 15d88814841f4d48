package ckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/parallel"
)

// Names in a checkpoint root (runs/<execid>/ckpt).
const (
	// StateFile is the JSON description of a checkpoint, in its step dir.
	StateFile = "state.json"
	// LatestFile in the root names the newest complete step dir; it is
	// replaced atomically, after the step dir is complete.
	LatestFile = "latest"
	// Format is the version of the layout this package writes.
	Format = 1
)

var stepDirRE = regexp.MustCompile(`^step-[0-9]{6,}$`)

// StepDir is the name of step's directory, e.g. "step-000200".
func StepDir(step int) string { return fmt.Sprintf("step-%06d", step) }

// ModelFile is the model shard of TP rank tp of tpSize.
func ModelFile(tp, tpSize int) string { return fmt.Sprintf("model-tp%d-of-%d.safetensors", tp, tpSize) }

// OptimFile is the optimizer state of TP rank tp, written by DP rank dp
// (0 when the AdamW moments are the same on every DP rank; every DP rank
// its own range under ZeRO-1).
func OptimFile(tp, dp int) string { return fmt.Sprintf("optim-tp%d-dp%d.safetensors", tp, dp) }

// TensorInfo says how one parameter is cut into the model shards.
type TensorInfo struct {
	Name   string `json:"name"`
	Full   []int  `json:"full"`             // unsharded shape at the saved tp (vocab padding included)
	Split  bool   `json:"split"`            // false: replicated, every shard holds it whole
	Dim    int    `json:"dim"`              // split dimension
	Blocks int    `json:"blocks,omitempty"` // fused blocks of the split dimension (3 for Q,K,V)
	Rows   int    `json:"rows,omitempty"`   // real rows of dim 0 when the rest is vocabulary padding
	// Replicas and Shared: groups of Replicas ranks share the last Shared
	// indices of each group (parallel.Shard; kv heads replicated over tp).
	Replicas int `json:"replicas,omitempty"`
	Shared   int `json:"shared,omitempty"`
}

// Shard is the layout of TP rank index of parts for this tensor.
func (ti TensorInfo) Shard(index, parts int) parallel.Shard {
	if !ti.Split || parts == 1 {
		return parallel.Shard{Parts: 1}
	}
	return parallel.Shard{Dim: ti.Dim, Parts: parts, Index: index, Blocks: ti.Blocks, Replicas: ti.Replicas, Shared: ti.Shared}
}

// Mesh is the job layout a checkpoint was saved from.
type Mesh struct {
	TP    int `json:"tp"`
	DP    int `json:"dp"`
	PP    int `json:"pp,omitempty"` // pipeline stages (0: none); the files are laid out as at pp 1
	World int `json:"world"`
}

// RNG is the randomness a run depends on after initialisation. The loop
// draws no random numbers (no dropout); the sampler's order of epoch e is
// PCG(Seed, e), so Seed with State's Epoch and SamplerPos restores it.
type RNG struct {
	Kind string `json:"kind"` // "pcg(seed, epoch)"
	Seed int64  `json:"seed"`
}

// State is state.json: where training stands and how the shards are cut.
type State struct {
	Format     int             `json:"format"`
	Step       int             `json:"step"`        // optimizer steps done
	Epoch      int             `json:"epoch"`       // epoch of the next sample
	SamplerPos int             `json:"sampler_pos"` // next sample index in the epoch's order, per DP rank
	RNG        RNG             `json:"rng"`
	Model      string          `json:"model"`
	Vocab      int             `json:"vocab"` // real vocabulary (before padding)
	Config     json.RawMessage `json:"config"`
	Mesh       Mesh            `json:"mesh"`
	Tensors    []TensorInfo    `json:"tensors"`
	Zero       int             `json:"zero,omitempty"` // 1 to 3 (the ZeRO stage): the optimizer state is pieces, one file per TP and DP rank (WriteOptimZero)
	// ZeroGroup, under hybrid sharding, is the data-parallel ranks the
	// pieces are cut over: the files of DP ranks 0 to ZeroGroup-1 hold
	// them all (0: every DP rank's file).
	ZeroGroup int       `json:"zero_group,omitempty"`
	Saved     time.Time `json:"saved"`
}

// TempDir is where step's checkpoint is written before Commit renames it.
func TempDir(root string, step int) string { return filepath.Join(root, ".tmp-"+StepDir(step)) }

// Prepare makes an empty TempDir for step. It first clears what crashed
// saves left behind: temporary dirs, step dirs newer than the one latest
// names (renamed but never published), and old step dirs beyond keep-1, so
// that the commit to come leaves at most keep (keep <= 0 keeps all). One
// rank calls it before any writer starts.
func Prepare(root string, step, keep int) (string, error) {
	if err := clearLeftovers(root, keep); err != nil {
		return "", err
	}
	tmp := TempDir(root, step)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	return tmp, nil
}

func clearLeftovers(root string, keep int) error {
	tmps, _ := filepath.Glob(filepath.Join(root, ".tmp-step-*"))
	latestTmps, _ := filepath.Glob(filepath.Join(root, "."+LatestFile+".tmp*"))
	for _, t := range append(tmps, latestTmps...) {
		if err := os.RemoveAll(t); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	latest, err := readLatest(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil // nothing published: step dirs without latest are left alone
	}
	if err != nil {
		return err
	}
	steps, err := List(root)
	if err != nil {
		return err
	}
	published := steps[:0:0]
	for _, name := range steps {
		if stepNumber(name) > stepNumber(latest) {
			if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
				return fmt.Errorf("checkpoint: %w", err)
			}
			continue
		}
		published = append(published, name)
	}
	if keep <= 0 {
		return nil
	}
	for i := 0; i < len(published)-(keep-1); i++ {
		if published[i] == latest {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, published[i])); err != nil {
			return fmt.Errorf("checkpoint: prune: %w", err)
		}
	}
	return nil
}

func stepNumber(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "step-"))
	return n
}

// WriteState writes st as dir/state.json and fsyncs it.
func WriteState(dir string, st *State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint state: %w", err)
	}
	return writeSync(filepath.Join(dir, StateFile), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// writeSync creates path (inside a step's temporary dir, which is renamed
// whole) with what fill writes, and fsyncs it.
func writeSync(path string, fill func(io.Writer) error) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	if err := fill(f); err != nil {
		return err
	}
	return f.Sync()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// Abort removes step's TempDir after a save that failed (a full disk, a
// lost rank), so that its partial files do not hold the space until the
// next save; latest still names the last complete checkpoint.
func Abort(root string, step int) error {
	if err := os.RemoveAll(TempDir(root, step)); err != nil {
		return fmt.Errorf("checkpoint: remove the aborted save: %w", err)
	}
	return nil
}

// Commit publishes step's TempDir once every writer has finished: it
// fsyncs the dir, renames it to StepDir(step), points LatestFile at it
// (write a temporary file, fsync, rename, fsync the root), and then removes
// all but the newest keep step dirs (keep <= 0 keeps all). A crash at any
// point leaves LatestFile naming a complete checkpoint. It returns the step
// dir.
func Commit(root string, step, keep int) (string, error) {
	tmp := TempDir(root, step)
	name := StepDir(step)
	final := filepath.Join(root, name)
	if err := syncDir(tmp); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	if cur, _ := readLatest(root); cur == name {
		// A resumed run saves the step it resumed from again: the one
		// that latest names stays, the same state written twice.
		if err := os.RemoveAll(tmp); err != nil {
			return "", fmt.Errorf("checkpoint: %w", err)
		}
		return final, nil
	}
	// A step dir that latest does not name is the leftover of a crash
	// between this rename and the latest update below.
	if err := os.RemoveAll(final); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	if err := syncDir(root); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(root, LatestFile), []byte(name+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	if err := syncDir(root); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	return final, prune(root, keep, name)
}

// prune removes step dirs beyond the newest keep, never the one latest
// names.
func prune(root string, keep int, latest string) error {
	if keep <= 0 {
		return nil
	}
	steps, err := List(root)
	if err != nil {
		return err
	}
	for i := 0; i < len(steps)-keep; i++ {
		if steps[i] == latest {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, steps[i])); err != nil {
			return fmt.Errorf("checkpoint: prune: %w", err)
		}
	}
	return nil
}

// List returns the step dirs under root, oldest first.
func List(root string) ([]string, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && stepDirRE.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	sort.Slice(out, func(i, j int) bool { return stepNumber(out[i]) < stepNumber(out[j]) })
	return out, nil
}

func readLatest(root string) (string, error) {
	path := filepath.Join(root, LatestFile)
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	// A step dir's name is short: read a little more than one, so that a
	// corrupt file is quoted in part, never whole.
	const most = 64
	b, err := io.ReadAll(io.LimitReader(f, most+1))
	if err != nil {
		return "", fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if len(b) > most {
		size := "more"
		if st, err := f.Stat(); err == nil {
			size = fmt.Sprintf("%d", st.Size())
		}
		return "", fmt.Errorf("checkpoint %s: %s bytes starting %q..., not a step dir's name: the file is corrupt", path, size, b[:32])
	}
	name := strings.TrimSpace(string(b))
	if !stepDirRE.MatchString(name) {
		return "", fmt.Errorf("checkpoint %s: names %q, not a step dir: the file is corrupt", path, name)
	}
	return name, nil
}

// Latest returns the step dir that root's LatestFile names, "" when there
// is no checkpoint (no root or no LatestFile).
func Latest(root string) (string, error) {
	name, err := readLatest(root)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, name)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("checkpoint %s names %s: %w", filepath.Join(root, LatestFile), name, err)
	}
	return dir, nil
}

// Resolve turns what a user gave (a step dir, a checkpoint root with a
// latest file, or a run dir holding ckpt/) into a step dir.
func Resolve(path string) (string, error) {
	if _, err := os.Stat(filepath.Join(path, StateFile)); err == nil {
		return path, nil
	}
	for _, root := range []string{path, filepath.Join(path, "ckpt")} {
		if dir, err := Latest(root); err != nil {
			return "", err
		} else if dir != "" {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%s: no checkpoint (no %s, %s or ckpt/%s)", path, StateFile, LatestFile, LatestFile)
}
