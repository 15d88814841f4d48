package cudalib

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// LibFound is where one of Libraries was found (Found.Path "" when not).
type LibFound struct {
	What  string
	Found Found
}

// FindAll looks up every CUDA library the project loads (Libraries).
func FindAll() []LibFound {
	var out []LibFound
	for _, l := range Libraries {
		f, _ := Find(l.Names)
		out = append(out, LibFound{l.What, f})
	}
	return out
}

// WriteReport writes hpcrun env's report: the search directories dirs
// (SearchDirs), then where each library of libs (FindAll) was found and by
// which rule.
func WriteReport(w io.Writer, dirs []Dir, libs []LibFound) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\ncuda library search, in order:")
	for _, d := range dirs {
		fmt.Fprintf(tw, "  %s\t%s\n", d.Path, d.Source)
	}
	fmt.Fprintf(tw, "  (by name)\t%s\n", Linker)
	if err := tw.Flush(); err != nil {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, l := range libs {
		if l.Found.Path == "" {
			fmt.Fprintf(tw, "%s\tnot found\n", l.What)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s (%s)\n", l.What, l.Found.Path, l.Found.Source)
	}
	return tw.Flush()
}
