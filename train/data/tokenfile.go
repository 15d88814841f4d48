package data

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"sync"

	"github.com/hpcrun/hpcrun/internal/atomicfile"
	"github.com/hpcrun/hpcrun/train/config"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// Token files are llm.c's and nanoGPT's pre-tokenized data (llm.c
// dev/data/data_common.py write_datafile): a header of 256 little-endian
// int32 (magic, version, the number of tokens), then the tokens. llm.c's
// GPT-2 format (magic 20240520, version 1) holds little-endian uint16, its
// Llama 3 format (magic 20240801, version 7) little-endian uint32. A run's
// --data may name one, or a glob of shards, of either format, read as one
// stream in name order.
const (
	tokenMagic     = config.TokenMagic
	tokenVersion   = 1
	tokenMagic32   = config.TokenMagic32
	tokenVersion32 = 7
	tokenHeader    = 256 * 4
)

// tokenShard is the tokens of one token file: u16 or u32, as its header
// says; the other is nil.
type tokenShard struct {
	u16 []uint16
	u32 []uint32
}

func (s tokenShard) len() int { return len(s.u16) + len(s.u32) }

// copyTokens copies src into dst as int32, as many as both hold.
func copyTokens[T uint16 | uint32](dst []int32, src []T) int {
	n := min(len(dst), len(src))
	for j := range n {
		dst[j] = int32(src[j])
	}
	return n
}

// firstOutside is the position of the first token of toks not below
// vocab, or -1.
func firstOutside[T uint16 | uint32](toks []T, vocab int) int {
	for i, t := range toks {
		if int(t) >= vocab {
			return i
		}
	}
	return -1
}

// tokenStream is the tokens of one or more token files, memory-mapped, as
// one stream.
type tokenStream struct {
	shards []tokenShard // each shard's tokens
	paths  []string     // each shard's file
	ends   []int        // stream offset after each shard
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
			s.err = fmt.Errorf("data %s: the file shrank while training (%s; it held %d tokens when mapped): do not rewrite token files under a running job", path, size, s.shards[k].len())
		}
		s.mu.Unlock()
	}()
	for i := 0; i < len(dst); {
		start := 0
		if k > 0 {
			start = s.ends[k-1]
		}
		if sh := s.shards[k]; sh.u32 != nil {
			i += copyTokens(dst[i:], sh.u32[from+i-start:])
		} else {
			i += copyTokens(dst[i:], sh.u16[from+i-start:])
		}
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
		s.ends = append(s.ends, s.Len()+toks.len())
	}
	return s, nil
}

// checkVocab checks that every token of the mapped file path is below
// vocab; a file truncated meanwhile is an error, not SIGBUS.
func checkVocab(toks tokenShard, path string, vocab int) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(interface{ Addr() uintptr }); !ok {
				panic(p)
			}
			err = fmt.Errorf("data %s: the file shrank while it was read: do not rewrite token files in use", path)
		}
	}()
	if i := firstOutside(toks.u16, vocab); i >= 0 {
		return fmt.Errorf("data %s: token %d at position %d is outside the model's vocabulary of %d", path, toks.u16[i], i, vocab)
	}
	if i := firstOutside(toks.u32, vocab); i >= 0 {
		return fmt.Errorf("data %s: token %d at position %d is outside the model's vocabulary of %d", path, toks.u32[i], i, vocab)
	}
	return nil
}

// mapTokenFile maps the token file path and returns its tokens.
func mapTokenFile(path string) (tokenShard, func() error, error) {
	f, err := os.Open(path)
	if err != nil {
		return tokenShard{}, nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return tokenShard{}, nil, fmt.Errorf("data: %w", err)
	}
	hdr := make([]byte, tokenHeader)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return tokenShard{}, nil, fmt.Errorf("data %s: %d bytes, shorter than the 1024-byte token file header", path, st.Size())
	}
	h := func(i int) int64 { return int64(int32(binary.LittleEndian.Uint32(hdr[4*i:]))) }
	var width int64
	switch {
	case h(0) != tokenMagic && h(0) != tokenMagic32:
		return tokenShard{}, nil, fmt.Errorf("data %s: magic %d, token files have %d (uint16 tokens) or %d (uint32)", path, h(0), tokenMagic, tokenMagic32)
	case h(0) == tokenMagic && h(1) == tokenVersion:
		width = 2
	case h(0) == tokenMagic32 && h(1) == tokenVersion32:
		width = 4
	default:
		return tokenShard{}, nil, fmt.Errorf("data %s: token file magic %d, version %d: hpcrun reads magic %d version %d (uint16 tokens) and magic %d version %d (uint32)",
			path, h(0), h(1), tokenMagic, tokenVersion, tokenMagic32, tokenVersion32)
	}
	if want := tokenHeader + width*h(2); h(2) < 0 || st.Size() != want {
		return tokenShard{}, nil, fmt.Errorf("data %s: %d bytes, its header's %d tokens need %d: truncated or corrupt", path, st.Size(), h(2), want)
	}
	if h(2) == 0 {
		return tokenShard{}, func() error { return nil }, nil
	}
	return mmapTokens(f, path, int(h(2)), int(width))
}

// TokenizeFiles is the tokens of the text files at paths, each a sequence
// (EncodeSequence: with Llama's begin-of-text), joined by the tokenizer's
// end-of-text token: what hpcrun data tokenize writes.
func TokenizeFiles(tok tokenizer.Tokenizer, paths []string) ([]int, error) {
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
		doc, err := tokenizer.EncodeSequence(tok, text)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		ids = append(ids, doc...)
	}
	return ids, nil
}

// WriteTokenFile writes tokens, ids of a vocabulary of vocab ids, as a
// token file at path, through a temporary file renamed on success: in
// llm.c's GPT-2 format (uint16) when every id of the vocabulary fits in 16
// bits, else in its Llama 3 format (uint32). The format follows the
// vocabulary, not the tokens, so that every file of one tokenizer has the
// same format.
func WriteTokenFile(path string, tokens []int, vocab int) error {
	if vocab <= 0 || int64(vocab) > 1<<32 {
		return fmt.Errorf("token file %s: a vocabulary of %d ids: want 1 to 2^32", path, vocab)
	}
	if len(tokens) > math.MaxInt32 {
		return fmt.Errorf("token file %s: %d tokens, a token file holds at most %d: write shards", path, len(tokens), math.MaxInt32)
	}
	magic, version, width := tokenMagic, tokenVersion, 2
	if vocab > 1<<16 {
		magic, version, width = tokenMagic32, tokenVersion32, 4
	}
	hdr := make([]int32, 256)
	hdr[0], hdr[1], hdr[2] = int32(magic), int32(version), int32(len(tokens))
	buf := make([]byte, 0, tokenHeader+width*len(tokens))
	for _, v := range hdr {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(v))
	}
	for i, t := range tokens {
		if t < 0 || t >= vocab {
			return fmt.Errorf("token file %s: token %d at position %d is outside the vocabulary of %d", path, t, i, vocab)
		}
		if width == 2 {
			buf = binary.LittleEndian.AppendUint16(buf, uint16(t))
		} else {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
	}
	return atomicfile.Write(path, 0o644, func(w io.Writer) error {
		_, err := w.Write(buf)
		return err
	})
}

// prepareTokens makes a language model's data from token files: windows
// of seq+1 tokens, stride seq, over the files as one stream, the last
// max(1, windows/10) validating, as prepareText does with a text.
func prepareTokens(cfg config.Config) (*Data, error) {
	tok, err := tokenizer.New(cfg, nil)
	if err != nil {
		return nil, err
	}
	vocab, err := ModelVocab(cfg, tok)
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
