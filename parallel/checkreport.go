package parallel

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/hpcrun/hpcrun/internal/units"
)

// checkColumns are the measures WriteChecks shows, one column each.
var checkColumns = []struct{ what, head string }{
	{"forward output", "FORWARD"},
	{"input gradient", "INPUT GRAD"},
	{"weight gradients", "WEIGHT GRADS"},
	{"weights after AdamW", "ADAMW STEP"},
}

// WriteChecks prints hpcrun check's table of results, run on tp ranks in
// dp groups: a row a check, a column a measure, the largest error and the
// verdict, then every other measure, and each failure in full.
func WriteChecks(w io.Writer, results []*Result, tp, dp int) {
	fmt.Fprintf(w, "tensor-parallel checks: tp %d, %s; norm-relative error vs the unsharded layer, tolerance %.0e\n\n",
		tp, units.Count(dp, "group"), Tolerance)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "LAYER\tTP")
	for _, col := range checkColumns {
		fmt.Fprint(tw, "\t", col.head)
	}
	fmt.Fprint(tw, "\tMAX\tRESULT\n")
	failed := 0
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d", r.Check, r.TP)
		for _, col := range checkColumns {
			if e, ok := r.Max(col.what); ok {
				fmt.Fprintf(tw, "\t%.2g", e)
			} else {
				fmt.Fprint(tw, "\t-")
			}
		}
		verdict := "PASS"
		if !r.Pass() {
			verdict = "FAIL"
			failed++
		}
		fmt.Fprintf(tw, "\t%.2g\t%s\n", r.MaxErr(), verdict)
	}
	tw.Flush()
	for _, r := range results {
		for _, m := range r.Measures {
			switch {
			case hasColumn(m.What):
			case strings.HasSuffix(m.What, " calls"): // a count of collectives, no error
				fmt.Fprintf(w, "%s: %s\n", r.Check, m.What)
			default:
				fmt.Fprintf(w, "%s: %s: error %.2g\n", r.Check, m.What, m.Err)
			}
		}
		if r.Fail != "" {
			fmt.Fprintf(w, "%s FAILED: %s\n", r.Check, r.Fail)
		}
		if !r.Pass() {
			for _, m := range r.Measures {
				if m.Err > Tolerance {
					fmt.Fprintf(w, "%s FAILED: %s %s error %.3g\n", r.Check, m.What, m.Param, m.Err)
				}
			}
		}
	}
	if failed > 0 {
		fmt.Fprintf(w, "\n%d of %d checks FAILED\n", failed, len(results))
	} else {
		fmt.Fprintf(w, "\nall %d checks passed\n", len(results))
	}
}

// hasColumn reports whether the measure what has a column of its own.
func hasColumn(what string) bool {
	for _, col := range checkColumns {
		if col.what == what {
			return true
		}
	}
	return false
}

// CheckReport is hpcrun check --json: the results of the checks run on
// TP ranks in DP groups.
type CheckReport struct {
	TP        int           `json:"tp"`
	DP        int           `json:"dp"`
	Tolerance float64       `json:"tolerance"`
	Results   []CheckResult `json:"results"`
}

// CheckResult is one check's result in a CheckReport.
type CheckResult struct {
	Check    string    `json:"check"`
	TP       int       `json:"tp"`
	Pass     bool      `json:"pass"`
	MaxErr   float64   `json:"max_err"`
	Fail     string    `json:"fail,omitempty"`
	Measures []Measure `json:"measures"`
}

// NewCheckReport is the report of results run on tp ranks in dp groups.
func NewCheckReport(results []*Result, tp, dp int) CheckReport {
	out := CheckReport{TP: tp, DP: dp, Tolerance: Tolerance}
	for _, r := range results {
		out.Results = append(out.Results, CheckResult{r.Check, r.TP, r.Pass(), r.MaxErr(), r.Fail, r.Measures})
	}
	return out
}

// CheckNames are the names of Checks, in order, as `hpcrun check NAME`
// takes them.
func CheckNames() []string {
	var names []string
	for _, c := range Checks() {
		names = append(names, c.Name)
	}
	return names
}
