package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLlamaWorkflow is the Llama's path through the commands: a tiny
// random LlamaForCausalLM directory (bf16, grouped heads, Llama 3's rope
// scaling, its tokenizer.json) fine-tuned on a text at tp 2
// (`hpcrun run --nproc 2 --tp 2 --init-from DIR --data TEXT`); greedy
// samples from the run the same at --nproc 1 and 2; the run exported with
// `ckpt export --hf` samples and evaluates as the run does.
func TestLlamaWorkflow(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the hpcrun binary: -short")
	}
	var py string
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import numpy").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		t.Fatal("no python3 with NumPy: install python3-numpy (.ci/run does)")
	}
	e := newEnv(t)
	dir := filepath.Join(e.dir, "tiny-llama")
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "tiny_llama.py"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(py, script, "make", dir, "--dtype", "bfloat16", "--llama3-rope").CombinedOutput(); err != nil {
		t.Fatalf("tiny_llama.py make: %v: %s", err, out)
	}
	text := filepath.Join(e.dir, "input.txt")
	os.WriteFile(text, []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. Été, où, naïve. ", 80)), 0o644)

	e.mustRun("run", "--nproc", "2", "--tp", "2", "--init-from", dir, "--data", text,
		"--seq", "32", "--bsz", "4", "--steps", "4", "--lr", "1e-3", "--device", "cpu")
	execID := filepath.Base(e.onlyRun())
	gen := func(src, nproc string) string {
		return e.mustRun("generate", src, "--prompt", "The quick", "--tokens", "8", "--temperature", "0", "--nproc", nproc, "--device", "cpu")
	}
	one, two := gen(execID, "1"), gen(execID, "2")
	t.Logf("generate: %q", one)
	if one != two || !strings.HasPrefix(one, "The quick") {
		t.Errorf("greedy samples: --nproc 1 %q, --nproc 2 %q", one, two)
	}
	e.mustRun("ckpt", "export", execID, "--hf", "exported")
	if _, err := os.Stat(filepath.Join(e.dir, "exported", "tokenizer.json")); err != nil {
		t.Errorf("the export has no tokenizer.json: %v", err)
	}
	if got := gen("exported", "2"); got != one {
		t.Errorf("greedy sample of the export %q, of the run %q", got, one)
	}
	lossRe := regexp.MustCompile(`^loss (\d+\.\d+) perplexity \d+\.\d+ \(\d+ windows of seq 32\)\n$`)
	fromRun := e.mustRun("eval", execID, "--data", text, "--device", "cpu")
	fromHF := e.mustRun("eval", "exported", "--data", text, "--nproc", "2", "--device", "cpu")
	t.Logf("eval: %q", fromRun)
	if !lossRe.MatchString(fromRun) || fromRun != fromHF {
		t.Errorf("eval of the run %q, of its export at tp 2 %q", fromRun, fromHF)
	}
}
