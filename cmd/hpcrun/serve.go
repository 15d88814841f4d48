package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/dashboard"
	"github.com/hpcrun/hpcrun/cmd/hpcrun/internal/failure"
	"github.com/hpcrun/hpcrun/internal/rundir"
	"github.com/hpcrun/hpcrun/slurm"
	"github.com/urfave/cli/v2"
)

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "a read-only web dashboard of the runs dir (loopback + token; use ssh -L)",
		Description: "Serves the runs (job state, failure class, layout, progress, loss, throughput),\n" +
			"one run (loss, accuracy, lr, grad norm, tokens/s, step time and comm, MFU, memory\n" +
			"per rank, config, log tail; live while it runs) and several runs overlaid.\n" +
			"Everything is embedded: the pages need no network. It binds 127.0.0.1 and prints\n" +
			"a URL with a random token; every request without the token is refused. From your\n" +
			"machine: ssh -L PORT:127.0.0.1:PORT <login node> (the port it prints), then open the URL.\n" +
			"The port is yours: 20000 + your uid % 10000, so that users of one login node differ.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: fmt.Sprintf("127.0.0.1:%d", dashboard.DefaultPort(os.Getuid())), Usage: "listen on `HOST:PORT` (port 0: any free one; default port: 20000 + uid % 10000)"},
			&cli.StringFlag{Name: "token", Usage: "the access `TOKEN` (default: 24 random bytes, printed in the URL)", EnvVars: []string{"HPCRUN_SERVE_TOKEN"}},
			&cli.BoolFlag{Name: "expose", Usage: "allow an --addr other machines can reach (0.0.0.0, :PORT, a public address): anyone who can reach it and learns the token reads the runs"},
		},
		Action: runServe,
	}
}

func runServe(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit("usage: hpcrun serve [--addr HOST:PORT] [--token TOKEN] [--runs-dir DIR]", 2)
	}
	dir, err := runsDir(c)
	if err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(c.String("addr"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("--addr %q: want HOST:PORT, e.g. 127.0.0.1:20000", c.String("addr")), 2)
	}
	host = dashboard.Host(host)
	addr := net.JoinHostPort(host, port)
	token := c.String("token")
	if token == "" {
		if token, err = dashboard.NewToken(); err != nil {
			return fmt.Errorf("serve: token: %w", err)
		}
	} else if len(token) < 16 {
		return cli.Exit("--token: use at least 16 characters", 2)
	}
	loopback := dashboard.Loopback(host)
	if !loopback {
		if !c.Bool("expose") {
			return cli.Exit(fmt.Sprintf("--addr %s is reachable from other machines: bind 127.0.0.1 and use ssh -L, or pass --expose to serve the runs there anyway", c.String("addr")), 2)
		}
		fmt.Fprintf(c.App.ErrWriter, "hpcrun serve: warning: %s is reachable from other machines (--expose): anyone who can reach it and sees the URL's token can read the runs\n", c.String("addr"))
	}
	srv, err := dashboard.New(dashboard.Options{RunsDir: dir, Token: token, Jobs: func(ctx context.Context) ([]dashboard.Job, error) {
		rows, err := queueRows(ctx, dir, true, "")
		jobs := make([]dashboard.Job, 0, len(rows))
		for _, r := range rows {
			j := dashboard.Job{ExecID: r.ExecID, Executor: r.Executor, Failure: failure.Class(r.Failure), Info: slurmInfo(r)}
			if m, err := slurm.ReadMeta(rundir.Dir(r.RunDir)); err == nil && r.RunDir != "" {
				j.Check = isCheck(m)
			}
			jobs = append(jobs, j)
		}
		return jobs, err
	}})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return cli.Exit(fmt.Sprintf("serve: %s is in use (another hpcrun serve?): pick another port with --addr %s:PORT, or --addr %s:0 for any free one", c.String("addr"), host, host), 1)
	}
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv.Warm() // the summaries of every run, read once: the first page comes from the cache
	w := c.App.Writer
	fmt.Fprintf(w, "hpcrun serve: %s (runs in %s)\n", dashboard.URL(host, ln.Addr().String(), token), dir)
	if loopback {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		fmt.Fprintf(w, "from your machine: ssh -L %s:%s %s, then open the URL; Ctrl-C stops\n", port, ln.Addr().String(), slurm.Host())
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(shut)
		_ = hs.Close() // live pages hold their streams open
	}()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// slurmInfo is a queue row as the scheduler's job description.
func slurmInfo(r slurm.QueueRow) slurm.JobInfo {
	return slurm.JobInfo{ID: r.JobID, Name: r.Name, State: r.State, Reason: r.Reason, Nodes: r.Nodes, NodeList: r.NodeList}
}
