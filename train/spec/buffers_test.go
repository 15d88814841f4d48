package spec

import (
	"testing"

	"github.com/hpcrun/hpcrun/train/config"
)

// TestModelBuffersFollowTheLayout: the residual stream's buffers hold
// this rank's positions under sequence parallelism, and only the last
// stage has a head.
func TestModelBuffersFollowTheLayout(t *testing.T) {
	c := config.DefaultConfig()
	c.Model, c.BatchSize, c.Seq, c.Dim, c.TP, c.NTasks, c.SP = "gpt", 2, 16, 8, 2, 2, true
	stream, head := ModelBuffers(c, false)
	if len(head) != 0 || len(stream) != 1 || stream.Len() != 2*8*8 {
		t.Errorf("a middle stage under sp: stream %v, head %v", stream, head)
	}
	stream, head = ModelBuffers(c, true)
	if stream.Len() != 2*2*8*8 || len(head) != 0 {
		t.Errorf("the last stage under sp: stream %v, head %v", stream, head)
	}
	if got := StageActivation(c).Len(); got != 2*8*8 {
		t.Errorf("stage activation under sp: %d floats, want %d", got, 2*8*8)
	}
}
