package config

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// TokenMagic opens a token file of uint16 tokens (hpcrun data tokenize,
// llm.c's GPT-2 format).
const TokenMagic = 20240520

// TokenMagic32 opens a token file of uint32 tokens (llm.c's Llama 3
// format), which hpcrun data tokenize writes for a vocabulary of more than
// 65,536 ids.
const TokenMagic32 = 20240801

// IsTokenData reports whether --data names token files: a glob, a .bin
// path, or a path whose first match starts with either token file magic.
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
	m := binary.LittleEndian.Uint32(b[:])
	return m == TokenMagic || m == TokenMagic32
}

// DefaultTokenizer is the tokenizer used when the config names none:
// WordPiece for the classifier, byte-level for a language model, GPT-2 BPE
// for the gpt2-* presets (which set it).
func DefaultTokenizer(model string) string {
	if model == "gpt" || model == "llama" {
		return "byte"
	}
	return "wordpiece"
}
