package main

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hpcrun/hpcrun/slurm"
	"github.com/hpcrun/hpcrun/train/tokenizer"
)

// These tests follow README.md as a new user would (issue 28): each is a
// command as typed, and what it must say or do.

// TestTokenFileRunRecordsItsTokenizer: a GPT trained on a token file
// (GPT-2 BPE, from hpcrun data tokenize) records the tokenizer in
// train.toml, and eval scores the same text the same whether given the
// token file or the text it came from.
func TestTokenFileRunRecordsItsTokenizer(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	text := filepath.Join(e.dir, "input.txt")
	os.WriteFile(text, []byte(strings.Repeat("This License applies to any program or other work which contains a notice. ", 80)), 0o644)
	e.mustRun("data", "tokenize", text, "-o", "train.bin")
	e.mustRun("run", "--nproc", "1", "--model", "gpt", "--data", "train.bin", "--seq", "32", "--bsz", "4",
		"--steps", "2", "--layers", "1", "--dim", "32", "--heads", "2", "--eval-every", "0", "--device", "cpu")
	run := e.onlyRun()
	toml, _ := os.ReadFile(filepath.Join(run, "train.toml"))
	if !strings.Contains(string(toml), `tokenizer = "gpt2"`) {
		t.Errorf("train.toml does not record the gpt2 tokenizer:\n%s", toml)
	}
	viaBin := e.mustRun("eval", filepath.Base(run), "--data", "train.bin", "--seq", "32", "--device", "cpu")
	viaText := e.mustRun("eval", filepath.Base(run), "--data", text, "--seq", "32", "--device", "cpu")
	if viaBin != viaText {
		t.Errorf("eval of the same text: %q via the token file, %q via the text", viaBin, viaText)
	}
}

// TestCancelOnlyOurRuns: hpcrun cancel with a job id that no run of ours
// has cancels nothing and says so (a typo must not cancel another of the
// user's jobs); on the local Slurm, such a job is still alive after.
func TestCancelOnlyOurRuns(t *testing.T) {
	e := newEnv(t)
	_, errOut, code := e.run("cancel", "99999")
	if code != 2 || !strings.Contains(errOut, "nothing cancelled") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("cancel 99999: exit %d, stderr %q; want exit 2 and one line saying nothing was cancelled", code, errOut)
	}
	if _, err := exec.LookPath("sbatch"); err != nil || exec.Command("sinfo").Run() != nil {
		return
	}
	out, err := exec.Command("sbatch", "--parsable", "--job-name", "not-hpcrun", "-o", "/dev/null", "--wrap", "sleep 120").Output()
	if err != nil {
		t.Fatalf("sbatch: %v", err)
	}
	id := strings.TrimSpace(string(out))
	defer exec.Command("scancel", id).Run()
	_, errOut, code = e.run("cancel", id)
	if code != 2 || !strings.Contains(errOut, "nothing cancelled") {
		t.Errorf("cancel %s (a job hpcrun did not submit): exit %d, stderr %q", id, code, errOut)
	}
	state, _ := exec.Command("squeue", "-h", "-j", id, "-o", "%T").Output()
	if s := strings.TrimSpace(string(state)); s != "RUNNING" && s != "PENDING" {
		t.Errorf("job %s is %q after hpcrun cancel refused it, want it still alive", id, s)
	}
}

// TestPipelineLabels: a pipeline run says its pp wherever it says its
// layout (run's banner, metrics, --compare), and its sp and ZeRO; plan
// names --micro-batches as such, not grad_accum.
func TestPipelineLabels(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	_, errOut, code := e.run("run", "--nproc", "4", "--pp", "2", "--tp", "2", "--sp", "--steps", "2", "--layers", "2", "--device", "cpu", "--eval-every", "0")
	if code != 0 || !strings.Contains(errOut, "4 ranks (pp 2 x tp 2 x dp 1 + sp)") {
		t.Errorf("run --pp 2 --tp 2 --sp: exit %d, banner:\n%s", code, errOut)
	}
	id := filepath.Base(e.onlyRun())
	if out := e.mustRun("metrics", id); !strings.Contains(out, "pp 2 x tp 2 x dp 1 + sp") {
		t.Errorf("metrics does not say the layout:\n%s", out)
	}
	out := e.mustRun("metrics", "--compare", id, id)
	for _, want := range []string{"pp ", "sp ", "zero ", "micro_batches 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics --compare lacks %q:\n%s", want, out)
		}
	}
	if out := e.mustRun("plan", "--ntasks", "2", "--pp", "2", "--micro-batches", "4", "--layers", "2"); !strings.Contains(out, "x micro_batches 4") {
		t.Errorf("plan --pp 2 --micro-batches 4 does not say micro_batches 4:\n%s", out)
	}
}

// TestCtrlCOnRunResumes: Ctrl-C on hpcrun run stops every rank with a
// checkpoint; the run is CANCELLED (not FAILED) in queue, the signal and
// the way to resume are said once, and the way works: hpcrun run --resume goes on to the end
// (and submit --resume points to it).
func TestCtrlCOnRunResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	cmd, stderr, dir := e.startRun(t, "run", "--nproc", "2", "--steps", "150", "--eval-every", "0", "--device", "cpu")
	defer cmd.Process.Kill()
	waitForSteps(t, dir, 3)
	cmd.Process.Signal(os.Interrupt) // what the terminal sends hpcrun run on Ctrl-C
	err := cmd.Wait()
	id := filepath.Base(dir)
	out := stderr.String()
	resume := "resume with: hpcrun run --resume " + id
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 || strings.Count(out, "resume with") != 1 || !strings.Contains(out, resume) {
		t.Errorf("Ctrl-C: %v; want exit 130 and %q said once:\n%s", err, resume, out)
	}
	// The launcher passes the INT on to both ranks; one says so.
	if n := strings.Count(out, "received interrupt"); n != 1 {
		t.Errorf("Ctrl-C: \"received interrupt\" said %d times, want once:\n%s", n, out)
	}
	if r, _ := e.row(true, id); r.State != slurm.Cancelled {
		t.Errorf("queue shows the stopped run as %s, want CANCELLED", r.State)
	}
	if out := e.mustRun("metrics", id); !strings.Contains(out, "stopped by SIGINT (Ctrl-C)") {
		t.Errorf("metrics does not say what stopped the run:\n%s", out)
	}
	if _, errOut, _ := e.run("submit", "--resume", id); !strings.Contains(errOut, "hpcrun run --resume "+id) {
		t.Errorf("submit --resume of a run of hpcrun run: %s", errOut)
	}
	e.mustRun("run", "--resume", id)
	if r, _ := e.row(true, id); r.State != slurm.Completed {
		t.Errorf("after run --resume the run is %s, want COMPLETED", r.State)
	}
	steps, _, _ := stepLosses(t, filepath.Join(dir, "metrics", "rank-00000.jsonl"))
	if len(steps) != 150 {
		t.Errorf("%d steps after the resume, want 150", len(steps))
	}
}

// TestExportByteGPTConfig: a byte-level GPT (256 ids) exports with no
// bos/eos id outside its vocabulary (GPT-2's 50256 is not one of its ids)
// and with its tokenizer, which hpcrun reads back; so does a byte-level
// Llama.
func TestExportByteGPTConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a second")
	}
	e := newEnv(t)
	text := filepath.Join(e.dir, "input.txt")
	os.WriteFile(text, []byte(strings.Repeat("a byte-level model of a small text. ", 100)), 0o644)
	e.mustRun("run", "--nproc", "1", "--model", "gpt", "--data", text, "--seq", "32", "--bsz", "4", "--steps", "1",
		"--layers", "1", "--dim", "32", "--heads", "2", "--eval-every", "0", "--device", "cpu")
	e.mustRun("ckpt", "export", filepath.Base(e.onlyRun()), "--hf", "exported")
	b, err := os.ReadFile(filepath.Join(e.dir, "exported", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Vocab int  `json:"vocab_size"`
		BOS   *int `json:"bos_token_id"`
		EOS   *int `json:"eos_token_id"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]*int{"bos": cfg.BOS, "eos": cfg.EOS} {
		if id != nil && *id >= cfg.Vocab {
			t.Errorf("%s_token_id %d is outside vocab_size %d:\n%s", name, *id, cfg.Vocab, b)
		}
	}
	// The byte tokenizer comes with it as a tokenizer.json of the same ids,
	// and the export evaluates as the run does.
	tok, err := tokenizer.LoadHF(filepath.Join(e.dir, "exported"))
	if err != nil {
		t.Fatalf("the export's tokenizer: %v", err)
	}
	if sample := "a byte-level model, naïve \x01"; !slices.Equal(tok.Encode(sample), tokenizer.Byte{}.Encode(sample)) {
		t.Errorf("the export's tokenizer.json encodes %q as %v, the byte tokenizer as %v", sample, tok.Encode(sample), tokenizer.Byte{}.Encode(sample))
	}
	fromRun := e.mustRun("eval", filepath.Base(e.onlyRun()), "--data", text, "--device", "cpu")
	if fromHF := e.mustRun("eval", "exported", "--data", text, "--device", "cpu"); fromHF != fromRun {
		t.Errorf("eval of the export %q, of the run %q", fromHF, fromRun)
	}
	// A byte-level Llama too.
	os.RemoveAll(filepath.Join(e.dir, "runs"))
	e.mustRun("run", "--nproc", "1", "--model", "llama", "--data", text, "--seq", "32", "--bsz", "4", "--steps", "1",
		"--layers", "1", "--dim", "32", "--heads", "2", "--eval-every", "0", "--device", "cpu")
	e.mustRun("ckpt", "export", filepath.Base(e.onlyRun()), "--hf", "llama")
	if _, err := tokenizer.LoadHF(filepath.Join(e.dir, "llama")); err != nil {
		t.Errorf("the byte-level Llama's export: %v", err)
	}
}

// TestGPTOutOfTheBox: --model gpt trains with no --data (the built-in
// text), plan --preset gpt2-124m plans with no data, and plan never reads
// the data: a file too small to train on still gets a plan.
func TestGPTOutOfTheBox(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a few seconds")
	}
	e := newEnv(t)
	e.mustRun("run", "--nproc", "1", "--model", "gpt", "--steps", "3", "--eval-every", "0", "--device", "cpu")
	if out := e.mustRun("plan", "--preset", "gpt2-124m", "--gpu", "a100-80"); !strings.Contains(out, "vocab 50257") {
		t.Errorf("plan --preset gpt2-124m:\n%s", out)
	}
	small := filepath.Join(e.dir, "small.txt")
	os.WriteFile(small, []byte("too short to train on\n"), 0o644)
	if out := e.mustRun("plan", "--model", "gpt", "--data", small, "--seq", "256"); !strings.Contains(out, "vocab 256") {
		t.Errorf("plan on a small text:\n%s", out)
	}
}

// TestReadmeSaysHowToInstall: make run leaves bin/hpcrun; the README says
// so and how to put hpcrun on PATH, with a make target that does.
func TestReadmeSaysHowToInstall(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"bin/hpcrun", "make install"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
	out, err := exec.Command("make", "-C", "../..", "-n", "install").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "go install") {
		t.Errorf("make -n install: %v\n%s", err, out)
	}
}

// TestReadmeSaysWhatTinyLlamaNeeds: scripts/tiny_llama.py imports NumPy,
// and the README says so where it names the script and what make test
// needs, with the package that gives it.
func TestReadmeSaysWhatTinyLlamaNeeds(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("../../scripts/tiny_llama.py")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), "\nimport numpy") {
		t.Fatal("tiny_llama.py no longer imports numpy: say what it needs instead")
	}
	for _, want := range []string{
		"`make test` also needs `python3` with NumPy (`apt-get install python3-numpy`)",
		"it runs under `python3` with NumPy (Debian's `python3-numpy`, or `pip install numpy`)",
	} {
		if !strings.Contains(strings.Join(strings.Fields(string(readme)), " "), want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
}

// TestStrayArgumentsAndTypos: an argument a command does not take is an
// error (submit bert-base planned a tiny BERT), naming the flag it may
// have meant; a typo'd flag gets one line with the nearest flag.
func TestStrayArgumentsAndTypos(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"submit", "bert-base", "--dry-run"}, `submit takes no arguments, got "bert-base": did you mean --preset bert-base?`},
		{[]string{"queue", "foo"}, `queue takes no arguments, got "foo"`},
		{[]string{"submit", "-ntask", "4", "--dry-run"}, "did you mean --ntasks?"},
	} {
		out, errOut, code := e.run(tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || out != "" {
			t.Errorf("hpcrun %s: exit %d, stdout %d bytes, stderr %q; want exit 2 and one line with %q", strings.Join(tc.args, " "), code, len(out), errOut, tc.want)
		}
	}
}

// TestQueueAndRm: a failed submission leaves the default queue (queue
// --all and --state show it, with no nodes); an empty queue says how to
// see the rest; rm removes runs and sweeps, refusing a live run unless
// --force, and removes nothing on a typo.
func TestQueueAndRm(t *testing.T) {
	if testing.Short() {
		t.Skip("runs jobs")
	}
	e := newEnv(t)
	if exec.Command("sinfo").Run() == nil {
		e.run("submit", "--executor", "slurm", "-p", "nosuchpartition", "--steps", "2")
		id := filepath.Base(e.onlyRun())
		// The user's other jobs (not hpcrun's) may be in the queue too.
		foreign := 0
		for _, r := range e.queue(false) {
			if r.ExecID == "" {
				foreign++
			}
		}
		if out, errOut, _ := e.run("queue"); strings.Contains(out, id) || (foreign == 0 && !strings.Contains(errOut, "hpcrun queue --all")) {
			t.Errorf("queue with only a failed submission:\n%s%s", out, errOut)
		}
		var ours []slurm.QueueRow
		for _, r := range e.queue(true) {
			if r.ExecID != "" {
				ours = append(ours, r)
			}
		}
		if len(ours) != 1 || ours[0].State != slurm.NotSubmitted || ours[0].Nodes != 0 {
			t.Errorf("queue --all: %+v, want one NOT_SUBMITTED row on no node", ours)
		}
		if out := e.mustRun("queue", "--state", "not_submitted"); !strings.Contains(out, id) {
			t.Errorf("queue --state not_submitted:\n%s", out)
		}
		if out := e.mustRun("queue", "--state", "running"); strings.Contains(out, id) {
			t.Errorf("queue --state running shows the failed submission:\n%s", out)
		}
		e.mustRun("rm", id)
	}
	live := e.submit("--executor", "local", "--steps", "100000", "--eval-every", "0")
	if _, errOut, code := e.run("rm", live.ExecID, "nope"); code != 2 || !strings.Contains(errOut, "nothing removed") {
		t.Errorf("rm of a live run and a typo: exit %d, %s", code, errOut)
	}
	waitForSteps(t, live.RunDir, 1)
	if _, errOut, code := e.run("rm", live.ExecID); code != 2 || !strings.Contains(errOut, "hpcrun cancel") {
		t.Errorf("rm of a live run: exit %d, %s", code, errOut)
	}
	e.mustRun("cancel", live.ExecID)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if r, _ := e.row(true, live.ExecID); r.State.Done() || time.Now().After(deadline) {
			break
		}
	}
	e.mustRun("rm", live.ExecID)
	if _, err := os.Stat(live.RunDir); !os.IsNotExist(err) {
		t.Errorf("run dir still there after rm: %v", err)
	}
	e.mustRun("sweep", "--executor", "local", "--gpu", "cpu", "--preset", "tiny", "--tp", "1", "--bsz", "4", "--steps", "2", "--eval-samples", "16")
	sweeps, _ := os.ReadDir(filepath.Join(e.dir, "runs", "sweeps"))
	if len(sweeps) != 1 {
		t.Fatalf("%d sweeps", len(sweeps))
	}
	e.mustRun("rm", sweeps[0].Name())
	if ents, _ := os.ReadDir(filepath.Join(e.dir, "runs")); len(ents) != 1 { // the empty sweeps folder
		t.Errorf("after rm of the sweep the runs dir holds %d entries", len(ents))
	}
}

// TestShowsTheValuesUsed: config show prints the values a run uses, not
// the zeros that stand for them; --help shows one default per flag, the
// profile's for job options, and --init-from names BERT directories.
func TestShowsTheValuesUsed(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun("config", "show")
	oneSpace := strings.Join(strings.Fields(out), " ") // the key column's width follows the longest key
	for _, want := range []string{`train.adam_beta2 = 0.999`, `train.schedule = "cosine"`, `train.min_lr = 0.0001`, `train.tokenizer = "wordpiece"`} {
		if !strings.Contains(oneSpace, want) {
			t.Errorf("config show lacks %q:\n%s", want, out)
		}
	}
	help := e.mustRun("submit", "--help")
	for _, bad := range []string{"(default: from gpus_per_node) (default: 0)", "(0 = 3) (default: 0)"} {
		if strings.Contains(help, bad) {
			t.Errorf("submit --help says %q", bad)
		}
	}
	for _, want := range []string{"CPUs a task (default: the profile's, else 1)", "Hugging Face BERT dir"} {
		if !strings.Contains(help, want) {
			t.Errorf("submit --help lacks %q", want)
		}
	}
}

// TestPlainWords: one task, one core, one group and one node are
// singular, and a check's notes end in words, not a stray 0.
func TestPlainWords(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the checks")
	}
	e := newEnv(t)
	out, errOut := e.mustRunErr("submit", "--executor", "local", "--ntasks", "1", "-c", "1", "--dry-run")
	plan := e.mustRun("plan", "--ntasks", "1", "-c", "1", "--gpu", "cpu")
	check := e.mustRun("check", "all", "--tp", "2")
	all := out + errOut + plan + check
	for _, bad := range []string{"1 tasks", "1 cores", "group(s)", "node(s)"} {
		if strings.Contains(all, bad) {
			t.Errorf("output says %q:\n%s", bad, all)
		}
	}
	for _, line := range strings.Split(check, "\n") {
		if strings.HasSuffix(line, " calls 0") || strings.HasSuffix(line, "losses 0") {
			t.Errorf("check line ends in a stray 0: %q", line)
		}
	}
}

// TestQuietCPUJob: a CPU job on the local Slurm, with the default
// profile, has no srun warning about CPU binding in its .err (no --hint
// by default) and no advice to install a GPU driver in its log: the CPU
// is said once, as information.
func TestQuietCPUJob(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: -short")
	}
	slurmUp(t)
	e := newEnv(t)
	s := e.submit("--executor", "slurm", "--steps", "2", "--eval-every", "0", "--wait")
	out, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".out"))
	errLog, _ := os.ReadFile(filepath.Join(s.RunDir, "slurm-"+s.JobID+".err"))
	if strings.Contains(string(errLog), "cpu binding") {
		t.Errorf(".err warns about CPU binding:\n%s", errLog)
	}
	if strings.Contains(string(out), "install the NVIDIA driver") || strings.Count(string(out), "device auto") > 1 {
		t.Errorf("the log explains the CPU at length:\n%s", out)
	}
}

// TestJSONWhereOffered: --json gives JSON from eval (the loss to full
// precision), generate (token ids and text), submit --dry-run and errors.
func TestJSONWhereOffered(t *testing.T) {
	if testing.Short() {
		t.Skip("trains for a second")
	}
	e := newEnv(t)
	e.mustRun("run", "--nproc", "1", "--model", "gpt", "--steps", "2", "--eval-every", "0", "--device", "cpu")
	id := filepath.Base(e.onlyRun())
	var ev struct{ Loss, Perplexity float64 }
	if out := e.mustRun("eval", id, "--data", "synthetic", "--device", "cpu", "--json"); json.Unmarshal([]byte(out), &ev) != nil || ev.Loss <= 0 || ev.Loss == math.Round(ev.Loss*1e4)/1e4 {
		t.Errorf("eval --json: %q", out)
	}
	var gen struct {
		Text     string
		TokenIDs []int `json:"token_ids"`
	}
	if out := e.mustRun("generate", id, "--prompt", "In the", "--tokens", "4", "--device", "cpu", "--json"); json.Unmarshal([]byte(out), &gen) != nil || len(gen.TokenIDs) != 4 || !strings.HasPrefix(gen.Text, "In the") {
		t.Errorf("generate --json: %q", out)
	}
	var dry struct{ Script, Placement string }
	if out := e.mustRun("--json", "submit", "--executor", "local", "--dry-run"); json.Unmarshal([]byte(out), &dry) != nil || !strings.Contains(dry.Script, "#!") || dry.Placement == "" {
		t.Errorf("submit --dry-run --json: %q", out)
	}
	var bad struct {
		Error    string
		ExitCode int `json:"exit_code"`
	}
	_, errOut, code := e.run("metrics", "nope", "--json")
	if json.Unmarshal([]byte(errOut), &bad) != nil || bad.ExitCode != code || !strings.Contains(bad.Error, "nope") {
		t.Errorf("an error with --json: exit %d, stderr %q", code, errOut)
	}
}

// TestCompletionOfFlagsAndRuns: the bash completion completes a command's
// flags and, for a command that takes a run, the execids.
func TestCompletionOfFlagsAndRuns(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	e := newEnv(t)
	script := filepath.Join(e.dir, "hpcrun.bash")
	os.WriteFile(script, []byte(e.mustRun("completion", "bash")), 0o644)
	run := filepath.Join(e.dir, "runs", "20261125-120000-abcd")
	os.MkdirAll(run, 0o755)
	complete := func(words ...string) string {
		cmd := exec.Command("bash", "-c", `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($#-1)); _hpcrun_complete; echo "${COMPREPLY[@]}"`,
			"bash", script, e.bin)
		cmd.Args = append(cmd.Args, words...)
		cmd.Env = []string{"PATH=" + e.path, "HOME=" + e.dir, "HPCRUN_RUNS_DIR=" + filepath.Join(e.dir, "runs")}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("completion of %v: %v\n%s", words, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := complete("submit", "--ntasks-p"); got != "--ntasks-per-node" {
		t.Errorf("hpcrun submit --ntasks-p<TAB>: %q", got)
	}
	if got := complete("metrics", "2026"); got != "20261125-120000-abcd" {
		t.Errorf("hpcrun metrics 2026<TAB>: %q", got)
	}
}
