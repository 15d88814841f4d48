// Package units writes quantities for people: Bytes is hpcrun's one byte
// formatter (plan, sweep, hpcrun metrics' report, the dashboard).
package units

import "fmt"

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
