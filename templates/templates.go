// Package templates holds the built-in sbatch script template, embedded in the
// binary; a profile or --template can point at a user file instead.
package templates

import _ "embed"

// Sbatch is the built-in text/template source of the job script.
//
//go:embed sbatch.tmpl
var Sbatch string
