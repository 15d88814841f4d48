package dashboard

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
)

// DefaultPort is the default port of hpcrun serve for uid: one of its own
// (20000-29999, below Linux's ephemeral ports), so that the users of a
// shared login node do not all ask for the same.
func DefaultPort(uid int) int {
	return 20000 + max(uid, 0)%10000
}

// NewToken is a fresh access token (Options.Token): 24 random bytes in hex.
func NewToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// Loopback reports whether host (of the address the dashboard binds) is
// reachable from this machine only.
func Loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// URL is the address to open for the dashboard listening on addr (the
// listener's) after binding host: this machine's name in place of an
// unspecified address, and the token.
func URL(host, addr, token string) string {
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			_, port, _ := net.SplitHostPort(addr)
			addr = net.JoinHostPort(h, port)
		}
	}
	return "http://" + addr + "/?token=" + token
}
