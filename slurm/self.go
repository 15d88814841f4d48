package slurm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/internal/rundir"
)

// LauncherTokenEnv carries the rendezvous secret from LaunchSelf (hpcrun
// check, generate and eval start their ranks on this machine) to the ranks
// it starts; a rank that has it is no launcher.
const LauncherTokenEnv = "HPCRUN_LAUNCH_TOKEN"

// NewToken is a fresh rendezvous secret: 16 bytes from crypto/rand in hex.
func NewToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// Launched reports whether this process is a rank that LaunchSelf started.
func Launched() bool { return os.Getenv(LauncherTokenEnv) != "" }

// LaunchSelf starts n ranks of this very program with args on this machine
// through Torchrun (name goes into the run id), with a fresh token for
// their rendezvous (RankToken finds it), and waits. Once one fails, the
// others have grace (their wait at a collective, and some) before they are
// stopped. It returns the ranks that failed; they say why themselves.
func LaunchSelf(ctx context.Context, name string, n int, args []string, grace time.Duration) ([]TaskExit, error) {
	token, err := NewToken()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("path of hpcrun: %w", err)
	}
	ranks := Tasks{N: n, Program: self, Args: args, Env: []string{LauncherTokenEnv + "=" + token}, Grace: grace}
	return Torchrun(ctx, ranks, "hpcrun-"+name+"-"+token[:8])
}

// RankToken is the rendezvous secret of a check, generate or eval rank:
// the run dir's token (a check submitted with hpcrun submit --check), else
// LaunchSelf's. A bare `srun hpcrun check` has neither: its tasks share one
// derived from the job and step, which is no secret; a check holds no data
// of the user's, and submit --check is the way to a private one.
func RankToken(env idrenv.Env, runDir string) (string, error) {
	if runDir != "" {
		return rundir.Dir(runDir).ReadToken()
	}
	if t := os.Getenv(LauncherTokenEnv); t != "" {
		return t, nil
	}
	sum := sha256.Sum256([]byte("hpcrun-check\x00" + env.JobID + "\x00" + env.StepID + "\x00" + env.MasterAddr))
	return hex.EncodeToString(sum[:16]), nil
}

// Self is the path of this program with its links resolved: what a job
// script runs.
func Self() (string, error) {
	p, err := os.Executable()
	if err == nil {
		p, err = filepath.EvalSymlinks(p)
	}
	if err != nil {
		return "", fmt.Errorf("path of hpcrun: %w", err)
	}
	return p, nil
}
