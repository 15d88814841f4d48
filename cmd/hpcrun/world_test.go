package main

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/idrenv"
	"github.com/hpcrun/hpcrun/nccl"
)

// TestJoinWorldFormsTheEnvsWorld: two tasks that know only their Env (as
// srun or torchrun says it) and a token form one world whose all-reduce
// sums over both.
func TestJoinWorldFormsTheEnvsWorld(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	sums := make([]float32, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			env := idrenv.Env{Rank: r, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port}
			world, err := joinWorld(context.Background(), env, nccl.Options{Token: "t0k", Timeout: 20 * time.Second})
			if err != nil {
				errs[r] = err
				return
			}
			defer world.Close()
			x := []float32{float32(r + 1)}
			errs[r] = world.AllReduce(x, nccl.Sum)
			sums[r] = x[0]
		})
	}
	wg.Wait()
	for r := range 2 {
		if errs[r] != nil || sums[r] != 3 {
			t.Errorf("rank %d: sum %v, err %v; want 3", r, sums[r], errs[r])
		}
	}
}
