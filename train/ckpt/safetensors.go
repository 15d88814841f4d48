package ckpt

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
)

// The safetensors format (huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
// end of the header) plus an optional "__metadata__" of string pairs, then
// the raw little-endian tensor data. Written here in ~200 lines rather than
// through a library: the Go ports are unmaintained or pull cgo, and the
// format is small enough that a reader with our own validation (offsets,
// sizes, dtypes, truncation, each error naming the file) is simpler to trust.

// maxHeader bounds the JSON header a reader accepts (the reference
// implementation's limit is 100 MB).
const maxHeader = 100 << 20

// Tensor is one named float32 tensor: Data holds prod(Shape) values in
// row-major order.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// Len is the number of elements Shape describes.
func (t Tensor) Len() int { return numel(t.Shape) }

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// dtypeSize is the byte width of every dtype the format defines; a reader
// knows them all so that it can name a valid but unsupported dtype.
var dtypeSize = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// HeaderEntry is one tensor's line of a safetensors header.
type HeaderEntry struct {
	Name    string
	DType   string
	Shape   []int
	Begin   int64 // data offsets relative to the end of the header
	End     int64
	dataPos int64 // absolute file offset of Begin
}

// Header is a validated safetensors header.
type Header struct {
	Path     string
	Tensors  []HeaderEntry // in data order
	Metadata map[string]string
	Size     int64 // file size
}

// Find returns the entry called name.
func (h *Header) Find(name string) (HeaderEntry, bool) {
	for _, e := range h.Tensors {
		if e.Name == name {
			return e, true
		}
	}
	return HeaderEntry{}, false
}

type rawEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int   `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// WriteFile writes tensors (in the given order) and metadata to path as
// safetensors and fsyncs it. It writes path itself: callers that need
// atomicity write into a temporary directory and rename it, or use Write
// through atomicfile.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	return writeSync(path, func(w io.Writer) error { return Write(w, path, tensors, metadata) })
}

// Write writes tensors (in the given order) and metadata to out as
// safetensors; name names the destination in errors.
func Write(out io.Writer, name string, tensors []Tensor, metadata map[string]string) error {
	return WriteAs(out, name, tensors, metadata, "F32")
}

// WriteAs is Write with the values stored as dtype: F32, F16 or BF16
// (rounded to nearest even).
func WriteAs(out io.Writer, name string, tensors []Tensor, metadata map[string]string, dtype string) error {
	path := name
	size := dtypeSize[dtype]
	if dtype != "F32" && dtype != "F16" && dtype != "BF16" {
		return fmt.Errorf("safetensors %s: dtype %q: write F32, F16 or BF16", path, dtype)
	}
	header := make(map[string]any, len(tensors)+1)
	if len(metadata) > 0 {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		if t.Name == "" || t.Name == "__metadata__" {
			return fmt.Errorf("safetensors %s: bad tensor name %q", path, t.Name)
		}
		if _, dup := header[t.Name]; dup {
			return fmt.Errorf("safetensors %s: tensor %s twice", path, t.Name)
		}
		if len(t.Data) != t.Len() {
			return fmt.Errorf("safetensors %s: tensor %s has %d values for shape %v", path, t.Name, len(t.Data), t.Shape)
		}
		n := int64(size * len(t.Data))
		header[t.Name] = rawEntry{DType: dtype, Shape: append([]int{}, t.Shape...), DataOffsets: []int64{off, off + n}}
		off += n
	}
	hdr, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("safetensors %s: %w", path, err)
	}
	// Pad the header with spaces so the data starts 8-byte aligned, as the
	// reference writer does.
	for (8+len(hdr))%8 != 0 {
		hdr = append(hdr, ' ')
	}
	w := bufio.NewWriterSize(out, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hdr)))
	w.Write(lenBuf[:])
	w.Write(hdr)
	buf := make([]byte, 0, 1<<16)
	for _, t := range tensors {
		for i, v := range t.Data {
			buf = appendFloat(buf, v, dtype)
			if len(buf) == cap(buf) || i == len(t.Data)-1 {
				if _, err := w.Write(buf); err != nil {
					return fmt.Errorf("safetensors %s: %w", path, err)
				}
				buf = buf[:0]
			}
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("safetensors %s: %w", path, err)
	}
	return nil
}

// ReadHeader reads and validates the header of the safetensors file path:
// the length prefix, the JSON, every dtype, shape and offset pair, that the
// offsets tile the data section with no gap or overlap, and that the file
// is as long as the header says (a truncated file is refused).
func ReadHeader(path string) (*Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return readHeader(f, st.Size(), path)
}

// readHeader reads the header from r, positioned at the start of a file of
// size bytes, and leaves r at the start of the data.
func readHeader(r io.Reader, size int64, path string) (*Header, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("safetensors %s: %s", path, fmt.Sprintf(format, args...))
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return nil, bad("file is %d bytes, shorter than the 8-byte header length: truncated or not safetensors", size)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n < 2 || n > maxHeader {
		return nil, bad("header length %d is out of range [2, %d]: not a safetensors file", n, maxHeader)
	}
	if int64(8+n) > size {
		return nil, bad("header says %d bytes but the file has %d: truncated", n, size-8)
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, bad("reading header: %v", err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return nil, bad("header is not a JSON object: %v", err)
	}
	h := &Header{Path: path, Size: size}
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, bad("__metadata__ is not an object of strings: %v", err)
			}
			continue
		}
		var e rawEntry
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, bad("tensor %q: %v", name, err)
		}
		width, ok := dtypeSize[e.DType]
		if !ok {
			return nil, bad("tensor %q: unknown dtype %q", name, e.DType)
		}
		if len(e.DataOffsets) != 2 {
			return nil, bad("tensor %q: data_offsets has %d values, want 2", name, len(e.DataOffsets))
		}
		elems, err := shapeElems(e.Shape)
		if err != nil {
			return nil, bad("tensor %q: %v", name, err)
		}
		b, end := e.DataOffsets[0], e.DataOffsets[1]
		if b < 0 || end < b || end-b != elems*int64(width) {
			return nil, bad("tensor %q: data_offsets [%d, %d] do not hold %d %s values of shape %v", name, b, end, elems, e.DType, e.Shape)
		}
		h.Tensors = append(h.Tensors, HeaderEntry{Name: name, DType: e.DType, Shape: e.Shape, Begin: b, End: end, dataPos: 8 + int64(n) + b})
	}
	sort.Slice(h.Tensors, func(i, j int) bool {
		a, b := h.Tensors[i], h.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.End < b.End
	})
	var pos int64
	for _, e := range h.Tensors {
		if e.Begin != pos {
			return nil, bad("tensor %q starts at data offset %d, want %d: overlapping or gapped data", e.Name, e.Begin, pos)
		}
		pos = e.End
	}
	if pos > size-8-int64(n) {
		return nil, bad("file is %d bytes, the header needs %d more after it: truncated", size, pos)
	}
	if want := 8 + int64(n) + pos; size != want {
		if size < want {
			return nil, bad("file is %d bytes, the header needs %d: truncated", size, want)
		}
		return nil, bad("file is %d bytes, the header accounts for %d: trailing data", size, want)
	}
	return h, nil
}

// maxTensorElems bounds one tensor of a file (about 1.1e12 values).
const maxTensorElems = 1 << 40

// shapeElems is the element count of shape, refused past maxTensorElems
// by a division check on every dimension, a zero one included: a product
// of int64 dimensions wraps ([2^32, 2^32] is 0 elements).
func shapeElems(shape []int) (int64, error) {
	elems := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		if int64(d) > maxTensorElems || (elems > 0 && int64(d) > maxTensorElems/elems) {
			return 0, fmt.Errorf("shape %v has more than %d elements", shape, int64(maxTensorElems))
		}
		elems *= int64(d)
	}
	return elems, nil
}

// File is a safetensors file read whole.
type File struct {
	Header
	data map[string][]float32
}

// ReadFile reads and validates the safetensors file path; every tensor must
// be F32.
func ReadFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	h, err := readHeader(f, st.Size(), path)
	if err != nil {
		return nil, err
	}
	out := &File{Header: *h, data: make(map[string][]float32, len(h.Tensors))}
	r := bufio.NewReaderSize(f, 1<<20)
	var b4 [4]byte
	for _, e := range h.Tensors {
		if e.DType != "F32" {
			return nil, fmt.Errorf("safetensors %s: tensor %q is %s: only F32 is supported", path, e.Name, e.DType)
		}
		vals := make([]float32, (e.End-e.Begin)/4)
		for i := range vals {
			if _, err := io.ReadFull(r, b4[:]); err != nil {
				return nil, fmt.Errorf("safetensors %s: tensor %q: %w", path, e.Name, err)
			}
			vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(b4[:]))
		}
		out.data[e.Name] = vals
	}
	return out, nil
}

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (Tensor, error) {
	e, ok := f.Find(name)
	if !ok {
		return Tensor{}, fmt.Errorf("safetensors %s: no tensor %s", f.Path, name)
	}
	return Tensor{Name: name, Shape: e.Shape, Data: f.data[name]}, nil
}

// parseInt reads a metadata integer.
func parseInt(meta map[string]string, key string) (int, error) {
	s, ok := meta[key]
	if !ok {
		return 0, fmt.Errorf("no %q in __metadata__", key)
	}
	return strconv.Atoi(s)
}
