package main

import (
	"fmt"
	"strings"

	"github.com/hpcrun/hpcrun/train"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
	"github.com/urfave/cli/v2"
)

// trainFlags are the training options shared by `submit` and `run`. A flag
// left unset keeps the value from the config (or trainconfig.DefaultConfig).
func trainFlags() []cli.Flag {
	const cat = "training"
	flags := []cli.Flag{
		&cli.IntFlag{Name: "ntasks", Aliases: []string{"n"}, Usage: "total tasks (ranks) = pp x data-parallel degree x tp", Category: cat},
		&cli.IntFlag{Name: "tp", Usage: "tensor-parallel degree", Category: cat},
		&cli.IntFlag{Name: "pp", Usage: "pipeline-parallel degree: the blocks split into pp stages, 1F1B schedule (layers % pp == 0; 0 = 1: no pipeline)", Category: cat},
		&cli.IntFlag{Name: "micro-batches", Usage: "micro-batches of bsz per optimizer step through the pipeline (pp > 1, at least pp; 0 = pp)", Category: cat},
		&cli.StringFlag{Name: "pp-split", Usage: "blocks of each pipeline stage, e.g. 3,1 (pp counts summing to layers; default layers/pp each)", Category: cat},
		&cli.BoolFlag{Name: "sp", Usage: "sequence parallelism: layer norms and residuals split along the sequence over tp (seq % tp == 0)", Category: cat},
		&cli.IntFlag{Name: "zero", Usage: "1: ZeRO-1, AdamW moments sharded over the data-parallel group; 2: ZeRO-2, the gradients too (each block's reduce-scattered as its backward ends); 3: ZeRO-3 (FSDP), the parameters too (each block's gathered before its forward and its backward); 0: replicated", Category: cat},
		&cli.StringFlag{Name: "zero-group", Usage: "hybrid sharding (HSDP): ZeRO shards over groups of this many consecutive data-parallel ranks and replicates across them; node: the data-parallel ranks of one node (default: all of them)", Category: cat},
		&cli.StringFlag{Name: "recompute", Usage: "activation recomputation: none, selective (the attention probabilities, recomputed in backward) or full (each block's forward again from its input, its saved buffers shared); the same gradients to the bit", Category: cat},
		&cli.StringFlag{Name: "grad-reduce", Usage: "the data-parallel gradient reduction's type: fp32, or bf16 at --precision bf16 (each bucket rounded to bfloat16 and all-reduced, or reduce-scattered under ZeRO, in bfloat16: half the bytes, as Megatron-LM's --grad-reduce-in-bf16)", Category: cat},
		&cli.StringFlag{Name: "attention", Usage: "auto (the GPU's fused FlashAttention-2 kernels at tf32 or bf16, for head sizes 32, 64 and 128; else unfused), fused (refuse to run without them) or unfused (the (T,T) probabilities in memory)", Category: cat},
		&cli.StringFlag{Name: "model", Usage: "bert (classifier), gpt or llama (causal LMs)", Category: cat},
		&cli.StringFlag{Name: "preset", Usage: "tiny, small, bert-base, bert-large, gpt2-124m, gpt2-350m, llama-tiny, smollm-135m, llama-1b; other flags win over it", Category: cat},
		&cli.IntFlag{Name: "layers", Usage: "transformer blocks", Category: cat},
		&cli.IntFlag{Name: "dim", Usage: "hidden size", Category: cat},
		&cli.IntFlag{Name: "heads", Usage: "attention heads", Category: cat},
		&cli.IntFlag{Name: "seq", Usage: "sequence length in tokens", Category: cat},
		&cli.IntFlag{Name: "kv-heads", Usage: "llama: key/value heads, each shared by a group of query heads (0 = heads); tp must divide them", Category: cat},
		&cli.IntFlag{Name: "ffn", Usage: "llama: SwiGLU width (0 = 8/3 dim rounded up to a multiple of 256)", Category: cat},
		&cli.Float64Flag{Name: "norm-eps", Usage: "llama: RMSNorm epsilon (0 = 1e-5)", Category: cat},
		&cli.Float64Flag{Name: "rope-theta", Usage: "llama: rotary embeddings' base (0 = 10000)", Category: cat},
		&cli.Float64Flag{Name: "rope-factor", Usage: "llama: Llama 3's rope scaling factor (0 = no scaling; with --rope-low-freq, --rope-high-freq, --rope-original-seq)", Category: cat},
		&cli.Float64Flag{Name: "rope-low-freq", Usage: "llama: Llama 3's rope scaling low_freq_factor", Category: cat},
		&cli.Float64Flag{Name: "rope-high-freq", Usage: "llama: Llama 3's rope scaling high_freq_factor", Category: cat},
		&cli.IntFlag{Name: "rope-original-seq", Usage: "llama: Llama 3's rope scaling original_max_position_embeddings", Category: cat},
		&cli.BoolFlag{Name: "untied-head", Usage: "llama: an LM head of its own instead of the token embedding", Category: cat},
		&cli.IntFlag{Name: "bsz", Usage: "batch size per data-parallel rank", Category: cat},
		&cli.IntFlag{Name: "grad-accum", Usage: "micro-batches per optimizer step", Category: cat},
		&cli.IntFlag{Name: "epochs", Usage: "passes over the training samples", Category: cat},
		&cli.IntFlag{Name: "samples", Usage: "training samples to use (0 = all)", Category: cat},
		&cli.IntFlag{Name: "steps", Usage: "optimizer steps (0 = from epochs and samples)", Category: cat},
		&cli.Float64Flag{Name: "lr", Usage: "peak learning rate", Category: cat},
		&cli.IntFlag{Name: "warmup", Usage: "learning-rate warm-up steps", Category: cat},
		&cli.StringFlag{Name: "precision", Usage: "matmul precision: fp32, tf32 (a GPU's tensor cores on float32: fastest on a GPU today) or bf16", Category: cat},
		&cli.StringFlag{Name: "data", Usage: "synthetic (built in: reviews for bert, a generated text for gpt), an IMDb-format CSV (review,sentiment), or for gpt a text file or token files (llm.c/nanoGPT .bin, a glob of shards; see hpcrun data tokenize)", Category: cat},
		&cli.StringFlag{Name: "tokenizer", Usage: "byte, gpt2, wordpiece or hf (a Hugging Face tokenizer.json, given by --vocab-file) (default: the model's)", Category: cat},
		&cli.Int64Flag{Name: "seed", Usage: "random seed for weights and data order", Category: cat},
		&cli.IntFlag{Name: "eval-every", Usage: "steps between validations (0 = at the end)", Category: cat},
		&cli.StringFlag{Name: "device", Usage: "auto, cpu or cuda", Category: cat},
		&cli.StringFlag{Name: "comm", Usage: "collectives: auto (NCCL on device buffers when the device is cuda and NCCL loads), tcp (host ring) or nccl", Category: cat},
		&cli.StringFlag{Name: "vocab-file", Usage: "BERT vocab.txt for the wordpiece tokenizer, cased as the tokenizer_config.json beside it says (none: lower-cased, accents stripped) (default: build one from the training texts); for hf, a tokenizer.json or its directory", Category: cat},
		&cli.IntFlag{Name: "vocab", Usage: "vocabulary size before padding (0 = the tokenizer's)", Category: cat},
		&cli.IntFlag{Name: "eval-samples", Usage: "validation samples per evaluation, the first of the validation set (0 = 512): a CSV's max(1, reviews/10) reviews drawn from --seed, a text's or token files' last max(1, windows/10) windows (divisions rounded down)", Category: cat},
		&cli.Float64Flag{Name: "weight-decay", Usage: "AdamW decoupled weight decay, on the linear weights and the token and position embeddings; biases and layer norms are exempt", Category: cat},
		&cli.Float64Flag{Name: "grad-clip", Usage: "clip the global gradient norm to C: when the norm exceeds C every gradient is scaled by C/(norm+1e-6) (0 = off)", Category: cat},
		&cli.IntFlag{Name: "positions", Usage: "rows of the position table, the model's n_positions (0 = seq); --init-from sets it", Category: cat},
		&cli.StringFlag{Name: "arch", Usage: "bert's layout: \"\" (hpcrun's: pre-LN, mean-pooled head) or hf (BERT's: post-LN, token types, pooler); --init-from a BERT sets it", Category: cat},
		&cli.StringFlag{Name: "init-from", Usage: "start from pretrained weights: a Hugging Face GPT-2 dir (config.json, model.safetensors or its shards), a Hugging Face BERT dir (BertModel or BertForSequenceClassification, with its vocab.txt), a Hugging Face Llama dir (LlamaForCausalLM, with its tokenizer.json) or an llm.c .bin; the model's shape comes from it", Category: cat},
		&cli.Float64Flag{Name: "adam-beta1", Usage: "AdamW beta1 (0 = 0.9)", Category: cat},
		&cli.Float64Flag{Name: "adam-beta2", Usage: "AdamW beta2 (0 = 0.95 for gpt and llama, 0.999 for bert)", Category: cat},
		&cli.Float64Flag{Name: "adam-eps", Usage: "AdamW epsilon (0 = 1e-8)", Category: cat},
		&cli.StringFlag{Name: "schedule", Usage: "learning rate after warm-up: cosine, linear (both decay to --min-lr) or constant", Category: cat},
		&cli.Float64Flag{Name: "min-lr", Usage: "learning rate at the end of cosine or linear decay (0 = lr/10)", Category: cat},
		&cli.BoolFlag{Name: "shuffle", Usage: "shuffle the training samples each epoch from --seed (--shuffle=false: in file order); dp rank r takes the r-th of every dp samples; either way an epoch ends with its last whole step: the samples short of one (dp x bsz x micro-batches) are dropped", Category: cat},
		&cli.IntFlag{Name: "ckpt-every", Usage: "steps between checkpoints (0 = at the end and on a stop signal, -1 = never)", Category: "checkpoints"},
		&cli.IntFlag{Name: "ckpt-keep", Usage: "checkpoints kept (0 = 3)", Category: "checkpoints"},
		&cli.IntFlag{Name: "max-requeues", Usage: "times a job stopped by its time-limit signal requeues itself (0 = 10)", Category: "checkpoints"},
		&cli.StringFlag{Name: "stop-signal", Usage: "signal asking for save-and-stop: USR1 or USR2", Category: "checkpoints"},
		&cli.StringFlag{Name: "comm-timeout", Usage: "how long a rank waits for a peer before failing, naming it (a lost node is noticed within it), e.g. 30s or 10m (default 30s)", Category: "checkpoints"},
		&cli.StringFlag{Name: "resume-from", Usage: "start from this checkpoint (step dir, ckpt dir or run dir), at any tp", Category: "checkpoints"},
	}
	showBuiltinDefaults(flags)
	return flags
}

// applyTrainFlags overrides cfg with the training flags the user set. A
// --preset is applied first, so that any other flag the user set wins over
// it (--preset bert-base --layers 4 is a 4-layer BERT-base); --model is
// applied before the preset too, so that the size presets (tiny, small) keep
// the chosen model. The only error is an unknown preset.
func applyTrainFlags(c *cli.Context, cfg *trainconfig.Config) error {
	if c.IsSet("model") {
		cfg.Model = c.String("model")
	}
	if c.IsSet("preset") {
		if err := cfg.ApplyPreset(c.String("preset")); err != nil {
			return err
		}
	}
	// Every other flag is the trainconfig.Config field of the same name in TOML
	// (grad-accum is grad_accum): one list, the Config's.
	for _, key := range trainconfig.Keys() {
		name := strings.ReplaceAll(key, "_", "-")
		if key == "preset" || !c.IsSet(name) {
			continue
		}
		if err := cfg.Set(key, c.Value(name)); err != nil {
			return fmt.Errorf("--%s: %w", name, err)
		}
	}
	return nil
}

// applyInitFrom gives cfg the model shape of its --init-from weights; a
// model flag the user set that contradicts them is an error naming both.
// It then names the tokenizer the run will use, so that train.toml records
// it (eval and generate decode with it).
func applyInitFrom(c *cli.Context, cfg *trainconfig.Config) error {
	if err := train.ApplyInitFrom(cfg, func(key string) bool { return c.IsSet(strings.ReplaceAll(key, "_", "-")) }); err != nil {
		return err
	}
	cfg.Tokenizer = cfg.TokenizerName()
	return nil
}

// showBuiltinDefaults makes --help print trainconfig.DefaultConfig's value for
// each flag (a config file may change it: see hpcrun config show) rather
// than the flag's zero value, which would never be used.
func showBuiltinDefaults(flags []cli.Flag) {
	byKey := trainconfig.DefaultConfig().Strings()
	for _, f := range flags {
		text := byKey[strings.ReplaceAll(f.Names()[0], "-", "_")]
		switch f := f.(type) {
		case *cli.IntFlag:
			f.DefaultText = text
		case *cli.Int64Flag:
			f.DefaultText = text
		case *cli.Float64Flag:
			f.DefaultText = text
		case *cli.StringFlag:
			f.DefaultText = text
		case *cli.BoolFlag:
			f.DefaultText = text
		}
	}
}
