package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hpcrun/hpcrun/train/config"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// HFFiles are the files, by name, that give a Hugging Face directory the
// tokenizer of a run of cfg: GPT-2's BPE as tokenizer.json, vocab.json and
// merges.txt (GPT2TokenizerFast's and GPT2Tokenizer's files); the byte
// tokenizer as a byte-level tokenizer.json of 256 ids, each a byte, no
// merges, bytes 0-2 read as spaces and tokenizer_config.json naming byte 2
// the end of text and byte 0 the padding, as Byte does; a Hugging Face
// tokenizer.json (a GPT's: interop copies a Llama's itself) and its
// tokenizer_config.json as they are. None for WordPiece.
func HFFiles(cfg config.Config) (map[string][]byte, error) {
	switch cfg.TokenizerName() {
	case "gpt2":
		return gpt2TokenizerFiles()
	case "byte":
		return byteTokenizerFiles()
	case "hf":
		if cfg.Model == "llama" {
			return nil, nil
		}
		path := cfg.VocabFile
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			path = filepath.Join(path, "tokenizer.json")
		}
		files := map[string][]byte{}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		files["tokenizer.json"] = b
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(path), "tokenizer_config.json")); err == nil {
			files["tokenizer_config.json"] = b
		}
		return files, nil
	}
	return nil, nil
}

// byteLevelJSON is a tokenizer.json of a byte-level BPE: vocab (tokens in
// GPT-2's byte alphabet) and merges, GPT-2's pre-tokenizer and decoder.
func byteLevelJSON(vocab map[string]int, merges []string, added []map[string]any, normalizer any) ([]byte, error) {
	byteLevel := func(prefix bool) map[string]any {
		return map[string]any{"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": true}
	}
	return json.Marshal(map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens": added, "normalizer": normalizer,
		"pre_tokenizer": byteLevel(false), "post_processor": nil, "decoder": byteLevel(true),
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "", "end_of_word_suffix": "",
			"fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges,
		},
	})
}

func byteTokenizerFiles() (map[string][]byte, error) {
	vocab := make(map[string]int, 256)
	for b := range 256 {
		vocab[ByteLevel([]byte{byte(b)})] = b
	}
	var spaces []any
	for b := range 3 {
		spaces = append(spaces, map[string]any{"type": "Replace", "pattern": map[string]string{"String": string(rune(b))}, "content": " "})
	}
	tok, err := byteLevelJSON(vocab, []string{}, []map[string]any{}, map[string]any{"type": "Sequence", "normalizers": spaces})
	if err != nil {
		return nil, err
	}
	conf, err := json.Marshal(map[string]any{
		"tokenizer_class": "PreTrainedTokenizerFast",
		"eos_token":       ByteLevel([]byte{2}), "pad_token": ByteLevel([]byte{0}),
	})
	if err != nil {
		return nil, err
	}
	return map[string][]byte{"tokenizer.json": tok, "tokenizer_config.json": conf}, nil
}

// gpt2TokenizerFiles writes r50k_base's ranks as GPT-2's files: the vocab
// is the ranks; tiktoken keeps no merges, so each token's merge is found
// again as the two parts that byte-pair encoding its bytes with the tokens
// ranked before it leaves.
func gpt2TokenizerFiles() (map[string][]byte, error) {
	ranks, err := tiktokenloader.NewOfflineLoader().LoadTiktokenBpe("https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken")
	if err != nil {
		return nil, fmt.Errorf("gpt2 tokenizer: %w", err)
	}
	byRank := make([]string, len(ranks))
	vocab := make(map[string]int, len(ranks)+1)
	for tok, r := range ranks {
		if r < 0 || r >= len(byRank) {
			return nil, fmt.Errorf("gpt2 tokenizer: rank %d of %d", r, len(ranks))
		}
		byRank[r] = tok
		vocab[ByteLevel([]byte(tok))] = r
	}
	const eot = "<|endoftext|>"
	vocab[eot] = len(ranks)
	var merges []string
	for r, tok := range byRank {
		if len(tok) < 2 {
			continue
		}
		parts := bpeBelow([]byte(tok), ranks, r)
		if len(parts) != 2 {
			return nil, fmt.Errorf("gpt2 tokenizer: token %d (%q) is not the merge of two earlier tokens", r, tok)
		}
		merges = append(merges, ByteLevel(parts[0])+" "+ByteLevel(parts[1]))
	}
	added := []map[string]any{{"id": len(ranks), "content": eot, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}}
	tok, err := byteLevelJSON(vocab, merges, added, nil)
	if err != nil {
		return nil, err
	}
	vocabJSON, err := json.Marshal(vocab)
	if err != nil {
		return nil, err
	}
	conf, err := json.Marshal(map[string]any{
		"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": false,
		"bos_token": eot, "eos_token": eot, "unk_token": eot,
	})
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		"tokenizer.json": tok, "vocab.json": vocabJSON, "tokenizer_config.json": conf,
		"merges.txt": []byte("#version: 0.2\n" + strings.Join(merges, "\n") + "\n"),
	}, nil
}

// bpeBelow byte-pair encodes b with the tokens of ranks below limit: from
// single bytes, the adjacent pair whose join ranks lowest is merged while
// one ranks below limit.
func bpeBelow(b []byte, ranks map[string]int, limit int) [][]byte {
	parts := make([][]byte, len(b))
	for i := range b {
		parts[i] = b[i : i+1]
	}
	for len(parts) > 1 {
		best, at := limit, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := ranks[string(parts[i])+string(parts[i+1])]; ok && r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		parts[at] = append(slices.Clip(parts[at]), parts[at+1]...)
		parts = slices.Delete(parts, at+1, at+2)
	}
	return parts
}
