package parallel

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func reportResults() []*Result {
	return []*Result{
		{Check: "linear", TP: 2, Measures: []Measure{
			{What: "forward output", Err: 1e-7}, {What: "input gradient", Err: 2e-7},
			{What: "weight gradients", Param: "w", Err: 3e-7}, {What: "weights after AdamW", Param: "w", Err: 1e-8},
			{What: "all-reduce calls"},
		}},
		{Check: "mlp", TP: 2, Measures: []Measure{
			{What: "forward output", Err: 1e-7}, {What: "weight gradients", Param: "fc.w", Err: 0.5},
			{What: "loss", Err: 2e-6},
		}},
	}
}

// TestWriteChecks checks the table: a column a known measure ("-" where a
// check has none), the others and the failures in lines below, the count.
func TestWriteChecks(t *testing.T) {
	var b bytes.Buffer
	WriteChecks(&b, reportResults(), 2, 1)
	out := b.String()
	for _, want := range []string{
		"tensor-parallel checks: tp 2, 1 group; norm-relative error vs the unsharded layer, tolerance 1e-05\n\n",
		"LAYER   TP  FORWARD  INPUT GRAD  WEIGHT GRADS  ADAMW STEP  MAX    RESULT\n",
		"linear  2   1e-07    2e-07       3e-07         1e-08       3e-07  PASS\n",
		"mlp     2   1e-07    -           0.5           -           0.5    FAIL\n",
		"linear: all-reduce calls\n",
		"mlp: loss: error 2e-06\n",
		"mlp FAILED: weight gradients fc.w error 0.5\n",
		"\n1 of 2 checks FAILED\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	WriteChecks(&b, reportResults()[:1], 2, 3)
	if !strings.Contains(b.String(), "tp 2, 3 groups") || !strings.HasSuffix(b.String(), "\nall 1 checks passed\n") {
		t.Errorf("passing table:\n%s", b.String())
	}
}

func TestCheckReportJSON(t *testing.T) {
	rep := NewCheckReport(reportResults(), 2, 1)
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		TP, DP    int
		Tolerance float64
		Results   []struct {
			Check  string
			Pass   bool
			MaxErr float64 `json:"max_err"`
		}
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.TP != 2 || back.DP != 1 || back.Tolerance != Tolerance || len(back.Results) != 2 ||
		!back.Results[0].Pass || back.Results[1].Pass || back.Results[1].MaxErr != 0.5 {
		t.Errorf("report: %s", b)
	}
}

func TestCheckNames(t *testing.T) {
	names := CheckNames()
	if len(names) != len(Checks()) || names[0] != "ColumnParallelLinear" {
		t.Errorf("CheckNames = %v", names)
	}
}
