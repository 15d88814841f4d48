//go:build !linux

package nccl

import (
	"errors"
	"runtime"
)

// yield lets another goroutine (or thread) run.
func yield() { runtime.Gosched() }

// shmGroup is the shared-memory path, only on Linux.
type shmGroup struct{}

func newShmGroup(c *tcpComm) (*shmGroup, error) {
	return nil, errors.New("shared memory path needs Linux")
}

func (g *shmGroup) wakeAll()                                            {}
func (g *shmGroup) close()                                              {}
func (g *shmGroup) allReduce(buf []float32, op Op) error                { return ErrClosed }
func (g *shmGroup) reduceOnePhase(buf []float32, op Op, all bool) error { return ErrClosed }
func (g *shmGroup) reduceBroadcast(buf []float32, red, bc []span, op Op) error {
	return ErrClosed
}
func (g *shmGroup) allReduceOwn(buf []float32, op Op, own func([]float32) error) error {
	return ErrClosed
}
func (g *shmGroup) allGather(send, recv []float32) error            { return ErrClosed }
func (g *shmGroup) reduceScatter(send, recv []float32, op Op) error { return ErrClosed }
func (g *shmGroup) broadcast(buf []float32, root int) error         { return ErrClosed }
func (g *shmGroup) barrier() error                                  { return ErrClosed }

func (g *shmGroup) holds(count int) bool                  { return false }
func (g *shmGroup) landing(count int) ([]float32, uint64) { return nil, 0 }
func (g *shmGroup) land(k uint64)                         {}
func (g *shmGroup) awaitLanded(k uint64) (uint64, error)  { return 0, ErrClosed }

// splitPartBytes: no shared memory, no hierSplit.
func splitPartBytes(ranks int) int { return 0 }
