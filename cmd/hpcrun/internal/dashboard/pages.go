package dashboard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/metrics"
)

var funcs = template.FuncMap{
	"num": num, "pct": pct, "dur": dur, "size": size, "exact": exact, "plural": plural,
	"svg": func(c Chart) template.HTML { return c.SVG() },
}

func listDirs(runsDir string) ([]rundir.Dir, error) {
	runs, err := rundir.List(runsDir)
	if err != nil {
		return nil, err
	}
	dirs := make([]rundir.Dir, len(runs))
	for i, r := range runs {
		dirs[i] = r.Dir
	}
	return dirs, nil
}

// runRow is one line of the runs page.
type runRow struct {
	ExecID   string
	Job      Job
	HasJob   bool
	Sum      metrics.Summary
	Err      string
	Progress float64 // 0-100
}

// Layout is "tp 2 x dp 2", "pp 2 x tp 2 x dp 1 + sp", ...
func (r runRow) Layout() string { return r.Sum.Config.Layout() }

// StatusNote is the metrics' status beside the job's state, when it says
// more than the state does ("interrupted" beside CANCELLED; nothing
// beside COMPLETED).
func (r runRow) StatusNote() string { return statusNote(r.HasJob, r.Job, r.Sum) }

// FailureNote is the failure class of the run, unless the job's state
// says the same ("cancelled" beside CANCELLED).
func (r runRow) FailureNote() string {
	if !r.HasJob || strings.EqualFold(string(r.Job.Failure), string(r.Job.Info.State)) {
		return ""
	}
	return string(r.Job.Failure)
}

func statusNote(hasJob bool, j Job, s metrics.Summary) string {
	if hasJob && strings.EqualFold(strings.ReplaceAll(string(j.Info.State), "_", " "), s.Status) {
		return ""
	}
	if hasJob && j.Info.State == slurm.Cancelled && s.Status == metrics.StatusInterrupted {
		return "" // a cancelled run stops with a checkpoint: the state says it
	}
	return s.Status
}

// settle reconciles a summary with its job once the job is over, as
// hpcrun metrics does (metrics.Summary.Settle).
func settle(s *metrics.Summary, hasJob bool, j Job, execID string) {
	if hasJob {
		s.Settle(metrics.JobState{State: string(j.Info.State), Over: j.Info.State.Done(), Reason: j.Info.Reason, Check: j.Check, ExecID: execID})
	}
}

// plural is "1 run", "2 runs".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func (s *Server) runsPage(w http.ResponseWriter, r *http.Request) {
	dirs, err := listDirs(s.opt.RunsDir)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	jobs, jobsErr := s.jobsByExecID(r.Context())
	sums := s.sums.get(dirs)
	rows := make([]runRow, 0, len(dirs))
	for i := len(dirs) - 1; i >= 0; i-- { // newest first
		row := runRow{ExecID: dirs[i].ExecID(), Sum: sums[i].sum}
		row.Job, row.HasJob = jobs[row.ExecID]
		settle(&row.Sum, row.HasJob, row.Job, row.ExecID)
		if sums[i].err != nil {
			row.Err = sums[i].err.Error()
		}
		if t := row.Sum.TotalSteps; t > 0 {
			row.Progress = min(100, 100*float64(row.Sum.Step)/float64(t))
		}
		rows = append(rows, row)
	}
	data := struct {
		RunsDir string
		Rows    []runRow
		JobsErr error
		Now     string
	}{s.opt.RunsDir, rows, jobsErr, time.Now().Format(time.TimeOnly)}
	s.render(w, "runs.html", data)
}

// runView is the run page and its live fragments.
type runView struct {
	ExecID  string
	JobID   string
	Job     Job
	HasJob  bool
	Verdict failure.Verdict
	Sum     metrics.Summary
	Charts  runCharts
	Config  string
	Plan    []planRow // nil when the run recorded no plan
	LogOut  string
	LogErr  string
	Live    bool
}

// findRun resolves a page's run reference as every command does.
func (s *Server) findRun(w http.ResponseWriter, ref string) (rundir.Run, bool) {
	run, err := rundir.Find(s.opt.RunsDir, ref)
	if err != nil {
		code := http.StatusBadRequest // not a run's name, or a prefix of several
		if errors.Is(err, rundir.ErrNotFound) {
			code = http.StatusNotFound
		}
		http.Error(w, err.Error(), code)
		return rundir.Run{}, false
	}
	return run, true
}

// view builds a run's page: its summary read in one streaming pass (the
// figures of hpcrun metrics), its step charts from smp, which reads what
// the rank files gained since its last call (a fresh sampler reads them
// whole). Neither keeps the run's steps.
func (s *Server) view(r *http.Request, run rundir.Run, smp *sampler) (runView, error) {
	sum, curves, err := metrics.ReadSummary(run.Dir.Path(), metrics.NoCurves)
	if err != nil {
		return runView{}, err
	}
	if err := smp.read(); err != nil {
		return runView{}, err
	}
	v := runView{ExecID: run.ExecID, JobID: run.JobID, Sum: sum, Charts: chartsOf(sum, curves, smp)}
	jobs, _ := s.jobsByExecID(r.Context())
	v.Job, v.HasJob = jobs[run.ExecID]
	settle(&v.Sum, v.HasJob, v.Job, run.ExecID)
	if v.HasJob {
		v.Verdict = failure.Of(run.Dir, v.Job.Info)
	} else {
		v.Verdict = failure.Of(run.Dir, slurm.JobInfo{ID: run.JobID})
	}
	v.Config = readSmall(run.Dir.Config())
	v.Plan = planOf(run.Dir, sum)
	if run.JobID != "" {
		v.LogOut, _ = tailLines(run.Dir.Log(run.JobID, false), 40)
		v.LogErr, _ = tailLines(run.Dir.Log(run.JobID, true), 40)
	}
	v.Live = !slices.Contains([]string{metrics.StatusCompleted, metrics.StatusFailed, metrics.StatusInterrupted}, sum.Status)
	if v.HasJob && v.Job.Info.State.Done() {
		v.Live = false
	}
	return v, nil
}

func (s *Server) runPage(w http.ResponseWriter, r *http.Request) {
	run, ok := s.findRun(w, r.PathValue("ref"))
	if !ok {
		return
	}
	v, err := s.view(r, run, newSampler(run.Dir))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.render(w, "run.html", v)
}

// events streams a run's summary, charts and logs as server-sent events
// ("update", a JSON object of element id -> HTML) whenever its files
// change, until the client goes away.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	run, ok := s.findRun(w, r.PathValue("ref"))
	if !ok {
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		http.Error(w, fmt.Sprintf("too many live pages (%d): close some", s.opt.MaxStreams), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	smp := newSampler(run.Dir)
	last := ""
	ping := time.Now()
	for {
		wait := s.opt.Poll
		if key := fileKey(run.Dir); key != last {
			last = key
			start := time.Now()
			v, err := s.view(r, run, smp)
			if err != nil {
				fmt.Fprintf(w, "event: problem\ndata: %s\n\n", jsonString(err.Error()))
			} else if msg, err := s.fragments(v); err == nil {
				fmt.Fprintf(w, "event: update\ndata: %s\n\n", msg)
			}
			flusher.Flush()
			ping = time.Now()
			// A run whose summary takes long to read is read less often:
			// at most a fifth of the time goes to it.
			wait = max(wait, 4*time.Since(start))
		} else if time.Since(ping) > 15*time.Second {
			fmt.Fprint(w, ": ping\n\n")
			flusher.Flush()
			ping = time.Now()
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(wait):
		}
	}
}

// fragments renders the live parts of the run page as one line of JSON.
func (s *Server) fragments(v runView) ([]byte, error) {
	out := map[string]string{}
	for id, tmpl := range map[string]string{"summary": "summary", "plan-section": "plan", "charts": "charts", "logs": "logs"} {
		var b bytes.Buffer
		if err := s.tmpl.ExecuteTemplate(&b, tmpl, v); err != nil {
			return nil, err
		}
		out[id] = b.String()
	}
	return json.Marshal(out)
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// compareView is the compare page.
type compareView struct {
	Runs   []runView
	Charts []Chart
	Refs   []string
}

func (s *Server) comparePage(w http.ResponseWriter, r *http.Request) {
	refs := r.URL.Query()["run"]
	if len(refs) == 0 {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	if len(refs) > 12 {
		http.Error(w, "compare at most 12 runs", http.StatusBadRequest)
		return
	}
	cv := compareView{Refs: refs}
	loss := Chart{ID: "cmp_loss", Title: "training loss", XLabel: "step", YLabel: "loss"}
	eval := Chart{ID: "cmp_eval_loss", Title: "eval loss", XLabel: "step", YLabel: "loss"}
	tok := Chart{ID: "cmp_tokens_per_s", Title: "throughput", XLabel: "step", YLabel: "tokens/s"}
	step := Chart{ID: "cmp_step_time", Title: "step time (slowest rank)", XLabel: "step", YLabel: "seconds"}
	for _, ref := range refs {
		run, ok := s.findRun(w, ref)
		if !ok {
			return
		}
		v, err := s.view(r, run, newSampler(run.Dir))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		name := run.ExecID
		add := func(c *Chart, from Series) {
			from.Name = name
			c.Series = append(c.Series, from)
		}
		add(&loss, v.Charts.Loss.Series[0])
		add(&eval, v.Charts.Loss.Series[1])
		add(&tok, v.Charts.Tokens.Series[0])
		add(&step, v.Charts.StepTime.Series[0])
		v.Charts = runCharts{} // the page keeps the overlays only
		cv.Runs = append(cv.Runs, v)
	}
	cv.Charts = []Chart{loss, eval, tok, step}
	s.render(w, "compare.html", cv)
}
