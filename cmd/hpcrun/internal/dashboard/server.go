// Package dashboard is the web app of hpcrun serve: a read-only view of a
// runs directory (the runs with their job state and failure class, one run
// with its charts, config and log tail, several runs overlaid) served by
// net/http with every asset embedded, no network beyond the listener.
//
// Charts are SVG drawn by the server; one small script replaces a running
// run's charts when the server-sent events of /events/<execid> say its
// files grew (the server polls them with a metrics.Follower). Every request
// must carry the server's token, as ?token= once (then an HttpOnly,
// SameSite=Strict cookie) or the cookie; the token is compared in constant
// time. The package knows the run directory through rundir and the figures
// through train/metrics; the job states come from its caller.
package dashboard

import (
	"context"
	"crypto/subtle"
	"embed"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/slurm"
)

//go:embed assets
var assets embed.FS

// Job is what the scheduler says of one run's job, joined to the run.
type Job struct {
	ExecID   string
	Executor string // slurm, local or run
	Info     slurm.JobInfo
	Failure  failure.Class
	Check    bool // the job runs a parallel check (hpcrun check), which writes no metrics
}

// Options configure a Server.
type Options struct {
	RunsDir string
	// Token is the secret every request must carry; empty refuses all.
	Token string
	// Jobs lists the runs' jobs (hpcrun queue --all's join); nil shows no
	// job states. Its answer is reused for JobsTTL.
	Jobs    func(ctx context.Context) ([]Job, error)
	JobsTTL time.Duration
	// Poll is how often a live page's files are read again (default 1 s).
	Poll time.Duration
	// MaxStreams bounds the live pages followed at once (default 16): each
	// holds its run's steps in memory.
	MaxStreams int
}

// Server is the dashboard's http.Handler.
type Server struct {
	opt     Options
	mux     *http.ServeMux
	tmpl    *template.Template
	sums    summaries
	streams chan struct{}

	jobsMu   sync.Mutex
	jobs     map[string]Job
	jobsErr  error
	jobsTime time.Time
}

// cookieName begins the name of the cookie that carries the token after
// the first request. Browsers send a host's cookies to every port of it,
// so the name ends with the port the browser used (as Jupyter's do): two
// dashboards on one host keep a cookie each instead of overwriting each
// other's. Other servers on the same host still receive it (no browser
// keeps a cookie to one port); HttpOnly and SameSite=Strict keep it from
// scripts and from other sites' requests.
const cookieName = "hpcrun_token"

// cookieFor is the cookie's name for a request to host (host[:port]).
func cookieFor(host string) string {
	_, port, err := net.SplitHostPort(host)
	if err != nil || port == "" {
		port = "80"
	}
	return cookieName + "_" + port
}

// New builds the server.
func New(opt Options) (*Server, error) {
	if opt.Poll <= 0 {
		opt.Poll = time.Second
	}
	if opt.MaxStreams <= 0 {
		opt.MaxStreams = 16
	}
	if opt.JobsTTL <= 0 {
		opt.JobsTTL = 2 * time.Second
	}
	tmpl, err := template.New("").Funcs(funcs).ParseFS(assets, "assets/*.html")
	if err != nil {
		return nil, err
	}
	s := &Server{opt: opt, tmpl: tmpl, sums: summaries{byID: map[string]cached{}},
		streams: make(chan struct{}, opt.MaxStreams)}
	static, _ := fs.Sub(assets, "assets/static")
	s.mux = http.NewServeMux()
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", s.runsPage)
	s.mux.HandleFunc("GET /run/{ref}", s.runPage)
	s.mux.HandleFunc("GET /compare", s.comparePage)
	s.mux.HandleFunc("GET /events/{ref}", s.events)
	return s, nil
}

// ServeHTTP refuses requests without the token and anything but GET and
// HEAD, then serves the pages.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "read-only: GET only", http.StatusMethodNotAllowed)
		return
	}
	if q := r.URL.Query().Get("token"); q != "" {
		if !s.tokenOK(q) {
			http.Error(w, "forbidden: wrong token (open the URL hpcrun serve printed)", http.StatusForbidden)
			return
		}
		http.SetCookie(w, &http.Cookie{Name: cookieFor(r.Host), Value: q, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		// The same page without the token in its address.
		u := *r.URL
		v := u.Query()
		v.Del("token")
		u.RawQuery = v.Encode()
		http.Redirect(w, r, (&url.URL{Path: u.Path, RawQuery: u.RawQuery}).String(), http.StatusSeeOther)
		return
	}
	c, err := r.Cookie(cookieFor(r.Host))
	if err != nil || !s.tokenOK(c.Value) {
		http.Error(w, "forbidden: open the URL hpcrun serve printed (with its ?token=)", http.StatusForbidden)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) tokenOK(t string) bool {
	return s.opt.Token != "" && subtle.ConstantTimeCompare([]byte(t), []byte(s.opt.Token)) == 1
}

// jobsByExecID is the Jobs answer, at most JobsTTL old.
func (s *Server) jobsByExecID(ctx context.Context) (map[string]Job, error) {
	if s.opt.Jobs == nil {
		return nil, nil
	}
	s.jobsMu.Lock()
	defer s.jobsMu.Unlock()
	if s.jobs != nil && time.Since(s.jobsTime) < s.opt.JobsTTL {
		return s.jobs, s.jobsErr
	}
	list, err := s.opt.Jobs(ctx)
	m := make(map[string]Job, len(list))
	for _, j := range list {
		if j.ExecID != "" {
			m[j.ExecID] = j
		}
	}
	s.jobs, s.jobsErr, s.jobsTime = m, err, time.Now()
	return m, err
}

// Warm reads every run's summary once, so that the first page is served
// from the cache.
func (s *Server) Warm() {
	if dirs, err := listDirs(s.opt.RunsDir); err == nil {
		s.sums.get(dirs)
	}
}

func (s *Server) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := s.tmpl.ExecuteTemplate(w, name, data); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
