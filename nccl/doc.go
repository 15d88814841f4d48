// Package nccl is the communication layer: a Comm interface of collectives
// (all-reduce, all-gather, reduce-scatter, broadcast, barrier, send/recv) over
// sub-groups of ranks, a TCP rendezvous Store, and the backends that implement
// Comm (in-process, TCP ring, NCCL). It knows nothing of models.
package nccl
