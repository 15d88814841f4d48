package dashboard

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"strconv"
	"strings"
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

// Host is the host of an --addr as the dashboard binds it: an IPv4
// address in the short forms inet_aton reads (127.1, 127.0.1, 2130706433),
// which Go's resolver does not, written out whole (127.0.0.1); any other
// host as it is.
func Host(host string) string {
	if host == "" || net.ParseIP(host) != nil || strings.Trim(host, "0123456789.") != "" {
		return host
	}
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return host
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return host
		}
		nums[i] = n
	}
	// The last part fills the bytes the others leave.
	last := nums[len(nums)-1]
	if last >= 1<<(8*(5-len(nums))) {
		return host
	}
	var ip [4]byte
	for i, n := range nums[:len(nums)-1] {
		if n > 255 {
			return host
		}
		ip[i] = byte(n)
	}
	for i := 3; i >= len(nums)-1; i-- {
		ip[i] = byte(last)
		last >>= 8
	}
	return net.IP(ip[:]).String()
}

// Loopback reports whether host (of the address the dashboard binds, as
// Host writes it) is reachable from this machine only.
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
