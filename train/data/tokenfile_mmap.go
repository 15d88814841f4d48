//go:build unix && (amd64 || arm64 || riscv64 || loong64 || ppc64le || mipsle || mips64le || 386 || arm)

package data

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// mmapTokens maps the n tokens of width bytes (2 or 4) after the header of
// f read-only (the file's little-endian integers are the host's).
func mmapTokens(f *os.File, path string, n, width int) (tokenShard, func() error, error) {
	b, err := syscall.Mmap(int(f.Fd()), 0, tokenHeader+width*n, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return tokenShard{}, nil, fmt.Errorf("data %s: mmap: %w", path, err)
	}
	var toks tokenShard
	if width == 4 {
		toks.u32 = unsafe.Slice((*uint32)(unsafe.Pointer(&b[tokenHeader])), n)
	} else {
		toks.u16 = unsafe.Slice((*uint16)(unsafe.Pointer(&b[tokenHeader])), n)
	}
	return toks, func() error { return syscall.Munmap(b) }, nil
}
