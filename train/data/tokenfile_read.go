//go:build !(unix && (amd64 || arm64 || riscv64 || loong64 || ppc64le || mipsle || mips64le || 386 || arm))

package data

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// mmapTokens reads the n tokens of width bytes (2 or 4) after the header
// of f (no mmap here).
func mmapTokens(f *os.File, path string, n, width int) (tokenShard, func() error, error) {
	b := make([]byte, width*n)
	if _, err := f.ReadAt(b, tokenHeader); err != nil && err != io.EOF {
		return tokenShard{}, nil, fmt.Errorf("data %s: %w", path, err)
	}
	var toks tokenShard
	if width == 4 {
		toks.u32 = make([]uint32, n)
		for i := range toks.u32 {
			toks.u32[i] = binary.LittleEndian.Uint32(b[4*i:])
		}
	} else {
		toks.u16 = make([]uint16, n)
		for i := range toks.u16 {
			toks.u16[i] = binary.LittleEndian.Uint16(b[2*i:])
		}
	}
	return toks, func() error { return nil }, nil
}
