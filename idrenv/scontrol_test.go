package idrenv

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// scontrolHostnames returns what `scontrol show hostnames list` prints:
// the names, or invalid=true when scontrol rejects the list (it exits 0
// either way).
func scontrolHostnames(t *testing.T, env []string, list string) (names []string, invalid bool) {
	t.Helper()
	cmd := exec.Command("scontrol", "show", "hostnames", list)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scontrol show hostnames %q: %v\n%s", list, err, out)
	}
	s := string(out)
	if strings.Contains(s, "Invalid hostlist") || strings.Contains(s, "error:") {
		return nil, true
	}
	return strings.Fields(s), false
}

// scontrolEnv returns an environment in which `scontrol show hostnames`
// works: the current one when Slurm is configured, else one pointing
// SLURM_CONF at a minimal file (expanding a list needs a config, not a
// controller).
func scontrolEnv(t *testing.T) []string {
	t.Helper()
	env := os.Environ()
	if out, err := exec.Command("scontrol", "show", "hostnames", "a[1-2]").CombinedOutput(); err == nil && string(out) == "a1\na2\n" {
		return env
	}
	conf := filepath.Join(t.TempDir(), "slurm.conf")
	const minimal = "ClusterName=idrenvtest\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=localhost Default=YES\n"
	if err := os.WriteFile(conf, []byte(minimal), 0o644); err != nil {
		t.Fatal(err)
	}
	env = append(env, "SLURM_CONF="+conf)
	cmd := exec.Command("scontrol", "show", "hostnames", "a[1-2]")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil || string(out) != "a1\na2\n" {
		t.Skipf("scontrol cannot expand hostlists here, even with a minimal SLURM_CONF: %v %s", err, out)
	}
	return env
}

// TestExpandHostlistMatchesScontrol compares the parser with Slurm's own on
// generated lists: well-formed ones, and ones both must reject.
func TestExpandHostlistMatchesScontrol(t *testing.T) {
	if _, err := exec.LookPath("scontrol"); err != nil {
		t.Skip("scontrol is not on PATH (install slurm-client to compare with Slurm's parser)")
	}
	env := scontrolEnv(t)
	n := 300
	if testing.Short() {
		n = 60
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 4))
	var agreeValid, agreeInvalid int
	for i := 0; i < n; i++ {
		list := genHostlist(rng)
		want, invalid := scontrolHostnames(t, env, list)
		got, err := ExpandHostlist(list)
		switch {
		case invalid && err == nil:
			t.Errorf("scontrol rejects %q, ExpandHostlist gives %q", list, got)
		case !invalid && err != nil:
			t.Errorf("scontrol expands %q to %q, ExpandHostlist: %v", list, want, err)
		case !invalid && strings.Join(got, " ") != strings.Join(want, " "):
			t.Errorf("%q:\n got %q\nwant %q", list, got, want)
		case invalid:
			agreeInvalid++
		default:
			agreeValid++
		}
	}
	t.Logf("agreed with scontrol on %d valid and %d invalid lists", agreeValid, agreeInvalid)
	// genHostlist makes a valid list with probability 0.6365 (measured over
	// 200,000 draws). The floor lies 5 standard deviations below the mean, so
	// a healthy generator trips it once in 3.5 million runs, while one that
	// drifted to half as many valid lists trips it every time.
	const validShare = 0.6365
	mean := float64(n) * validShare
	floor := int(mean - 5*math.Sqrt(mean*(1-validShare)))
	if agreeValid < floor {
		t.Errorf("only %d of %d generated lists were valid (a healthy generator gives at least %d): the generator drifted", agreeValid, n, floor)
	}
}

// genHostlist makes a random hostlist in the grammar both parsers accept,
// sometimes with one of the defects both reject (text after the last
// bracket, a backwards range, a letter in a range, an empty range).
func genHostlist(rng *rand.Rand) string {
	const letters = "abcnodegpujz-_."
	items := make([]string, 1+rng.IntN(4))
	for i := range items {
		var b strings.Builder
		b.WriteByte("abcgjnrxz"[rng.IntN(9)])
		for range rng.IntN(5) {
			b.WriteByte(letters[rng.IntN(len(letters))])
		}
		if rng.IntN(4) == 0 {
			fmt.Fprint(&b, rng.IntN(30))
		}
		groups := rng.IntN(4)
		if groups > 0 && rng.IntN(5) == 0 {
			groups = 0 // a plain name
		}
		for g := 0; g < groups; g++ {
			if g > 0 {
				// literal text between brackets
				for range rng.IntN(3) {
					b.WriteByte(letters[rng.IntN(len(letters))])
				}
			}
			b.WriteByte('[')
			for r := range 1 + rng.IntN(3) {
				if r > 0 {
					b.WriteByte(',')
				}
				b.WriteString(genRange(rng))
			}
			b.WriteByte(']')
		}
		if groups > 0 && rng.IntN(25) == 0 {
			b.WriteString("x") // text after the last bracket: invalid in both
		}
		items[i] = b.String()
	}
	sep := ","
	if rng.IntN(5) == 0 {
		sep = " "
	}
	return strings.Join(items, sep)
}

// genRange makes "lo" or "lo-hi" with random zero padding and small spans.
func genRange(rng *rand.Rand) string {
	pad := func(v int) string {
		s := fmt.Sprint(v)
		if rng.IntN(3) == 0 {
			s = strings.Repeat("0", 1+rng.IntN(3)) + s
		}
		return s
	}
	lo := rng.IntN(120)
	switch rng.IntN(40) {
	case 0:
		return fmt.Sprintf("%d-%d", lo+5, lo) // backwards
	case 1:
		return "a-c" // not numeric
	case 2:
		return "" // empty
	}
	if rng.IntN(3) == 0 {
		return pad(lo)
	}
	return pad(lo) + "-" + pad(lo+rng.IntN(4))
}
