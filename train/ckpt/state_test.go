package ckpt

import (
	"encoding/json"
	"strings"
	"testing"
)

func validState() State {
	return State{Format: Format, Step: 12, Epoch: 1, SamplerPos: 8, RNG: RNG{Kind: rngKind, Seed: 1},
		Model: "gpt", Vocab: 250, Config: json.RawMessage(`{"model":"gpt"}`),
		Mesh: Mesh{TP: 2, DP: 2, PP: 2, World: 8},
		Tensors: []TensorInfo{
			{Name: "wte", Full: []int{256, 32}, Split: true, Rows: 250},
			{Name: "qkv", Full: []int{96, 32}, Split: true, Blocks: 3},
			{Name: "kv", Full: []int{16, 32}, Split: true, Replicas: 2, Shared: 0},
			{Name: "ln", Full: []int{32}},
		}}
}

// Every field of state.json out of its range, or out of step with the
// others, is refused naming the field (sampler_pos -7 panicked a resume).
func TestParseStateRefuses(t *testing.T) {
	good, _ := json.Marshal(validState())
	if _, err := ParseState(good); err != nil {
		t.Fatalf("a valid state: %v", err)
	}
	for _, tc := range []struct {
		set  func(*State)
		want string
	}{
		{func(s *State) { s.Format = 2 }, "format 2, this hpcrun reads format 1"},
		{func(s *State) { s.Step = -1 }, "step -1: must be 0 or more"},
		{func(s *State) { s.SamplerPos = -7 }, "sampler_pos -7: must be 0 or more"},
		{func(s *State) { s.Epoch = -1 }, "epoch -1 at step 12"},
		{func(s *State) { s.Epoch = 1e9 }, "epoch 1000000000 at step 12"},
		{func(s *State) { s.RNG.Kind = "mt19937" }, `rng.kind "mt19937"`},
		{func(s *State) { s.Model = "" }, "model is empty"},
		{func(s *State) { s.Vocab = 0 }, "vocab 0: must be 1 to 16777216"},
		{func(s *State) { s.Vocab = 20_000_000 }, "vocab 20000000"},
		{func(s *State) { s.Config = json.RawMessage(`[1]`) }, "config: "},
		{func(s *State) { s.Config = nil }, "config: "},
		{func(s *State) { s.Mesh.DP = 5e8 }, "mesh.world 8 is not mesh.tp 2 x mesh.dp 500000000 x mesh.pp 2"},
		{func(s *State) { s.Mesh.TP = 0 }, "mesh.tp 0: must be 1 or more"},
		{func(s *State) { s.Mesh.World = -8 }, "mesh.world -8"},
		{func(s *State) { s.Mesh.PP = -1 }, "mesh.pp -1"},
		{func(s *State) { s.Mesh.TP, s.Mesh.DP, s.Mesh.World = 1<<32, 1<<32, 0 }, "mesh.world 0"},
		{func(s *State) { s.Zero = 4 }, "zero 4: must be 0, 1, 2 or 3"},
		{func(s *State) { s.Tensors = nil }, "tensors is empty"},
		{func(s *State) { s.Tensors[1].Name = "wte" }, `tensors[1].name "wte": empty or listed twice`},
		{func(s *State) { s.Tensors[0].Full = []int{-256, 32} }, "tensors[0].full [-256 32]: every dimension must be 1 or more"},
		{func(s *State) { s.Tensors[0].Full = []int{1 << 32, 1 << 32} }, "tensors[0].full [4294967296 4294967296]"},
		{func(s *State) { s.Tensors[3].Full = nil }, "tensors[3].full is empty"},
		{func(s *State) { s.Tensors[0].Rows = 300 }, "tensors[0].rows 300: must be 0 to full[0] = 256 (tensor wte)"},
		{func(s *State) { s.Tensors[0].Dim = 2 }, "tensors[0].dim 2: out of range"},
		{func(s *State) { s.Tensors[0].Dim = -1 }, "tensors[0].dim -1"},
		{func(s *State) { s.Tensors[1].Blocks = 5 }, "tensors[1].full[0] = 96 is not a multiple of 5 blocks x tp 2"},
		{func(s *State) { s.Tensors[1].Blocks = -3 }, "tensors[1].blocks -3"},
		{func(s *State) { s.Tensors[2].Replicas = 3 }, "tensors[2].replicas 3"},
		{func(s *State) { s.Tensors[2].Shared = 9 }, "tensors[2].shared 9"},
	} {
		st := validState()
		tc.set(&st)
		b, _ := json.Marshal(st)
		_, err := ParseState(b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseState: %v, want %q", err, tc.want)
		}
	}
	if _, err := ParseState([]byte(`{"format": 1, "step": "x"}`)); err == nil || !strings.Contains(err.Error(), "the file is corrupt") {
		t.Errorf("ParseState of bad JSON: %v", err)
	}
}

// FuzzParseState: no input panics, and a state it accepts passes its
// checks again and has the ranges the loader relies on.
func FuzzParseState(f *testing.F) {
	good, _ := json.Marshal(validState())
	f.Add(good)
	for _, edit := range []func(*State){
		func(s *State) { s.SamplerPos = -7 },
		func(s *State) { s.Epoch = -1 },
		func(s *State) { s.Epoch = 1e9 },
		func(s *State) { s.Mesh.DP, s.Mesh.World = 5e8, 2e9 },
		func(s *State) { s.Tensors[0].Full = []int{1 << 32, 1 << 32} },
	} {
		st := validState()
		edit(&st)
		b, _ := json.Marshal(st)
		f.Add(b)
	}
	f.Add([]byte(`{"format":1,"mesh":{"tp":-1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseState(b)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("a message of more than one line: %q", err)
			}
			return
		}
		if err := st.Check(); err != nil {
			t.Fatalf("accepted, then refused: %v", err)
		}
		if st.Step < 0 || st.Epoch < 0 || st.Epoch > st.Step || st.SamplerPos < 0 || st.Mesh.TP < 1 || st.Mesh.DP < 1 || st.Mesh.World%st.Mesh.TP != 0 || st.Mesh.World%st.Mesh.DP != 0 {
			t.Fatalf("accepted %+v", st)
		}
		for _, ti := range st.Tensors {
			for _, r := range []int{0, st.Mesh.TP - 1} {
				for _, d := range ti.Shard(r, st.Mesh.TP).LocalShape(ti.Full) {
					if d < 1 {
						t.Fatalf("tensor %s: shard %d of %d has shape %v", ti.Name, r, st.Mesh.TP, ti.Shard(r, st.Mesh.TP).LocalShape(ti.Full))
					}
				}
			}
		}
	})
}
