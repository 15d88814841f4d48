package nccl

import "errors"

type shmGroup struct{}

func newShmGroup(c *tcpComm) (*shmGroup, error)                     { return nil, errors.New("todo") }
func (g *shmGroup) wakeAll()                                        {}
func (g *shmGroup) close()                                          {}
func (g *shmGroup) allReduce(buf []float32, op Op) error            { return nil }
func (g *shmGroup) allGather(send, recv []float32) error            { return nil }
func (g *shmGroup) reduceScatter(send, recv []float32, op Op) error { return nil }
func (g *shmGroup) broadcast(buf []float32, root int) error         { return nil }
func (g *shmGroup) barrier() error                                  { return nil }
