//go:build !(openblas && cgo)

package tensor

// OpenBLASPeer reports that OpenBLAS is absent: this binary was built
// without -tags openblas (or without cgo).
func OpenBLASPeer() (peer *GemmPeer, ok bool) { return nil, false }
