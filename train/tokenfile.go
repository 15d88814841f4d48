package train

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
)

// Token files are llm.c's and nanoGPT's pre-tokenized data (llm.c
// dev/data/data_common.py write_datafile): a header of 256 little-endian
// int32 (magic 20240520, version 1, the number of tokens), then the tokens
// as little-endian uint16. A run's --data may name one, or a glob of shards
// read as one stream in name order.
const (
	tokenMagic   = 20240520
	tokenVersion = 1
	tokenHeader  = 256 * 4
)

// tokenStream is the tokens of one or more token files, memory-mapped, as
// one stream.
type tokenStream struct {
	shards [][]uint16 // each shard's tokens
	ends   []int      // stream offset after each shard
	unmap  []func() error
}

// Len is the number of tokens of the stream.
func (s *tokenStream) Len() int {
	if len(s.ends) == 0 {
		return 0
	}
	return s.ends[len(s.ends)-1]
}

// read copies the tokens [from, from+len(dst)) of the stream into dst.
func (s *tokenStream) read(dst []int32, from int) {
	k := sort.SearchInts(s.ends, from+1)
	for i := 0; i < len(dst); {
		start := 0
		if k > 0 {
			start = s.ends[k-1]
		}
		sh := s.shards[k][from+i-start:]
		n := min(len(sh), len(dst)-i)
		for j := 0; j < n; j++ {
			dst[i+j] = int32(sh[j])
		}
		i += n
		k++
	}
}

// Close unmaps the files.
func (s *tokenStream) Close() error {
	var first error
	for _, u := range s.unmap {
		if err := u(); err != nil && first == nil {
			first = err
		}
	}
	s.unmap = nil
	return first
}

// IsTokenData reports whether --data names token files: a glob, a .bin
// path, or a path whose first match starts with the token files' magic.
func IsTokenData(data string) bool {
	if strings.ContainsAny(data, "*?[") || filepath.Ext(data) == ".bin" {
		return true
	}
	paths, err := filepath.Glob(data)
	if err != nil || len(paths) == 0 {
		return false
	}
	f, err := os.Open(paths[0])
	if err != nil {
		return false
	}
	defer f.Close()
	var b [4]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return false
	}
	return binary.LittleEndian.Uint32(b[:]) == tokenMagic
}

// openTokenFiles maps the token files that pattern (a path or a glob)
// names, checking each header and size and that every token is below
// vocab.
func openTokenFiles(pattern string, vocab int) (*tokenStream, error) {
	paths, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("data %s: %v", pattern, err)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("data %s: no such file", pattern)
	}
	sort.Strings(paths)
	s := &tokenStream{}
	for _, p := range paths {
		toks, unmap, err := mapTokenFile(p)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.unmap = append(s.unmap, unmap)
		for i, t := range toks {
			if int(t) >= vocab {
				s.Close()
				return nil, fmt.Errorf("data %s: token %d at position %d is outside the model's vocabulary of %d", p, t, i, vocab)
			}
		}
		s.shards = append(s.shards, toks)
		s.ends = append(s.ends, s.Len()+len(toks))
	}
	return s, nil
}

// mapTokenFile maps the token file path and returns its tokens.
func mapTokenFile(path string) ([]uint16, func() error, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("data: %w", err)
	}
	hdr := make([]byte, tokenHeader)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, nil, fmt.Errorf("data %s: %d bytes, shorter than the 1024-byte token file header", path, st.Size())
	}
	h := func(i int) int64 { return int64(int32(binary.LittleEndian.Uint32(hdr[4*i:]))) }
	if h(0) != tokenMagic {
		return nil, nil, fmt.Errorf("data %s: magic %d, token files have %d", path, h(0), tokenMagic)
	}
	if h(1) != tokenVersion {
		return nil, nil, fmt.Errorf("data %s: token file version %d: hpcrun reads version 1 (uint16 tokens)", path, h(1))
	}
	if want := tokenHeader + 2*h(2); h(2) < 0 || st.Size() != want {
		return nil, nil, fmt.Errorf("data %s: %d bytes, its header's %d tokens need %d: truncated or corrupt", path, st.Size(), h(2), want)
	}
	if h(2) == 0 {
		return nil, func() error { return nil }, nil
	}
	return mmapTokens(f, path, int(h(2)))
}

// WriteTokenFile writes tokens as a token file (version 1, uint16) at path,
// through a temporary file renamed on success.
func WriteTokenFile(path string, tokens []int) error {
	hdr := make([]int32, 256)
	hdr[0], hdr[1], hdr[2] = tokenMagic, tokenVersion, int32(len(tokens))
	buf := make([]byte, 0, tokenHeader+2*len(tokens))
	for _, v := range hdr {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
	}
	for i, t := range tokens {
		if t < 0 || t > 0xffff {
			return fmt.Errorf("token file %s: token %d at position %d does not fit in uint16", path, t, i)
		}
		buf = binary.LittleEndian.AppendUint16(buf, uint16(t))
	}
	return atomicfile.Write(path, 0o644, func(w io.Writer) error {
		_, err := w.Write(buf)
		return err
	})
}

// prepareTokens makes a language model's data from token files: windows
// of seq+1 tokens, stride seq, over the files as one stream, the last tenth
// (at least one window) validating, as prepareText does with a text.
func prepareTokens(cfg Config) (*Data, error) {
	tok, err := newTokenizer(cfg, nil)
	if err != nil {
		return nil, err
	}
	vocab, err := modelVocab(cfg, tok)
	if err != nil {
		return nil, err
	}
	s, err := openTokenFiles(cfg.Data, vocab)
	if err != nil {
		return nil, err
	}
	nWin := (s.Len() - 1) / cfg.Seq
	if nWin < 2 {
		s.Close()
		return nil, fmt.Errorf("data %s: %d tokens make %d window(s) of seq %d, need at least 2 (one to train, one to validate): lower --seq or give more tokens", cfg.Data, s.Len(), nWin, cfg.Seq)
	}
	nVal := max(1, nWin/10)
	nTrain := nWin - nVal
	if cfg.Samples > 0 && cfg.Samples < nTrain {
		nTrain = cfg.Samples
	}
	train := &Dataset{Seq: cfg.Seq, stream: s, n: nTrain}
	val := &Dataset{Seq: cfg.Seq, stream: s, first: nWin - nVal, n: min(nVal, cfg.evalSamples())}
	return &Data{Tokenizer: tok, Vocab: vocab, Train: train, Val: val}, nil
}
