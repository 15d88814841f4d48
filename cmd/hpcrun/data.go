package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/hpcrun/hpcrun/train/data"
	"github.com/hpcrun/hpcrun/train/tokenizer"
	"github.com/urfave/cli/v2"
)

func dataCommand() *cli.Command {
	return &cli.Command{
		Name:  "data",
		Usage: "prepare training data",
		Subcommands: []*cli.Command{
			{
				Name:      "tokenize",
				Usage:     "tokenize text files with GPT-2's BPE (or a tokenizer.json) into a token file (llm.c / nanoGPT .bin) for --data",
				ArgsUsage: "TEXT... -o OUT.bin",
				Description: "The texts are joined with GPT-2's end-of-text token (50256) between them; one text gives\n" +
					"the tokens hpcrun would make of it in process. OUT.bin has llm.c's header (256 int32:\n" +
					"magic 20240520, version 1, token count) and uint16 tokens. --tokenizer reads a Hugging Face\n" +
					"tokenizer.json instead (its end-of-text token between texts); a tokenizer of more than\n" +
					"65,536 ids (Llama 3's) gets llm.c's uint32 format (magic 20240801, version 7). Train on the\n" +
					"file with --tokenizer hf --vocab-file the same tokenizer.json.",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "the token `FILE` to write (required)"},
					&cli.BoolFlag{Name: "force", Usage: "replace FILE when it exists"},
					&cli.StringFlag{Name: "tokenizer", Usage: "a Hugging Face tokenizer.json (or its `DIR`) to use instead of GPT-2's BPE"},
					&cli.BoolFlag{Name: "json", Usage: "print what was written (file, tokens, format) as JSON"},
				},
				Action: dataTokenize,
			},
		},
	}
}

func dataTokenize(c *cli.Context) error {
	args, out, force := c.Args().Slice(), c.String("output"), c.Bool("force")
	if out == "" || len(args) == 0 {
		return cli.Exit("usage: hpcrun data tokenize TEXT... -o OUT.bin", 2)
	}
	if _, err := os.Stat(out); err == nil && !force {
		return cli.Exit(fmt.Sprintf("%s exists: choose another -o or pass --force to replace it", out), 2)
	}
	var tok tokenizer.Tokenizer
	var err error
	if path := c.String("tokenizer"); path != "" {
		tok, err = tokenizer.LoadHF(path)
	} else {
		tok, err = tokenizer.NewGPT2()
	}
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	ids, err := data.TokenizeFiles(tok, args)
	if err == nil {
		err = data.WriteTokenFile(out, ids, tok.VocabSize())
	}
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	if wantJSON(c) {
		format := "uint16"
		if tok.VocabSize() > 1<<16 {
			format = "uint32"
		}
		return json.NewEncoder(c.App.Writer).Encode(map[string]any{"output": out, "tokens": len(ids), "inputs": args,
			"tokenizer": tok.Name(), "vocab": tok.VocabSize(), "format": format})
	}
	fmt.Fprintf(os.Stderr, "%d tokens from %s into %s\n", len(ids), strings.Join(args, ", "), out)
	return nil
}
