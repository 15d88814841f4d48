// Package nccl is the communication layer: a Comm interface of collectives
// (all-reduce, all-gather, reduce-scatter, broadcast, barrier, send/recv) over
// sub-groups of ranks, a TCP rendezvous Store, and the backends that implement
// Comm. It knows nothing of models. It is named for NVIDIA's NCCL, whose API
// its GPU backend wraps and whose collectives the others mirror, but most of
// it is for CPU ranks: shared memory on one host, TCP across hosts.
//
// Backends:
//
//   - In-process (NewInProcess, RunInProcess): N goroutines of one process,
//     for tests and equivalence checks; reductions add in rank order.
//   - TCP (Init with BackendTCP or BackendAuto): one process per rank, on one
//     host or many. Rank 0 serves the rendezvous Store at the master address;
//     ranks publish their listen addresses there and connect each group as a
//     ring. All-reduce is the bandwidth-optimal ring (reduce-scatter then
//     all-gather), streamed in pieces so that sending, receiving and reducing
//     overlap; below 256 KiB (2 MiB for two ranks) the ranks exchange
//     buffers directly instead (one message time instead of 2(n-1) steps;
//     small.go).
//   - Shared memory (BackendAuto, the default): a group whose ranks all run on
//     one host also maps a file in /dev/shm and runs its collectives there
//     (an all-reduce below 16 KiB in one phase instead of two). A group
//     spread over hosts reduces on each host, between the hosts' first
//     ranks, and broadcasts on each host (hierarchical); between two hosts,
//     from 256 KiB to what a set of slots holds (1 MiB at 2 ranks a host),
//     the first ranks land the other host's sum in shared memory and every
//     rank adds it instead of the broadcast, and from 2 MiB on, the buffer
//     goes in chunks that go through the three stages at once (hier.go).
//     Where every host holds equally many ranks, from 2 MiB between two
//     hosts and from 512 KiB between three (at 2 ranks a host), every rank
//     all-reduces its own reduced segment with the ranks at its place on
//     the other hosts instead (hierSplit, hier.go); a group of 3 does so
//     by thirds from 256 KiB (scatter.go).
//   - NCCL (BackendNCCL): libnccl.so.2 loaded at run time; the communicator is
//     a DeviceComm whose Device methods take GPU pointers and a stream. Each
//     rank's device (Options.Device) is made current through the CUDA
//     driver (libcuda.so.1) before its communicators are made.
//
// Every backend gives every rank bit-identical results. Every wait is
// bounded by Options.Timeout; a peer that exits or stalls makes every rank's
// pending and later operations fail with a *PeerError that names it (the
// first failure recorded in the Store wins, so all ranks name the same one).
//
// A typical rank:
//
//	world, err := nccl.Init(ctx, nccl.Options{Rank: r, Size: n,
//		MasterAddr: host, MasterPort: port, Token: secret})
//	...
//	defer world.Close()
//	tp, err := world.Group(tpRanks) // every member, same list
//	err = tp.AllReduce(buf, nccl.Sum)
package nccl
