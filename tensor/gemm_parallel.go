package tensor

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Long-lived worker goroutines take GEMM tasks from gemmTasks, so a call
// starts no goroutines and allocates nothing once the pool is warm. The
// threads of one product wait for each other at barriers, so every part
// of a job must be running at once: a call reserves idle workers for its
// parts (starting more when there are too few) before it queues them, and
// a worker counts itself idle again only when its part is done.

// gemmJob is one threaded call: a product shared by a team, or a strided
// batch split into runs of whole products.
type gemmJob struct {
	team *gemmTeam
	// For batches: the product, matrix strides and count.
	kr                               *gemmKernel
	p                                gemmParams
	strideA, strideB, strideC, batch int
	parts                            int
	// running counts the parts still running on workers; wg lets the
	// caller sleep on them once it has polled running for a while.
	running atomic.Int32
	wg      sync.WaitGroup
}

type gemmTask struct {
	job  *gemmJob
	part int
}

var jobPool = sync.Pool{New: func() any { return new(gemmJob) }}

var (
	gemmTasks   = make(chan gemmTask, 256)
	workersMu   sync.Mutex
	workersIdle int
)

// reserveWorkers claims n idle workers, starting new ones when fewer are idle.
func reserveWorkers(n int) {
	workersMu.Lock()
	defer workersMu.Unlock()
	for ; workersIdle < n; workersIdle++ {
		go gemmWorkerLoop()
	}
	workersIdle -= n
}

// workerPoll is how long an idle worker keeps polling for the next task
// before it sleeps. Training issues GEMMs back to back: a worker that is
// still on a core takes the next part at once, where a sleeping one must
// first be woken and scheduled, which on a busy machine can take longer
// than the part itself. It yields between polls, so other goroutines (the
// elementwise kernels) keep the core meanwhile.
const workerPoll = 2 * time.Millisecond

func gemmWorkerLoop() {
	w := new(gemmWorker)
	for {
		var t gemmTask
		select {
		case t = <-gemmTasks:
		default:
			t = pollTask()
		}
		t.job.runPart(w, t.part)
		// Idle again before the caller can return: a caller that issues
		// its next product at once must find this worker free, not start
		// another one (which would then poll beside the busy ones).
		workersMu.Lock()
		workersIdle++
		workersMu.Unlock()
		t.job.running.Add(-1)
		t.job.wg.Done()
	}
}

func pollTask() gemmTask {
	start := time.Now()
	for i := 0; ; i++ {
		select {
		case t := <-gemmTasks:
			return t
		default:
		}
		if i%32 == 31 && time.Since(start) > workerPoll {
			return <-gemmTasks
		}
		runtime.Gosched()
	}
}

// runTasks runs parts [0,n) of the job, part 0 on the calling goroutine
// with worker w.
func (j *gemmJob) runTasks(n int, w *gemmWorker) {
	j.parts = n
	reserveWorkers(n - 1)
	j.running.Store(int32(n - 1))
	j.wg.Add(n - 1)
	for q := 1; q < n; q++ {
		gemmTasks <- gemmTask{j, q}
	}
	j.runPart(w, 0)
	// The other parts usually end within microseconds of this one: poll
	// rather than pay for a sleep and a wake-up.
	spinUntil(func() bool { return j.running.Load() == 0 })
	j.wg.Wait()
}

func (j *gemmJob) runPart(w *gemmWorker, q int) {
	if j.team != nil {
		j.team.run(q, w.tileFor(j.team.kr))
		return
	}
	lo, hi := split(j.batch, 1, j.parts, q)
	for i := lo; i < hi; i++ {
		p := j.p
		p.a, p.b, p.c = from(p.a, i*j.strideA), from(p.b, i*j.strideB), p.c[i*j.strideC:]
		p.ah, p.bh = from(p.ah, i*j.strideA), from(p.bh, i*j.strideB)
		w.solo.setup(j.kr, &p, 1)
		w.solo.run(0, w.tileFor(j.kr))
	}
	w.solo.p = gemmParams{}
}

// spinBarrier makes n threads wait until all have arrived. Waiters spin
// briefly (the others are usually microseconds away) and then sleep, so
// that a waiter never holds a core that a late thread needs: on a shared
// machine more threads may be runnable than there are cores.
type spinBarrier struct {
	n     int32
	count atomic.Int32
	gen   atomic.Uint32
	mu    sync.Mutex
	cond  sync.Cond
}

func (b *spinBarrier) reset(n int) {
	b.n = int32(n)
	b.count.Store(0)
	if b.cond.L == nil {
		b.cond.L = &b.mu
	}
}

// barrierSpin is how long a waiter polls before it sleeps. Waking a
// sleeper costs tens of microseconds (a futex round trip and a reschedule),
// as much as the compute of a small block, so a waiter polls for about that
// long: at most that much core time is lost when the late thread is not
// running at all.
const barrierSpin = 50 * time.Microsecond

func (b *spinBarrier) wait() {
	if b.n <= 1 {
		return
	}
	g := b.gen.Load()
	if b.count.Add(1) == b.n {
		b.count.Store(0)
		b.mu.Lock()
		b.gen.Add(1)
		b.mu.Unlock()
		b.cond.Broadcast()
		return
	}
	if spinUntil(func() bool { return b.gen.Load() != g }) {
		return
	}
	b.mu.Lock()
	for b.gen.Load() == g {
		b.cond.Wait()
	}
	b.mu.Unlock()
}

// gemmBatched is SgemmStridedBatched after argument checks. With at least
// as many products as threads, each thread takes whole products; otherwise
// the products run one after another, each shared by the threads.
func gemmBatched(transA, transB bool, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int) {
	gemmBatchedHalf(transA, transB, m, n, k, alpha, a, nil, lda, strideA, b, nil, ldb, strideB, beta, c, ldc, strideC, batch)
}

// gemmBatchedHalf is gemmBatched with A or B (or both) stored as bfloat16:
// ah or bh instead of a or b, widened as the products pack them
// (gemmHalf).
func gemmBatchedHalf(transA, transB bool, m, n, k int, alpha float32, a []float32, ah []uint16, lda, strideA int, b []float32, bh []uint16, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int) {
	if m == 0 || n == 0 || batch == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		for i := 0; i < batch; i++ {
			scaleC(m, n, beta, c[i*strideC:], ldc)
		}
		return
	}
	threads := min(GemmThreads(), batch)
	if float64(m)*float64(n)*float64(k)*float64(batch) < 48*48*48 {
		threads = 1
	}
	if threads <= 1 || batch < GemmThreads() {
		for i := 0; i < batch; i++ {
			gemmHalf(transA, transB, m, n, k, alpha, from(a, i*strideA), from(ah, i*strideA), lda, from(b, i*strideB), from(bh, i*strideB), ldb, beta, c[i*strideC:], ldc)
		}
		return
	}
	job := jobPool.Get().(*gemmJob)
	job.kr = activeKernel.Load()
	job.p = gemmParams{transA, transB, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc, ah, bh}
	job.strideA, job.strideB, job.strideC, job.batch = strideA, strideB, strideC, batch
	w := workerPool.Get().(*gemmWorker)
	job.runTasks(threads, w)
	workerPool.Put(w)
	job.p, job.batch, job.kr = gemmParams{}, 0, nil
	jobPool.Put(job)
}

// teamSignal lets the threads of an ownB team wait for the progress
// counters of the others: a waiter polls for barrierSpin, then sleeps until an
// update wakes it. Updaters take the lock only when someone sleeps.
type teamSignal struct {
	sleepers atomic.Int32
	mu       sync.Mutex
	cond     sync.Cond
}

func (s *teamSignal) init() {
	if s.cond.L == nil {
		s.cond.L = &s.mu
	}
}

// add adds d to c and wakes the sleepers.
func (s *teamSignal) add(c *atomic.Int64, d int64) {
	c.Add(d)
	// A waiter counts itself a sleeper before its last look at c, so
	// either it sees this update or this sees it.
	if s.sleepers.Load() > 0 {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	}
}

// waitFor returns once every thread's counter (as field picks it from its
// progress) is at least target.
func (s *teamSignal) waitFor(prog []threadProgress, field func(*threadProgress) *atomic.Int64, target int64) {
	done := func() bool {
		for i := range prog {
			if field(&prog[i]).Load() < target {
				return false
			}
		}
		return true
	}
	if done() || spinUntil(done) {
		return
	}
	s.mu.Lock()
	s.sleepers.Add(1)
	for !done() {
		s.cond.Wait()
	}
	s.sleepers.Add(-1)
	s.mu.Unlock()
}

// spinUntil polls done for up to barrierSpin and reports whether it became
// true.
func spinUntil(done func() bool) bool {
	var start time.Time
	for i := 0; ; i++ {
		if done() {
			return true
		}
		if i%128 == 127 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > barrierSpin {
				return false
			}
		}
	}
}
