// Package templates holds the built-in sbatch script template, embedded in the
// binary; a profile or --template can point at a user file instead.
//
// The template is a text/template executed with slurm.ScriptData: the values
// that reach #SBATCH lines are validated, and those that reach the shell part
// (RunDirQ, Command, Modules, Env values) come already shell-quoted; the
// function quote is there for anything else a user template adds.
package templates

import _ "embed"

// Sbatch is the built-in text/template source of the job script.
//
//go:embed sbatch.tmpl
var Sbatch string
