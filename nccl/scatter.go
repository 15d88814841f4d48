package nccl

import "net"

// scatterBytes is the smallest buffer that a group of 3 without shared
// memory all-reduces by scatter instead of the star (below starNetBytes).
// Measured between 3 hosts of 1 rank (2 cores, 3 runs each, alternated,
// bus bandwidth GB/s): 0.97-1.15 against the star's 0.47-0.84 at 256 KiB,
// 0.49-0.68 against 0.46-0.65 at 1 MiB; between 3 hosts of 2 ranks, whose
// peers (hierSplit) all-reduce half of each 512 KiB chunk (256 KiB
// calls), 0.49-0.92 (median 0.86, 12 runs) against 0.35-0.78 (median
// 0.47) at 1 MiB. From starNetBytes on the ring takes over: scatter was
// even with it at 4-64 MiB between 3 hosts of 1 rank, and holds a scratch
// of the buffer's size.
const scatterBytes = 256 << 10

// useScatter says whether a group of 3 without shared memory all-reduces
// count elements by scatter: from scatterBytes until the star's range
// (starNetBytes) ends.
func (c *tcpComm) useScatter(count int) bool {
	return c.n == 3 && 4*count >= scatterBytes && 4*count < starNetBytes
}

// scatter all-reduces buf over a group of 3 by a direct reduce-scatter and
// all-gather: each rank sends the i-th third of its buffer to rank i,
// folds the thirds it gets of its own in rank order, and sends its folded
// third to the others. Two message times, as the star, and the same bits
// (every element folded in rank order, reduceSlots), but each rank sends
// and receives 4/3 of the buffer, where the star's root receives and sends
// twice the buffer while the others wait.
func (c *tcpComm) scatter(buf []float32, op Op, hdr []byte) error {
	n, me := c.n, c.rank
	// Links out are dialled, and the first message is on its way, before
	// this rank waits for a link in: a peer in another collective may
	// never dial one, and the message tells it of the mismatch at once.
	out, in := make([]net.Conn, n), make([]net.Conn, n)
	for i := 1; i < n; i++ {
		p := (me + i) % n
		var err error
		if out[p], err = c.starConn(p, true); err != nil {
			return err
		}
	}
	recv := func(p int) (net.Conn, error) {
		var err error
		if in[p] == nil {
			in[p], err = c.starConn(p, false)
		}
		return in[p], err
	}
	third := func(p int) []span {
		lo, hi := segment(len(buf), n, p)
		return []span{{lo, hi}}
	}
	// sendAll writes to every other rank the spans part gives for it,
	// aside (writeAside): a third is larger than the sockets hold, and
	// each rank reads while it writes.
	sendAll := func(part func(p int) []span) chan error {
		return writeAside(func() error {
			for i := 1; i < n; i++ {
				p := (me + i) % n
				if err := c.writeSpans(out[p], p, buf, part(p), hdr); err != nil {
					return err
				}
			}
			return nil
		})
	}
	wait := func(sent chan error, err error) error {
		if serr := <-sent; err == nil {
			err = serr
		}
		return err
	}
	mine := third(me)[0]
	w := 4 + mine.hi - mine.lo // a message: the header, then the third
	all := c.buffer(n * w)
	sent := sendAll(third)
	var err error
	for i := 1; i < n && err == nil; i++ {
		p := (me + n - i) % n
		var r net.Conn
		if r, err = recv(p); err == nil {
			err = c.readSpinHdr(r, p, asBytes(all[p*w:(p+1)*w]), hdr)
		}
	}
	if err != nil {
		return wait(sent, err)
	}
	foldInRankOrder(buf[mine.lo:mine.hi], all, w, 4, me, op)
	// The all-gather writes over the thirds sent above: they must be out.
	if err = wait(sent, nil); err != nil {
		return err
	}
	sent = sendAll(func(int) []span { return []span{mine} })
	for i := 1; i < n && err == nil; i++ {
		p := (me + n - i) % n
		if err = c.checkHeaderSpin(in[p], p, hdr); err == nil {
			t := third(p)[0]
			err = c.readSpin(in[p], p, asBytes(buf[t.lo:t.hi]))
		}
	}
	return wait(sent, err)
}
