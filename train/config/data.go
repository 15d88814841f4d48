package config

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// TokenMagic opens every token file (hpcrun data tokenize, llm.c's format).
const TokenMagic = 20240520

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
	return binary.LittleEndian.Uint32(b[:]) == TokenMagic
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
