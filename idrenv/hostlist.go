package idrenv

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxHosts bounds how many names one hostlist (or one per-node count string)
// may expand to. Real clusters are far below it; it keeps a typo such as
// a[0-65535]b[0-65535] from allocating billions of names.
const MaxHosts = 1 << 20

// maxRange is the most names one bracket range may hold, as in Slurm.
const maxRange = 65536

// ExpandHostlist expands a Slurm hostlist the way `scontrol show hostnames`
// does: items separated by commas or spaces; each item is literal text with
// zero or more bracket groups of comma-separated numbers and lo-hi ranges;
// zero padding is taken from each range's low bound (n[8-10] -> n8 n9 n10,
// n[001-3] -> n001 n002 n003); order and duplicates are kept.
//
// Several brackets in one item expand as a product in Slurm's order: the last
// bracket varies fastest, then the first, the second, and so on, the
// second-to-last slowest (rack[1-2]-node[01-02] -> rack1-node01 rack1-node02
// rack2-node01 rack2-node02). Like scontrol, text after an item's last bracket
// is an error.
//
// Where scontrol is lenient with malformed input (an unterminated "[", a
// stray "]", an empty bound as in n[1-], blanks or signs inside brackets) this
// function returns an error instead of guessing. An empty list gives no names.
func ExpandHostlist(list string) ([]string, error) {
	var out []string
	for i := 0; i < len(list); {
		if list[i] == ',' || list[i] == ' ' {
			i++
			continue
		}
		j, err := itemEnd(list, i)
		if err != nil {
			return nil, fmt.Errorf("hostlist %q: %w", list, err)
		}
		out, err = expandItem(out, list[i:j])
		if err != nil {
			return nil, fmt.Errorf("hostlist %q: %w", list, err)
		}
		i = j
	}
	return out, nil
}

// itemEnd returns the index just past the item starting at list[i]: the next
// comma or space outside brackets, or the end.
func itemEnd(list string, i int) (int, error) {
	open := -1
	for j := i; j < len(list); j++ {
		switch c := list[j]; {
		case c == '[':
			if open >= 0 {
				return 0, fmt.Errorf("nested %q at offset %d", "[", j)
			}
			open = j
		case c == ']':
			if open < 0 {
				return 0, fmt.Errorf("%q without %q at offset %d", "]", "[", j)
			}
			open = -1
		case (c == ',' || c == ' ') && open < 0:
			return j, nil
		case c < 0x20 || c == 0x7f:
			return 0, fmt.Errorf("control character %q at offset %d", c, j)
		}
	}
	if open >= 0 {
		return 0, fmt.Errorf("%q at offset %d is never closed", "[", open)
	}
	return len(list), nil
}

// expandItem appends the names of one item (no top-level separators, brackets
// balanced and not nested) to out.
func expandItem(out []string, item string) ([]string, error) {
	var lits []string     // lits[k] precedes group k; one more literal than groups
	var groups [][]string // formatted numbers of each bracket group
	rest := item
	for {
		o := strings.IndexByte(rest, '[')
		if o < 0 {
			lits = append(lits, rest)
			break
		}
		c := strings.IndexByte(rest, ']')
		nums, err := expandRanges(rest[o+1 : c])
		if err != nil {
			return nil, err
		}
		lits = append(lits, rest[:o])
		groups = append(groups, nums)
		rest = rest[c+1:]
	}
	if len(groups) == 0 {
		return append(out, item), nil
	}
	if tail := lits[len(lits)-1]; tail != "" {
		return nil, fmt.Errorf("text %q after the last %q of %q", tail, "]", item)
	}
	total := 1
	for _, g := range groups {
		total *= len(g)
		if total > MaxHosts-len(out) {
			return nil, fmt.Errorf("%q expands to more than %d names", item, MaxHosts)
		}
	}
	// Significance order of the digits of the odometer, fastest first:
	// the last group, then groups 0, 1, ..., k-2 (what scontrol prints).
	k := len(groups)
	order := make([]int, 0, k)
	order = append(order, k-1)
	for g := 0; g < k-1; g++ {
		order = append(order, g)
	}
	idx := make([]int, k)
	var b strings.Builder
	for n := 0; n < total; n++ {
		b.Reset()
		for g := range groups {
			b.WriteString(lits[g])
			b.WriteString(groups[g][idx[g]])
		}
		out = append(out, b.String())
		for _, g := range order {
			idx[g]++
			if idx[g] < len(groups[g]) {
				break
			}
			idx[g] = 0
		}
	}
	return out, nil
}

// expandRanges expands the inside of one bracket, e.g. "00-02,7,010-011".
func expandRanges(s string) ([]string, error) {
	var nums []string
	for _, r := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		l, err := parseBound(lo, r)
		if err != nil {
			return nil, err
		}
		h, err := parseBound(hi, r)
		if err != nil {
			return nil, err
		}
		if l > h {
			return nil, fmt.Errorf("range %q runs backwards", r)
		}
		if h-l >= maxRange {
			return nil, fmt.Errorf("range %q holds more than %d names", r, maxRange)
		}
		if len(nums)+int(h-l+1) > MaxHosts {
			return nil, fmt.Errorf("bracket [%s] expands to more than %d names", s, MaxHosts)
		}
		width := len(lo)
		for v := l; ; v++ {
			d := strconv.FormatUint(v, 10)
			if pad := width - len(d); pad > 0 {
				d = strings.Repeat("0", pad) + d
			}
			nums = append(nums, d)
			if v == h {
				break
			}
		}
	}
	return nums, nil
}

// parseBound parses one bound of range r: ASCII digits only.
func parseBound(s, r string) (uint64, error) {
	if s == "" {
		return 0, fmt.Errorf("range %q has an empty bound", r)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("range %q is not numeric", r)
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > 1<<62 {
		return 0, fmt.Errorf("range %q: number %s is too large", r, s)
	}
	return v, nil
}
