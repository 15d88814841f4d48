// Package config is what a training run is, before anything runs: the
// resolved Config of a run (train.toml), its checks, the presets, the
// learning-rate schedule and the model's size (parameters, FLOPs per
// token). It is the leaf that the planner, the dashboard and the CLI's
// config loader read, without the engine.
package config
