//go:build !cgo

package gpu

import "fmt"

func openNVML(int) (device, error) {
	return nil, fmt.Errorf("gpu: %w: this hpcrun was built without cgo (CGO_ENABLED=0)", ErrUnavailable)
}
