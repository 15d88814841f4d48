package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

func queueCommand() *cli.Command {
	return &cli.Command{
		Name:  "queue",
		Usage: "list your jobs, their state and their execids",
		Description: "Shows your pending and running jobs (squeue --me) joined with the runs in the runs dir,\n" +
			"local-executor runs included. --all adds finished runs (from scontrol, sacct when\n" +
			"accounting is on, or the state recorded in meta.json).",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "include finished runs (and those whose submission failed)"},
			&cli.StringSliceFlag{Name: "state", Aliases: []string{"s"}, Usage: "only runs in these `STATES` (comma-separated, e.g. failed,cancelled; implies --all)"},
			&cli.StringFlag{Name: "name", Usage: "only jobs whose name contains `TEXT`"},
			&cli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "redraw every --interval until interrupted"},
			&cli.DurationFlag{Name: "interval", Value: 2 * time.Second, Usage: "refresh period of --watch"},
		},
		Action: runQueue,
	}
}

// queueRow is one line of hpcrun queue (and one object of --json).
type queueRow struct {
	ExecID   string      `json:"execid,omitempty"`
	JobID    string      `json:"jobid"`
	Name     string      `json:"name"`
	State    slurm.State `json:"state"`
	Elapsed  string      `json:"elapsed"`
	Nodes    int         `json:"nodes"`
	NodeList string      `json:"nodelist,omitempty"`
	Reason   string      `json:"reason,omitempty"`
	Failure  string      `json:"failure,omitempty"` // the failure class of a run that ended badly (failure.Classes)
	Executor string      `json:"executor"`
	RunDir   string      `json:"run_dir,omitempty"`
}

func runQueue(c *cli.Context) error {
	dir, err := runsDir(c)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	states := map[slurm.State]bool{}
	for _, v := range c.StringSlice("state") {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				states[slurm.State(strings.ToUpper(s))] = true
			}
		}
	}
	all := c.Bool("all") || len(states) > 0
	for {
		rows, err := queueRows(ctx, dir, all, c.String("name"))
		if err != nil && rows == nil {
			return err
		}
		if len(states) > 0 {
			kept := rows[:0]
			for _, r := range rows {
				if states[r.State] {
					kept = append(kept, r)
				}
			}
			rows = kept
		}
		if len(rows) == 0 && !all && !c.Bool("json") && !c.Bool("watch") {
			if n := finishedRuns(dir); n > 0 {
				fmt.Fprintf(os.Stderr, "no live runs; hpcrun queue --all lists the %d finished or not submitted (--state failed,... picks some)\n", n)
				return err
			}
		}
		if c.Bool("watch") && !c.Bool("json") {
			fmt.Print("\033[H\033[2J")
			fmt.Printf("hpcrun queue  %s  (every %s; Ctrl-C to stop)\n\n", time.Now().Format(time.TimeOnly), c.Duration("interval"))
		}
		if err := printQueue(os.Stdout, rows, c.Bool("json")); err != nil {
			return err
		}
		if !c.Bool("watch") {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.Duration("interval")):
		}
	}
}

// queueRows joins the scheduler's queue with the runs dir.
//
// When Slurm is unreachable, the rows are still returned, with an error
// naming the cause when a Slurm run's state could not be known.
func queueRows(ctx context.Context, dir string, all bool, name string) (rows []queueRow, unreachable error) {
	runs, err := slurm.ListRuns(dir)
	if err != nil {
		return nil, err
	}
	affected := false
	active := map[string]slurm.JobInfo{}
	var order []string
	haveSlurm := false
	if _, err := exec.LookPath("squeue"); err == nil {
		haveSlurm = true
		jobs, err := (&slurm.Slurm{}).Queue(ctx, false)
		if errors.Is(err, slurm.ErrNoSlurm) {
			// Local runs can still be listed; Slurm runs say why their
			// state is unknown, and the command fails after the table.
			unreachable = slurmErr(err)
			fmt.Fprintf(os.Stderr, "hpcrun: warning: %v\n", unreachable)
			haveSlurm = false
		} else if err != nil {
			return nil, fmt.Errorf("queue: %w", slurmErr(err))
		}
		for _, j := range jobs {
			active[j.ID] = j
			order = append(order, j.ID)
		}
	}
	seen := map[string]bool{}
	for _, r := range runs {
		m := r.Meta
		if r.Err != nil { // listed, flagged, under --all: its state is unknown
			if all {
				rows = append(rows, queueRow{ExecID: m.ExecID, JobID: "?", Name: "?", State: slurm.Unknown, Nodes: 1,
					Reason: "unreadable meta.json: " + shortErr(strings.TrimPrefix(r.Err.Error(), r.Dir.Meta()+": ")), Executor: "?", RunDir: r.Dir.Path()})
			}
			continue
		}
		row := queueRow{ExecID: m.ExecID, JobID: m.JobID, Name: m.Spec.Name, Executor: m.Executor, RunDir: r.Dir.Path()}
		var j slurm.JobInfo
		switch {
		case m.Executor == "slurm" && m.JobID != "" && active[m.JobID].ID != "":
			j = active[m.JobID]
			seen[m.JobID] = true
		case m.Executor == "slurm" && m.JobID != "" && m.Final == nil && !all:
			continue // not in the queue: over; --all says how it ended
		case m.Executor == "slurm" && m.JobID != "" && m.Final == nil && unreachable != nil:
			j = slurm.JobInfo{ID: m.JobID, State: slurm.Unknown, Reason: "Slurm not reachable"}
			affected = true
		case m.Executor == "slurm" && m.JobID != "" && m.Final == nil && !haveSlurm:
			j = slurm.JobInfo{ID: m.JobID, State: slurm.Unknown, Reason: "no Slurm commands on this machine"}
		default:
			if j, err = runStatus(ctx, r); err != nil {
				if errors.Is(err, slurm.ErrNoSlurm) {
					unreachable, affected = slurmErr(err), true
				}
				j = slurm.JobInfo{ID: m.JobID, State: slurm.Unknown, Reason: err.Error()}
			}
		}
		if (j.State.Done() || j.State == slurm.NotSubmitted) && !all {
			continue
		}
		row.State, row.Elapsed, row.Nodes, row.NodeList, row.Reason = j.State, slurm.FormatElapsed(j.Elapsed), j.Nodes, j.NodeList, j.Reason
		if row.Nodes == 0 && j.State != slurm.NotSubmitted {
			row.Nodes = 1 // a local run, on this machine
		}
		if j.State == slurm.NotSubmitted {
			row.Elapsed = "-"
		}
		row.Failure = string(failure.Of(r.Dir, j).Class)
		rows = append(rows, row)
	}
	for _, id := range order { // the user's jobs that hpcrun did not submit here
		if seen[id] {
			continue
		}
		j := active[id]
		rows = append(rows, queueRow{JobID: id, Name: j.Name, State: j.State, Elapsed: slurm.FormatElapsed(j.Elapsed),
			Nodes: j.Nodes, NodeList: j.NodeList, Reason: j.Reason, Executor: "slurm"})
	}
	if name != "" {
		kept := rows[:0]
		for _, r := range rows {
			if strings.Contains(r.Name, name) {
				kept = append(kept, r)
			}
		}
		rows = kept
	}
	if !affected {
		unreachable = nil
	}
	return rows, unreachable
}

func printQueue(w io.Writer, rows []queueRow, asJSON bool) error {
	if asJSON {
		if rows == nil {
			rows = []queueRow{}
		}
		b, err := json.MarshalIndent(rows, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, string(b))
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "EXECID\tJOBID\tNAME\tSTATE\tELAPSED\tNODES\tNODELIST(REASON)\tEXECUTOR")
	for _, r := range rows {
		where := r.NodeList
		if r.Reason != "" {
			where = "(" + firstLineOf(r.Reason) + ")"
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

// shortErr is an error's text, cut to one short line for a table.
func shortErr(msg string) string {
	s := firstLineOf(msg)
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// finishedRuns is the number of runs under dir, for the hint of a queue
// with no live run.
func finishedRuns(dir string) int {
	runs, _ := slurm.ListRuns(dir)
	return len(runs)
}

func firstLineOf(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
