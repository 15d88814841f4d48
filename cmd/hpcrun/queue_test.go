package main

import (
	"strings"
	"testing"
)

// TestQueueRefusesUnknownState: queue --state with a state no run can be
// in is a one-line error naming the states, exit 2 (it printed an empty
// table, exit 0); a known state in any case is listed as before.
func TestQueueRefusesUnknownState(t *testing.T) {
	e := newEnv(t)
	for _, args := range [][]string{{"--state", "bogus"}, {"--state", "failed,runing"}, {"-s", "failed", "-s", "bogus"}} {
		out, errOut, code := e.run(append([]string{"queue"}, args...)...)
		if code != 2 || out != "" || strings.Count(strings.TrimSpace(errOut), "\n") > 0 ||
			!strings.Contains(errOut, "not a job state") || !strings.Contains(errOut, "pending, running, completed, failed, cancelled") {
			t.Errorf("queue %v: exit %d, stdout %q, stderr %q; want one line naming the states, exit 2", args, code, out, errOut)
		}
	}
	e.mustRun("queue", "--state", "Failed,not_submitted,OUT_OF_MEMORY")
}
