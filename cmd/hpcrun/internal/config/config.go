// Package config resolves hpcrun's configuration from its layers: built-in
// defaults, the user file (~/.config/hpcrun/config.toml), the project file
// (./hpcrun.toml or --config), HPCRUN_* environment variables and flags,
// remembering where every value came from.
package config

import (
	"github.com/hpcrun/hpcrun/slurm"
	trainconfig "github.com/hpcrun/hpcrun/train/config"
)

// Config is the whole resolved configuration.
type Config struct {
	// DefaultProfile names the profile used when --profile is not given.
	DefaultProfile string `toml:"default_profile"`
	// RunsDir holds one folder per run (runs/<execid>/).
	RunsDir string `toml:"runs_dir"`
	// Profiles are named cluster profiles.
	Profiles map[string]Profile `toml:"profiles"`
	// Train holds the defaults for the training flags of submit and run.
	Train trainconfig.Config `toml:"train"`
}

// Profile describes how jobs are submitted on one cluster.
type Profile struct {
	Executor string `toml:"executor"` // slurm, local or auto (slurm when sbatch is on PATH)
	// Resources are the scheduler options (account, partition, qos, time,
	// ...): one key each, the same names as hpcrun submit's job flags.
	slurm.Resources
	Modules     []string          `toml:"modules"`      // `module load` lines, in order
	SbatchExtra []string          `toml:"sbatch_extra"` // extra #SBATCH options, e.g. "--comment=x"
	Env         map[string]string `toml:"env"`          // exports in the job script
	Template    string            `toml:"template"`     // sbatch template file; "" = built-in
	Checkpoint  bool              `toml:"checkpoint"`   // ask for --signal and --requeue
	SignalSecs  int               `toml:"signal_secs"`  // seconds before the time limit for USR1
	// GPU names the profile's GPU for hpcrun plan and submit's memory
	// check (v100-16, v100-32, a100-40, a100-80, h100-80, h200); "" plans
	// for the CPU on a CPU-only profile and refuses to guess on a GPU one.
	GPU string `toml:"gpu"`
	// Cluster names the profile's cluster preset (dgx-a100-superpod,
	// jean-zay-v100, jean-zay-v100-8, jean-zay-a100, jean-zay-h100): hpcrun
	// plan then plans at scale on it, as --cluster does (--cluster none:
	// the engine's plan).
	Cluster string `toml:"cluster"`
}

// Resolved is the configuration after all layers are merged, with the chosen
// profile picked out.
type Resolved struct {
	Config
	// ProfileName is the profile in effect ("" when none is defined).
	ProfileName string
	// Profile is the profile in effect.
	Profile Profile
	// Sources maps a dotted key ("profiles.jz.account", "train.tp") to where
	// its value came from ("default", a file path and line, "env HPCRUN_X").
	Sources map[string]string
}
