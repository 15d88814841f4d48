package idrenv

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpandTasksPerNode expands Slurm's compressed per-node counts, the format
// of SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE and
// SLURM_JOB_CPUS_PER_NODE: comma-separated items, each a count N or N(xR) for
// R nodes in a row with N each. "2(x3),1" -> [2 2 2 1].
func ExpandTasksPerNode(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("per-node counts: empty")
	}
	var out []int
	for _, item := range strings.Split(s, ",") {
		n, reps, err := parseCountItem(item)
		if err != nil {
			return nil, fmt.Errorf("per-node counts %q: %w", s, err)
		}
		if reps > MaxHosts-len(out) {
			return nil, fmt.Errorf("per-node counts %q: more than %d nodes", s, MaxHosts)
		}
		for range reps {
			out = append(out, n)
		}
	}
	return out, nil
}

// parseCountItem parses "N" or "N(xR)".
func parseCountItem(item string) (n, reps int, err error) {
	num, rep, hasRep := strings.Cut(item, "(x")
	if n, err = parseCount(num, item); err != nil {
		return 0, 0, err
	}
	if !hasRep {
		return n, 1, nil
	}
	r, ok := strings.CutSuffix(rep, ")")
	if !ok {
		return 0, 0, fmt.Errorf("item %q: want N or N(xR)", item)
	}
	if reps, err = parseCount(r, item); err != nil {
		return 0, 0, err
	}
	if reps == 0 {
		return 0, 0, fmt.Errorf("item %q repeats zero times", item)
	}
	return n, reps, nil
}

// parseCount parses a decimal count of ASCII digits, at most MaxHosts.
func parseCount(s, item string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("item %q: want N or N(xR)", item)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("item %q: %q is not a count", item, s)
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil || v > MaxHosts {
		return 0, fmt.Errorf("item %q: %s is too large", item, s)
	}
	return v, nil
}

// CompressTasksPerNode is the inverse of ExpandTasksPerNode: runs of equal
// counts become N(xR). [2 2 2 1] -> "2(x3),1". An empty slice gives "".
func CompressTasksPerNode(counts []int) string {
	var b strings.Builder
	for i := 0; i < len(counts); {
		j := i + 1
		for j < len(counts) && counts[j] == counts[i] {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(counts[i]))
		if j-i > 1 {
			fmt.Fprintf(&b, "(x%d)", j-i)
		}
		i = j
	}
	return b.String()
}
