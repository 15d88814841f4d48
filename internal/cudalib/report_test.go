package cudalib

import (
	"bytes"
	"strings"
	"testing"
)

// The library report lists the search in order and, per library, the file
// and the rule that found it, or that none did.
func TestWriteReport(t *testing.T) {
	var out bytes.Buffer
	err := WriteReport(&out, []Dir{{Path: "/venv/nvidia/nccl/lib", Source: "python3 wheel nvidia/nccl"}}, []LibFound{
		{"NCCL", Found{Path: "/venv/nvidia/nccl/lib/libnccl.so.2", Source: "python3 wheel nvidia/nccl"}},
		{"NVRTC", Found{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"/venv/nvidia/nccl/lib  python3 wheel nvidia/nccl",
		"  (by name)              the dynamic linker",
		"NCCL   /venv/nvidia/nccl/lib/libnccl.so.2 (python3 wheel nvidia/nccl)",
		"NVRTC  not found",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
