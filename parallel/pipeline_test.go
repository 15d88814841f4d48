package parallel

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestOneFOneBGolden(t *testing.T) {
	for _, tc := range []struct {
		stages, stage, micro int
		want                 string
	}{
		{1, 0, 3, "F0 B0 F1 B1 F2 B2"},
		{2, 0, 4, "F0 F1 B0 F2 B1 F3 B2 B3"},
		{2, 1, 4, "F0 B0 F1 B1 F2 B2 F3 B3"},
		{4, 0, 6, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"},
		{4, 1, 6, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"},
		{4, 0, 2, "F0 F1 B0 B1"},
	} {
		var got []string
		for _, op := range OneFOneB(tc.stages, tc.stage, tc.micro) {
			got = append(got, op.String())
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("stage %d of %d, %d micro-batches: %s, want %s", tc.stage, tc.stages, tc.micro, s, tc.want)
		}
	}
}

// TestOneFOneBDefinition checks every stage's schedule against the
// definition of 1F1B: each micro-batch forwarded then backwarded once, in
// order; a warm-up of stages-stage-1 forwards; then forwards and backwards
// alternate until the forwards run out; at most stages-stage in flight. It
// then runs all stages together, each op taking one time unit once its
// neighbour's op it depends on is done: nothing deadlocks and the step
// takes 2(m+p-1) units, the theoretical bubble (p-1)/(m+p-1).
func TestOneFOneBDefinition(t *testing.T) {
	for p := 1; p <= 5; p++ {
		for m := p; m <= p+5; m++ {
			scheds := make([][]PipeOp, p)
			for s := range p {
				ops := OneFOneB(p, s, m)
				scheds[s] = ops
				if err := check1F1B(ops, p, s, m); err != nil {
					t.Fatalf("p %d stage %d m %d: %v: %v", p, s, m, err, ops)
				}
			}
			span := simulate(t, scheds)
			if span != 2*(m+p-1) {
				t.Errorf("p %d m %d: the step takes %d units, want 2(m+p-1) = %d", p, m, span, 2*(m+p-1))
			}
			idle := float64(span-2*m) / float64(span)
			if math.Abs(idle-BubbleFraction(p, m)) > 1e-12 {
				t.Errorf("p %d m %d: idle %.4f, BubbleFraction %.4f", p, m, idle, BubbleFraction(p, m))
			}
		}
	}
}

func check1F1B(ops []PipeOp, p, s, m int) error {
	if len(ops) != 2*m {
		return fmt.Errorf("%d ops, want %d", len(ops), 2*m)
	}
	warm := min(p-s-1, m)
	nextF, nextB := 0, 0
	for k, op := range ops {
		switch {
		case !op.Backward && op.Micro != nextF:
			return fmt.Errorf("op %d forwards %d, want %d", k, op.Micro, nextF)
		case op.Backward && op.Micro != nextB:
			return fmt.Errorf("op %d backwards %d, want %d", k, op.Micro, nextB)
		case op.Backward && nextB >= nextF:
			return fmt.Errorf("op %d backwards %d before its forward", k, op.Micro)
		}
		if op.Backward {
			nextB++
		} else {
			nextF++
		}
		if nextF-nextB > p-s {
			return fmt.Errorf("op %d: %d in flight, more than %d", k, nextF-nextB, p-s)
		}
		// The shape: warm-up forwards, then F B F B ... while forwards
		// remain, then backwards.
		wantBackward := false
		if k >= warm+2*(m-warm) {
			wantBackward = true
		} else if k >= warm {
			wantBackward = (k-warm)%2 == 1
		}
		if op.Backward != wantBackward {
			return fmt.Errorf("op %d is %v: not the 1F1B shape", k, op)
		}
	}
	return nil
}

// simulate runs the stages' schedules in unit time steps: F(i) on stage s
// waits for F(i) on s-1, B(i) on s for B(i) on s+1 (and F(i) on the last
// stage). It returns the makespan.
func simulate(t *testing.T, scheds [][]PipeOp) int {
	p := len(scheds)
	doneF := make([]map[int]int, p) // micro -> time finished
	doneB := make([]map[int]int, p)
	for s := range p {
		doneF[s], doneB[s] = map[int]int{}, map[int]int{}
	}
	pos := make([]int, p)
	for now := 0; ; now++ {
		finished := true
		var ran []int
		for s := range p {
			if pos[s] == len(scheds[s]) {
				continue
			}
			finished = false
			op := scheds[s][pos[s]]
			ready := true
			if op.Backward {
				if s < p-1 {
					f, ok := doneB[s+1][op.Micro]
					ready = ok && f <= now
				}
			} else if s > 0 {
				f, ok := doneF[s-1][op.Micro]
				ready = ok && f <= now
			}
			if ready {
				ran = append(ran, s)
			}
		}
		if finished {
			return now
		}
		for _, s := range ran {
			op := scheds[s][pos[s]]
			if op.Backward {
				doneB[s][op.Micro] = now + 1
			} else {
				doneF[s][op.Micro] = now + 1
			}
			pos[s]++
		}
		if now > 1000 {
			t.Fatalf("deadlock: positions %v", pos)
		}
	}
}
