// Package gpu samples a GPU's memory use and utilisation through NVML and
// records them as "gpu" metrics lines, so hpcrun metrics can show the
// device's own figures beside the engine's accounting.
//
// NVML is loaded at run time (the go-nvml binding dlopens libnvidia-ml), so
// the package builds everywhere; where NVML or the device is missing, or the
// binary was built without cgo, Start returns an error wrapping
// ErrUnavailable and training goes on without samples.
package gpu

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hpcrun/hpcrun/train/metrics"
)

// ErrUnavailable means NVML cannot be used on this machine.
var ErrUnavailable = errors.New("NVML not available")

// Sink receives samples; *metrics.Writer is one.
type Sink interface {
	GPU(metrics.GPUSample) error
}

// device reads one GPU; nvmlDevice is the real one.
type device interface {
	read() (used, total uint64, utilPct float64, err error)
	close() error
}

// Sampler records one device's memory and utilisation at a fixed interval.
type Sampler struct {
	index int
	dev   device
	sink  Sink
	now   func() time.Time
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	err   error // first error met by the sampling goroutine
}

// Start opens NVML device index (the rank's local GPU) and records a sample
// into sink now and then every interval, until Stop.
func Start(index int, every time.Duration, sink Sink) (*Sampler, error) {
	if every <= 0 {
		return nil, fmt.Errorf("gpu: sampling interval %v: must be positive", every)
	}
	dev, err := openNVML(index)
	if err != nil {
		return nil, err
	}
	return start(index, dev, every, sink)
}

func start(index int, dev device, every time.Duration, sink Sink) (*Sampler, error) {
	s := &Sampler{index: index, dev: dev, sink: sink, now: time.Now, stop: make(chan struct{}), done: make(chan struct{})}
	if err := s.record(); err != nil {
		dev.close()
		return nil, err
	}
	go s.loop(every)
	return s, nil
}

// Sample reads the device once without recording.
func (s *Sampler) Sample() (metrics.GPUSample, error) {
	used, total, util, err := s.dev.read()
	if err != nil {
		return metrics.GPUSample{}, fmt.Errorf("gpu %d: %w", s.index, err)
	}
	return metrics.GPUSample{Index: s.index, MemUsedBytes: int64(used), MemTotalBytes: int64(total),
		UtilPct: util, TS: float64(s.now().UnixMicro()) / 1e6}, nil
}

func (s *Sampler) record() error {
	g, err := s.Sample()
	if err != nil {
		return err
	}
	return s.sink.GPU(g)
}

func (s *Sampler) loop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if err := s.record(); err != nil {
				// A device that stops answering should not stop training:
				// keep the error for Stop and sample no more.
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				<-s.stop
				return
			}
		}
	}
}

// Stop records a last sample, stops sampling and releases NVML. It returns
// the first error the sampler met, if any. Calling it again does nothing.
func (s *Sampler) Stop() error {
	var err error
	s.once.Do(func() {
		close(s.stop)
		<-s.done
		s.mu.Lock()
		err = s.err
		s.mu.Unlock()
		if err == nil {
			err = s.record()
		}
		if cerr := s.dev.close(); err == nil {
			err = cerr
		}
	})
	return err
}
