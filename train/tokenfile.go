package train

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"sync"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/train/config"
)

// Token files are llm.c's and nanoGPT's pre-tokenized data (llm.c
// dev/data/data_common.py write_datafile): a header of 256 little-endian
// int32 (magic 20240520, version 1, the number of tokens), then the tokens
// as little-endian uint16. A run's --data may name one, or a glob of shards
// read as one stream in name order.
const (
	tokenMagic   = config.TokenMagic
	tokenVersion = 1
	tokenHeader  = 256 * 4
)

// tokenStream is the tokens of one or more token files, memory-mapped, as
// one stream.
type tokenStream struct {
	shards [][]uint16 // each shard's tokens
	paths  []string   // each shard's file
	ends   []int      // stream offset after each shard
	unmap  []func() error

	mu  sync.Mutex
	err error // the first failed read: a file truncated under the mapping
}

// Len is the number of tokens of the stream.
func (s *tokenStream) Len() int {
	if len(s.ends) == 0 {
		return 0
	}
	return s.ends[len(s.ends)-1]
}

// read copies the tokens [from, from+len(dst)) of the stream into dst. A
// file truncated since it was mapped (rewritten while training) faults on
// the pages it lost: read then leaves the rest of dst zero and records the
// error that Err returns, instead of the process dying of SIGBUS.
func (s *tokenStream) read(dst []int32, from int) {
	k := sort.SearchInts(s.ends, from+1)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		if _, ok := p.(interface{ Addr() uintptr }); !ok {
			panic(p)
		}
		clear(dst)
		path := "?"
		if k < len(s.paths) {
			path = s.paths[k]
		}
		size := "unknown size"
		if st, err := os.Stat(path); err == nil {
			size = fmt.Sprintf("now %d bytes", st.Size())
		}
		s.mu.Lock()
		if s.err == nil {
			s.err = fmt.Errorf("data %s: the file shrank while training (%s; it held %d tokens when mapped): do not rewrite token files under a running job", path, size, len(s.shards[k]))
		}
		s.mu.Unlock()
	}()
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

// Err is the first failed read of the stream, if any.
func (s *tokenStream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
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
		if err := checkVocab(toks, p, vocab); err != nil {
			s.Close()
			return nil, err
		}
		s.shards = append(s.shards, toks)
		s.paths = append(s.paths, p)
		s.ends = append(s.ends, s.Len()+len(toks))
	}
	return s, nil
}

// checkVocab checks that every token of the mapped file path is below
// vocab; a file truncated meanwhile is an error, not SIGBUS.
func checkVocab(toks []uint16, path string, vocab int) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(interface{ Addr() uintptr }); !ok {
				panic(p)
			}
			err = fmt.Errorf("data %s: the file shrank while it was read: do not rewrite token files in use", path)
		}
	}()
	for i, t := range toks {
		if int(t) >= vocab {
			return fmt.Errorf("data %s: token %d at position %d is outside the model's vocabulary of %d", path, t, i, vocab)
		}
	}
	return nil
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

// TokenizeFiles is the tokens of the text files at paths, each a sequence
// (EncodeSequence: with Llama's begin-of-text), joined by the tokenizer's
// end-of-text token: what hpcrun data tokenize writes. A
// tokenizer whose ids do not fit a token file's uint16 is refused before
// any text is read.
func TokenizeFiles(tok Tokenizer, paths []string) ([]int, error) {
	if n := tok.VocabSize(); n > 1<<16 {
		return nil, fmt.Errorf("the %s tokenizer has %d ids: a token file holds ids below 65536 (uint16); train on the text itself instead", tok.Name(), n)
	}
	var ids []int
	for i, p := range paths {
		text, err := LoadText(p)
		if err != nil {
			return nil, err
		}
		// Documents are joined by end-of-text, once: a post-processor may
		// have ended the last one with it already.
		if eot := tok.Specials().EOT; i > 0 && (len(ids) == 0 || ids[len(ids)-1] != eot) {
			ids = append(ids, eot)
		}
		ids = append(ids, EncodeSequence(tok, text)...)
	}
	return ids, nil
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
func prepareTokens(cfg config.Config) (*Data, error) {
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
	val := &Dataset{Seq: cfg.Seq, stream: s, first: nWin - nVal, n: min(nVal, cfg.ValSamples())}
	return &Data{Tokenizer: tok, Vocab: vocab, Train: train, Val: val}, nil
}
