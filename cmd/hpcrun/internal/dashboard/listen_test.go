package dashboard

import (
	"os"
	"regexp"
	"testing"
)

func TestListenHelpers(t *testing.T) {
	if DefaultPort(1000) != 21000 || DefaultPort(12345) != 22345 || DefaultPort(-1) != 20000 {
		t.Error("DefaultPort")
	}
	a, err := NewToken()
	if b, _ := NewToken(); err != nil || a == b || !regexp.MustCompile(`^[0-9a-f]{48}$`).MatchString(a) {
		t.Errorf("tokens %q, %q, %v", a, b, err)
	}
	for host, want := range map[string]bool{"127.0.0.1": true, "::1": true, "localhost": true, "0.0.0.0": false, "": false, "10.0.0.2": false, "login1": false} {
		if Loopback(host) != want {
			t.Errorf("Loopback(%q) = %v", host, !want)
		}
	}
	if u := URL("127.0.0.1", "127.0.0.1:20001", "tok"); u != "http://127.0.0.1:20001/?token=tok" {
		t.Errorf("loopback URL %q", u)
	}
	h, _ := os.Hostname()
	if u := URL("0.0.0.0", "[::]:20001", "tok"); u != "http://"+h+":20001/?token=tok" {
		t.Errorf("unspecified address: URL %q, want this host's name", u)
	}
}

// Host writes inet_aton's short IPv4 forms whole, as the shells' tools
// read them, and leaves anything else as it is.
func TestHost(t *testing.T) {
	for in, want := range map[string]string{
		"127.1": "127.0.0.1", "127.0.1": "127.0.0.1", "2130706433": "127.0.0.1", "10.1.65535": "10.1.255.255",
		"127.0.0.1": "127.0.0.1", "localhost": "localhost", "": "", "::1": "::1", "1.2.3.4.5": "1.2.3.4.5",
		"256.1": "256.1", "127.16777216": "127.16777216", "node12": "node12",
	} {
		if got := Host(in); got != want {
			t.Errorf("Host(%q) = %q, want %q", in, got, want)
		}
	}
}
