package slurm

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// States is a set of job states to keep (hpcrun queue --state).
type States map[State]bool

// ParseStates reads states given as comma-separated lists, in any case
// ("failed,cancelled"); none, an empty set.
func ParseStates(lists []string) States {
	states := States{}
	for _, v := range lists {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				states[State(strings.ToUpper(s))] = true
			}
		}
	}
	return states
}

// Filter keeps the rows in one of the states (all of them when the set is
// empty), reusing rows' array.
func (states States) Filter(rows []QueueRow) []QueueRow {
	if len(states) == 0 {
		return rows
	}
	kept := rows[:0]
	for _, r := range rows {
		if states[r.State] {
			kept = append(kept, r)
		}
	}
	return kept
}

// WriteQueue prints the rows as hpcrun queue's table: where a job runs, or
// in parentheses why it waits or how it failed.
func WriteQueue(w io.Writer, rows []QueueRow) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "EXECID\tJOBID\tNAME\tSTATE\tELAPSED\tNODES\tNODELIST(REASON)\tEXECUTOR")
	for _, r := range rows {
		where := r.NodeList
		if r.Reason != "" {
			where = "(" + FirstLine(r.Reason) + ")"
		}
		if r.Failure != "" {
			where = "(" + r.Failure + ")"
		}
		exec := r.ExecID
		if exec == "" {
			exec = "-"
		}
		jobid := r.JobID
		if jobid == "" {
			jobid = "-"
		}
		nodes := "-"
		if r.Nodes > 0 {
			nodes = fmt.Sprint(r.Nodes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", exec, jobid, r.Name, r.State, r.Elapsed, nodes, where, r.Executor)
	}
	return tw.Flush()
}

// FirstLine is s up to its first newline.
func FirstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
