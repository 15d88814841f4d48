// Package units writes quantities for people and reads them back: Bytes is
// hpcrun's one byte formatter (plan, sweep, hpcrun metrics' report, the
// dashboard), ParseBytes and Size the buffer sizes of hpcrun bench comm,
// Count a number of things.
package units

import (
	"fmt"
	"strconv"
	"strings"
)

// Bytes writes n bytes in binary units with decimals digits after the
// point: "512 B", "1.50 KiB", "52.0 MiB", ... up to TiB; a negative n
// (an overshoot) keeps its sign.
func Bytes(n int64, decimals int) string {
	if n < 0 {
		if n == -n { // math.MinInt64
			return fmt.Sprintf("-%.*f TiB", decimals, -float64(n)/(1<<40))
		}
		return "-" + Bytes(-n, decimals)
	}
	v := float64(n)
	for _, u := range []struct {
		unit string
		size float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v >= u.size {
			return fmt.Sprintf("%.*f %s", decimals, v/u.size, u.unit)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// ParseBytes reads a size such as "4096", "4KiB", "64MiB" or "1GiB" (K, M
// and G, and a B suffix, are read as binary units too).
func ParseBytes(s string) (int64, error) {
	mult := int64(1)
	t := strings.TrimSpace(s)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.m
			break
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want bytes like 4096, 4KiB or 64MiB", s)
	}
	return v * mult, nil
}

// Size writes a buffer size in the largest binary unit that divides it,
// without a space: "4KiB", "64MiB", "1000B"; what ParseBytes reads.
func Size(b int64) string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

// Count is n and the noun, plural unless n is 1: "1 task", "4 tasks".
func Count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
