package parallel

// GradBucketElems is the size of one data-parallel all-reduce bucket: 4 Mi
// floats (16 MiB), large enough to amortise latency, small enough to bound
// the staging buffer.
const GradBucketElems = 1 << 22

// Bucket is a run of consecutive gradients all-reduced as one.
type Bucket struct {
	Tensors int   // gradients in the bucket
	Elems   int64 // their elements
	Block   bool  // a transformer block's gradients (BlockBuckets)
}

// GradBuckets cuts gradients of sizes elements, in order, into buckets of
// at most bucketElems elements (<= 0: GradBucketElems): a gradient that
// would overflow the bucket starts the next, and a larger one gets a
// bucket of its own. The engine's gradient all-reduce and ZeRO-1 bucket
// with it, and train/plan counts their buffers and collectives from it.
func GradBuckets(sizes []int64, bucketElems int64) []Bucket {
	if bucketElems <= 0 {
		bucketElems = GradBucketElems
	}
	var out []Bucket
	var cur Bucket
	for _, n := range sizes {
		if cur.Tensors > 0 && cur.Elems+n > bucketElems {
			out = append(out, cur)
			cur = Bucket{}
		}
		cur.Tensors++
		cur.Elems += n
	}
	if cur.Tensors > 0 {
		out = append(out, cur)
	}
	return out
}

// BlockBuckets cuts gradients of sizes elements, in order, into ZeRO-2's
// buckets: the gradients of each transformer block (block[i], the block
// of gradient i, -1 outside one; a block's gradients consecutive) one
// bucket, flagged Block, and the runs between blocks as GradBuckets cuts
// them. The engine's ZeRO-2 buckets with it, and train/plan counts its
// buffers and collectives from it.
func BlockBuckets(sizes []int64, block []int, bucketElems int64) []Bucket {
	same := func(a, b int) bool { return a == b || a < 0 && b < 0 }
	var out []Bucket
	for i := 0; i < len(sizes); {
		j := i + 1
		for j < len(sizes) && same(block[i], block[j]) {
			j++
		}
		if block[i] >= 0 {
			b := Bucket{Tensors: j - i, Block: true}
			for _, n := range sizes[i:j] {
				b.Elems += n
			}
			out = append(out, b)
		} else {
			out = append(out, GradBuckets(sizes[i:j], bucketElems)...)
		}
		i = j
	}
	return out
}
