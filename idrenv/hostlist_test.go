package idrenv

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestExpandHostlist(t *testing.T) {
	// Every want below is what `scontrol show hostnames` printed for the list.
	tests := []struct {
		list string
		want string // names joined by spaces
	}{
		{"jz[001-003,007],gpu5", "jz001 jz002 jz003 jz007 gpu5"},
		{"n[8-10]", "n8 n9 n10"},
		{"n[001-3]", "n001 n002 n003"},
		{"n[00-02,7,010-011]", "n00 n01 n02 n7 n010 n011"},
		{"n[1-03]", "n1 n2 n3"},
		{"n[01-100]", "n01 n02 n03 n04 n05 n06 n07 n08 n09 " + seq("n", 10, 100)},
		{"n[99-101]", "n99 n100 n101"},
		{"n[00]", "n00"},
		{"n[1-1]", "n1"},
		{"rack[1-2]-node[01-02]", "rack1-node01 rack1-node02 rack2-node01 rack2-node02"},
		{"a[1-2][3-4]", "a13 a14 a23 a24"},
		// Three or more brackets: last fastest, then first, second, ...
		{"x[1-2]y[3-4]z[5-6]", "x1y3z5 x1y3z6 x2y3z5 x2y3z6 x1y4z5 x1y4z6 x2y4z5 x2y4z6"},
		{"a[1-3]b[1-2]c[1-2]", "a1b1c1 a1b1c2 a2b1c1 a2b1c2 a3b1c1 a3b1c2 a1b2c1 a1b2c2 a2b2c1 a2b2c2 a3b2c1 a3b2c2"},
		{"a[1-2]b[1-2,5]c[1-2]", "a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 a1b2c2 a2b2c1 a2b2c2 a1b5c1 a1b5c2 a2b5c1 a2b5c2"},
		{"a[1-2],b[3-4]c[5-6]", "a1 a2 b3c5 b3c6 b4c5 b4c6"},
		{"n[1-3],n2", "n1 n2 n3 n2"},
		{"n[5,1-3,5]", "n5 n1 n2 n3 n5"},
		{"a b,c", "a b c"},
		{"a  b", "a b"},
		{"a, b", "a b"},
		{",a,,b,", "a b"},
		{" a ", "a"},
		{"[1-2]", "1 2"},
		{"n1[1-2]", "n11 n12"},
		{"n-[1-2]", "n-1 n-2"},
		{"n.a[1-2]", "n.a1 n.a2"},
		{"a(b),c", "a(b) c"},
		{"x[99999998-100000001]", "x99999998 x99999999 x100000000 x100000001"},
		{"", ""},
	}
	for _, tt := range tests {
		got, err := ExpandHostlist(tt.list)
		if err != nil {
			t.Errorf("ExpandHostlist(%q): %v", tt.list, err)
			continue
		}
		if g := strings.Join(got, " "); g != tt.want {
			t.Errorf("ExpandHostlist(%q) = %q, want %q", tt.list, g, tt.want)
		}
	}
}

// seq is "p<lo> ... p<hi>" without padding.
func seq(p string, lo, hi int) string {
	var s []string
	for i := lo; i <= hi; i++ {
		s = append(s, p+strconv.Itoa(i))
	}
	return strings.Join(s, " ")
}

func TestExpandHostlistErrors(t *testing.T) {
	tests := []struct{ list, msg string }{
		{"n[1-2", "never closed"},
		{"n[3-1]", "backwards"},
		{"n[a-c]", "not numeric"},
		{"n[010-9]", "backwards"},
		{"n[]", "empty bound"},
		{"n[,1]", "empty bound"},
		{"n[1,]", "empty bound"},
		{"n[1-]", "empty bound"},
		{"n[-1]", "empty bound"},
		{"n[1-2-3]", "not numeric"},
		{"n[ 1-2]", "not numeric"},
		{"n[+1]", "not numeric"},
		{"n]", "without"},
		{"n[1-2]]", "without"},
		{"n[[1]]", "nested"},
		{"n[9-11]x", "after the last"},
		{"a[1]b[2]c", "after the last"},
		{"node-[1-2]-ib", "after the last"},
		{"x[1-65537]", "more than 65536"},
		{"x[99999999999999999999]", "too large"},
		{"a\tb", "control character"},
		{"a[0-65535]b[0-65535]", "more than"},
	}
	for _, tt := range tests {
		got, err := ExpandHostlist(tt.list)
		if err == nil {
			t.Errorf("ExpandHostlist(%q) = %q, want an error", tt.list, got)
			continue
		}
		if !strings.Contains(err.Error(), tt.msg) || !strings.Contains(err.Error(), strconv.Quote(tt.list)) {
			t.Errorf("ExpandHostlist(%q) error %q: want it to name the list and say %q", tt.list, err, tt.msg)
		}
	}
}

func TestExpandHostlistLarge(t *testing.T) {
	got, err := ExpandHostlist("x[0-65535],y[1-40000]")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 65536+40000 || got[0] != "x0" || got[65535] != "x65535" || got[len(got)-1] != "y40000" {
		t.Errorf("got %d names, first %q, last %q", len(got), got[0], got[len(got)-1])
	}
}

// FuzzExpandHostlist checks that no input panics, and that what expands
// expands again, joined by commas, to the same names.
func FuzzExpandHostlist(f *testing.F) {
	for _, s := range []string{"jz[001-003,007],gpu5", "rack[1-2]-node[01-02]", "n[1-2", "a b", "x[1-2]y[3]z[5-6]", "n[9-11]x", "]", "[", "[0]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		if len(list) > 200 {
			t.Skip("long input")
		}
		names, err := ExpandHostlist(list)
		if err != nil {
			if names != nil {
				t.Fatalf("error %v with names %q", err, names)
			}
			return
		}
		if len(names) > MaxHosts {
			t.Fatalf("%d names, more than MaxHosts", len(names))
		}
		for _, n := range names {
			if n == "" || strings.ContainsAny(n, "[], ") {
				t.Fatalf("ExpandHostlist(%q) gave bad name %q", list, n)
			}
		}
		if len(names) > 1000 {
			return
		}
		again, err := ExpandHostlist(strings.Join(names, ","))
		if err != nil || !slices.Equal(again, names) {
			t.Fatalf("re-expanding %q: %q, %v", names, again, err)
		}
	})
}
