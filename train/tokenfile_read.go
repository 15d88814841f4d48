//go:build !(unix && (amd64 || arm64 || riscv64 || loong64 || ppc64le || mipsle || mips64le || 386 || arm))

package train

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// mmapTokens reads the n tokens after the header of f (no mmap here).
func mmapTokens(f *os.File, path string, n int) ([]uint16, func() error, error) {
	b := make([]byte, 2*n)
	if _, err := f.ReadAt(b, tokenHeader); err != nil && err != io.EOF {
		return nil, nil, fmt.Errorf("data %s: %w", path, err)
	}
	toks := make([]uint16, n)
	for i := range toks {
		toks[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return toks, func() error { return nil }, nil
}
