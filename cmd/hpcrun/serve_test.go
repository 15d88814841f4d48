package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestServeRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--addr", "8787"}, "want HOST:PORT"},
		{[]string{"serve", "--token", "short"}, "at least 16 characters"},
		{[]string{"serve", "extra"}, "serve takes no arguments"},
		{[]string{"serve", "--addr", "203.0.113.1:1", "--expose", "--token", "0123456789abcdef"}, "serve: listen tcp"},
	} {
		out, err := runApp(t, append(tt.args, "--runs-dir", dir)...)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v (%s), want one line with %q", tt.args, err, out, tt.want)
		}
	}
}

// lockedBuffer is a bytes.Buffer that the server goroutine and the test
// share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An address other machines can reach needs --expose (a token does not
// do instead), and then serve warns; on loopback it prints the ssh -L
// line. A URL never names the unspecified address ([::] or 0.0.0.0).
func TestServeWarnsOffLoopback(t *testing.T) {
	for _, args := range [][]string{
		{"--addr", "0.0.0.0:0"},
		{"--addr", "0.0.0.0:0", "--token", "0123456789abcdef0123"},
		{"--addr", ":0"},
	} {
		_, err := runApp(t, append(append([]string{"serve"}, args...), "--runs-dir", t.TempDir())...)
		if err == nil || !strings.Contains(err.Error(), "reachable from other machines") || !strings.Contains(err.Error(), "--expose") {
			t.Errorf("%v: %v, want a refusal that names --expose", args, err)
		}
	}
	for _, tt := range []struct {
		args             []string
		warn, sshForward bool
	}{
		{[]string{"--addr", "0.0.0.0:0", "--expose"}, true, false},
		{[]string{"--addr", "0.0.0.0:0", "--expose", "--token", "0123456789abcdef0123"}, true, false},
		{[]string{"--addr", ":0", "--expose"}, true, false},
		{[]string{"--addr", "127.0.0.1:0"}, false, true},
		{[]string{"--addr", "127.1:0"}, false, true}, // inet_aton's short form: loopback, and bound
	} {
		ctx, cancel := context.WithCancel(context.Background())
		app := newApp()
		var out, errOut lockedBuffer
		app.Writer, app.ErrWriter = &out, &errOut
		done := make(chan error, 1)
		go func() {
			done <- app.RunContext(ctx, append([]string{"hpcrun", "serve", "--runs-dir", t.TempDir()}, tt.args...))
		}()
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(out.String(), "?token=") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if got := strings.Contains(errOut.String(), "warning"); got != tt.warn {
			t.Errorf("%v: warning printed %v, want %v: %q", tt.args, got, tt.warn, errOut.String())
		}
		if strings.Contains(out.String(), "http://[::]") || strings.Contains(out.String(), "http://0.0.0.0") {
			t.Errorf("%v: the URL names the unspecified address: %q", tt.args, out.String())
		}
		if got := strings.Contains(out.String(), "ssh -L"); got != tt.sshForward {
			t.Errorf("%v: ssh -L line %v, want %v: %q", tt.args, got, tt.sshForward, out.String())
		}
	}
}

// A port in use says how to pick another, in one line; the default port
// is the user's own (20000 + uid % 10000), not one all users share.
func TestServeBusyPortAndDefault(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = runApp(t, "serve", "--addr", ln.Addr().String(), "--runs-dir", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "--addr 127.0.0.1:0") || strings.Contains(err.Error(), "\n") {
		t.Errorf("serve on a busy port: %v", err)
	}
	help, _ := runApp(t, "serve", "--help")
	if want := fmt.Sprintf("127.0.0.1:%d", 20000+os.Getuid()%10000); !strings.Contains(help, want) {
		t.Errorf("serve --help: the default address is not %s:\n%s", want, help)
	}
}
