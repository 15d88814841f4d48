//go:build unix && (amd64 || arm64 || riscv64 || loong64 || ppc64le || mipsle || mips64le || 386 || arm)

package train

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// mmapTokens maps the n tokens after the header of f read-only (the
// file's little-endian uint16 are the host's).
func mmapTokens(f *os.File, path string, n int) ([]uint16, func() error, error) {
	b, err := syscall.Mmap(int(f.Fd()), 0, tokenHeader+2*n, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("data %s: mmap: %w", path, err)
	}
	toks := unsafe.Slice((*uint16)(unsafe.Pointer(&b[tokenHeader])), n)
	return toks, func() error { return syscall.Munmap(b) }, nil
}
