package slurm

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/internal/rundir"
)

// TestRankToken checks where a check, generate or eval rank finds its
// rendezvous secret: the run dir's token first, else the launcher's, else
// one derived from the job, step and master (the same on every task of
// the step, another for another step).
func TestRankToken(t *testing.T) {
	a, err := NewToken()
	if err != nil || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a) {
		t.Fatalf("NewToken = %q, %v", a, err)
	}
	if b, _ := NewToken(); b == a {
		t.Error("two tokens alike")
	}
	dir, err := rundir.New(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := dir.WriteToken(); err != nil {
		t.Fatal(err)
	}
	want, _ := dir.ReadToken()
	t.Setenv(LauncherTokenEnv, "launcher")
	if got, err := RankToken(idrenv.Env{}, dir.Path()); err != nil || got != want {
		t.Errorf("with a run dir: %q, %v; want its token %q", got, err, want)
	}
	if got, _ := RankToken(idrenv.Env{}, ""); got != "launcher" || !Launched() {
		t.Errorf("under the launcher: %q, launched %v", got, Launched())
	}
	t.Setenv(LauncherTokenEnv, "")
	env := idrenv.Env{JobID: "7", StepID: "0", MasterAddr: "n1"}
	t1, _ := RankToken(env, "")
	t2, _ := RankToken(env, "")
	env.StepID = "1"
	t3, _ := RankToken(env, "")
	if t1 != t2 || t1 == t3 || len(t1) != 32 || Launched() {
		t.Errorf("derived tokens %q, %q, next step %q; launched %v", t1, t2, t3, Launched())
	}
}

// Self is this test binary, resolved.
func TestSelf(t *testing.T) {
	p, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(p) {
		t.Errorf("Self() = %q: want an absolute path", p)
	}
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		t.Errorf("Self() = %q: %v", p, err)
	}
}
