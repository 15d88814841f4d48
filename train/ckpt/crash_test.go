package ckpt

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// childEnv makes the test binary a checkpoint writer (see TestMain).
const childEnv = "HPCRUN_CKPT_CRASH_CHILD"

func TestMain(m *testing.M) {
	if root := os.Getenv(childEnv); root != "" {
		if err := saveForever(root); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashInfos are the tensors of the crash test's pretend model, split over
// 2 TP ranks.
var crashInfos = []TensorInfo{
	{Name: "wte.weight", Full: []int{256, 64}, Split: true, Dim: 0, Rows: 250},
	{Name: "h.0.attn.c_attn.weight", Full: []int{192, 64}, Split: true, Dim: 0, Blocks: 3},
	{Name: "h.0.attn.c_proj.weight", Full: []int{64, 64}, Split: true, Dim: 1},
	{Name: "ln_f.weight", Full: []int{64}},
}

// The points of a save that the writer reports on its stdout, in order,
// as "STEP POINT" lines.
var savePoints = []string{"prepared", "model0", "optim0", "model1", "optim1", "state", "committed"}

// saveForever saves checkpoints of steps latest+1, latest+2, ... under root
// the way the trainer does (2 TP ranks), every value equal to the step,
// until it is killed, and reports each point of each save it has passed.
func saveForever(root string) error {
	report := func(step int, point string) { fmt.Printf("%d %s\n", step, point) }
	step := 0
	if dir, err := Latest(root); err != nil {
		return err
	} else if dir != "" {
		step, _ = strconv.Atoi(filepath.Base(dir)[len("step-"):])
	}
	for {
		step++
		tmp, err := Prepare(root, step, 2)
		if err != nil {
			return err
		}
		report(step, "prepared")
		for r := 0; r < 2; r++ {
			var ts []Tensor
			for _, ti := range crashInfos {
				shape := ti.Shard(r, 2).LocalShape(ti.Full)
				vals := make([]float32, numel(shape))
				for i := range vals {
					vals[i] = float32(step)
				}
				ts = append(ts, Tensor{Name: ti.Name, Shape: shape, Data: vals})
			}
			if err := WriteModel(tmp, r, 2, step, ts); err != nil {
				return err
			}
			report(step, fmt.Sprint("model", r))
			if err := WriteOptim(tmp, r, 0, step, step, ts, ts); err != nil {
				return err
			}
			report(step, fmt.Sprint("optim", r))
		}
		st := &State{Format: Format, Step: step, Model: "gpt", Vocab: 250, Config: json.RawMessage(`{}`),
			Mesh: Mesh{TP: 2, DP: 1, World: 2}, Tensors: crashInfos}
		if err := WriteState(tmp, st); err != nil {
			return err
		}
		report(step, "state")
		if _, err := Commit(root, step, 2); err != nil {
			return err
		}
		report(step, "committed")
	}
}

// TestKillDuringSave starts a writer process (this test binary) that saves
// checkpoints in a loop and kills it with SIGKILL, many times over the same
// root, at a point chosen by the writer's progress (not by wall time, which
// a loaded machine's process start-up eats): as soon as it reports having
// passed a chosen point of the save of its second or third step, so that
// every round has committed at least once and the kills fall in every part
// of a save. Every time, latest must name a complete checkpoint that loads
// and whose every value is its step, and the step never goes back.
func TestKillDuringSave(t *testing.T) {
	root := t.TempDir()
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	rng := rand.New(rand.NewPCG(1, 2))
	last, torn, midSave := 0, 0, 0
	for i := 0; i < rounds; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+root)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		nth, point := 1+rng.IntN(2), savePoints[i%len(savePoints)]
		var first, at int
		var passed string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Sscanf(sc.Text(), "%d %s", &at, &passed)
			if first == 0 {
				first = at
			}
			if at == first+nth && passed == point {
				break
			}
		}
		cmd.Process.Kill()
		io.Copy(io.Discard, out)
		if err := cmd.Wait(); err != nil && cmd.ProcessState.ExitCode() != -1 {
			t.Fatalf("writer failed by itself: %v", err)
		}
		if at != first+nth || passed != point {
			t.Fatalf("round %d: the writer stopped reporting at step %d %q", i, at, passed)
		}
		if point != "committed" {
			midSave++
		}
		if ents, _ := filepath.Glob(filepath.Join(root, ".tmp-*")); len(ents) > 0 {
			torn++
		}
		dir, err := Latest(root)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if dir == "" {
			t.Fatalf("round %d: latest names nothing after a commit", i)
		}
		c, err := Open(dir, true)
		if err != nil {
			t.Fatalf("round %d: latest names a broken checkpoint: %v", i, err)
		}
		step := c.State.Step
		if step < last {
			t.Fatalf("round %d: latest went back from step %d to %d", i, last, step)
		}
		last = step
		for _, ti := range crashInfos {
			for _, kind := range []string{"", "m", "v"} {
				vals, err := c.Full(kind, ti.Name)
				if err != nil {
					t.Fatal(err)
				}
				for _, v := range vals {
					if v != float32(step) {
						t.Fatalf("round %d: %s %s of step %d holds %v", i, kind, ti.Name, step, v)
					}
				}
			}
		}
		if steps, _ := List(root); len(steps) > 3 {
			t.Fatalf("round %d: %d step dirs kept, want at most 2 (+1 torn)", i, len(steps))
		}
	}
	t.Logf("%d kills, %d of them ordered mid-save, %d left a temporary dir, last step %d", rounds, midSave, torn, last)
	if last == 0 || midSave == 0 {
		t.Fatalf("the writer never committed (%d) or was never killed mid-save (%d): the test proves nothing", last, midSave)
	}
}
