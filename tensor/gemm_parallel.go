package tensor

import "sync"

// Long-lived worker goroutines take GEMM tasks from gemmTasks, so a call
// starts no goroutines and allocates nothing once the pool is warm. Each
// worker owns its packing buffers.

// gemmJob is one threaded call: a product split into tm x tn rectangles, or
// a strided batch split into runs of whole products.
type gemmJob struct {
	kr     *gemmKernel
	p      gemmParams
	tm, tn int
	// For batches: matrix strides and count; tm*tn == 0 marks a batch job.
	strideA, strideB, strideC, batch int
	parts                            int
	wg                               sync.WaitGroup
}

type gemmTask struct {
	job  *gemmJob
	part int
}

var jobPool = sync.Pool{New: func() any { return new(gemmJob) }}

var (
	gemmTasks   = make(chan gemmTask, 256)
	workersMu   sync.Mutex
	workersLive int
)

// ensureWorkers starts worker goroutines until n are running.
func ensureWorkers(n int) {
	workersMu.Lock()
	defer workersMu.Unlock()
	for ; workersLive < n; workersLive++ {
		go func() {
			w := new(gemmWorker)
			for t := range gemmTasks {
				t.job.runPart(w, t.part)
				t.job.wg.Done()
			}
		}()
	}
}

// runTasks runs parts [0,n) of the job, part 0 on the calling goroutine.
func (j *gemmJob) runTasks(n int) {
	j.parts = n
	ensureWorkers(n - 1)
	j.wg.Add(n - 1)
	for q := 1; q < n; q++ {
		gemmTasks <- gemmTask{j, q}
	}
	w := workerPool.Get().(*gemmWorker)
	j.runPart(w, 0)
	workerPool.Put(w)
	j.wg.Wait()
}

func (j *gemmJob) runPart(w *gemmWorker, q int) {
	if j.batch > 0 {
		lo, hi := split(j.batch, 1, j.parts, q)
		for i := lo; i < hi; i++ {
			p := j.p
			p.a, p.b, p.c = p.a[i*j.strideA:], p.b[i*j.strideB:], p.c[i*j.strideC:]
			w.run(j.kr, &p, 0, p.m, 0, p.n)
		}
		return
	}
	i0, i1 := split(j.p.m, j.kr.mr, j.tm, q/j.tn)
	j0, j1 := split(j.p.n, j.kr.nr, j.tn, q%j.tn)
	w.run(j.kr, &j.p, i0, i1, j0, j1)
}

// gemmBatched is SgemmStridedBatched after argument checks. With at least
// as many products as threads, each thread takes whole products; otherwise
// the products run one after another, each split across the threads.
func gemmBatched(transA, transB bool, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int) {
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
			gemm(transA, transB, m, n, k, alpha, a[i*strideA:], lda, b[i*strideB:], ldb, beta, c[i*strideC:], ldc)
		}
		return
	}
	job := jobPool.Get().(*gemmJob)
	job.kr = activeKernel.Load()
	job.p = gemmParams{transA, transB, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc}
	job.strideA, job.strideB, job.strideC, job.batch = strideA, strideB, strideC, batch
	job.runTasks(threads)
	job.p, job.batch = gemmParams{}, 0
	jobPool.Put(job)
}
