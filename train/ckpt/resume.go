package ckpt

import "fmt"

// ResumePoint says where a run whose checkpoints are under root resumes:
// "step N of <step dir>" (its latest, which must open with its optimizer
// state), or "the start (no checkpoint yet)".
func ResumePoint(root string) (string, error) {
	step, err := Latest(root)
	if err != nil {
		return "", err
	}
	if step == "" {
		return "the start (no checkpoint yet)", nil
	}
	ck, err := Open(step, true)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("step %d of %s", ck.State.Step, step), nil
}
