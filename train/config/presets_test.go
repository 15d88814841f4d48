package config

import "testing"

func TestApplyPreset(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.ApplyPreset("gpt2-124m"); err != nil {
		t.Fatal(err)
	}
	if cfg.Model != "gpt" || cfg.Layers != 12 || cfg.Dim != 768 || cfg.Heads != 12 || cfg.Tokenizer != "gpt2" || cfg.Positions != 1024 {
		t.Fatalf("gpt2-124m gave %+v", cfg)
	}
	cfg = DefaultConfig()
	cfg.Model = "gpt"
	if err := cfg.ApplyPreset("small"); err != nil {
		t.Fatal(err)
	}
	if cfg.Model != "gpt" || cfg.Dim != 256 {
		t.Fatalf("small kept model %q dim %d", cfg.Model, cfg.Dim)
	}
	if err := cfg.ApplyPreset("huge"); err == nil {
		t.Fatal("unknown preset: no error")
	}
	for _, name := range PresetNames() {
		c := DefaultConfig()
		if err := c.ApplyPreset(name); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("preset %s does not validate: %v", name, err)
		}
	}
}
