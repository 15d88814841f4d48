package metrics

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestFastFloatMatchesStrconv(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var cases []string
	for range 200000 {
		v := r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20))
		cases = append(cases, strconv.FormatFloat(v, 'g', -1, 64), strconv.FormatFloat(v, 'f', r.IntN(12), 64),
			strconv.FormatFloat(v, 'e', r.IntN(17), 64))
	}
	cases = append(cases, "0", "-0", "1e22", "1e23", "123456789012345", "1234567890123456", "0.000000000000000000001", "9e-22", "1E+2")
	for _, c := range cases {
		want, err := strconv.ParseFloat(c, 64)
		if err != nil {
			continue
		}
		if got, ok := fastFloat([]byte(c)); ok && math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("fastFloat(%s) = %v, strconv says %v", c, got, want)
		}
	}
}

func TestParseLine(t *testing.T) {
	tests := []struct {
		name, line string
		want       Line
		err        string
	}{
		{name: "step", line: `{"type":"step","step":7,"epoch":1,"loss":0.5,"lr":1e-4,"grad_norm":2,"tokens":64,"samples":2,"step_s":0.1,"comm_s":0.01,"mem_bytes":10,"mem_peak_bytes":20,"ts":5}`,
			want: Line{Type: "step", Step: &Step{Step: 7, Epoch: 1, Loss: 0.5, LR: 1e-4, GradNorm: 2, Tokens: 64, Samples: 2, StepS: 0.1, CommS: 0.01, MemBytes: 10, MemPeakBytes: 20, TS: 5}}},
		{name: "step on the GPU path", line: `{"type":"step","step":7,"epoch":1,"loss":0.5,"lr":1e-4,"grad_norm":2,"tokens":64,"samples":2,"step_s":0.1,"comm_s":0.01,"mem_bytes":10,"mem_peak_bytes":20,"host_syncs":1,"ts":5}`,
			want: Line{Type: "step", Step: &Step{Step: 7, Epoch: 1, Loss: 0.5, LR: 1e-4, GradNorm: 2, Tokens: 64, Samples: 2, StepS: 0.1, CommS: 0.01, MemBytes: 10, MemPeakBytes: 20, HostSyncs: 1, TS: 5}}},
		{name: "step unknown fields, spaces, other order", line: ` { "extra" : {"a":[1,2]}, "step" : 3 , "type":"step", "new_field":"x\u00e9"} `,
			want: Line{Type: "step", Step: &Step{Step: 3, Loss: math.NaN(), LR: math.NaN(), GradNorm: math.NaN()}}},
		{name: "step null loss", line: `{"type":"step","step":1,"loss":null}`,
			want: Line{Type: "step", Step: &Step{Step: 1, Loss: math.NaN(), LR: math.NaN(), GradNorm: math.NaN()}}},
		{name: "eval", line: `{"type":"eval","step":10,"loss":0.4,"accuracy":0.81}`,
			want: Line{Type: "eval", Eval: &Eval{Step: 10, Loss: 0.4, Accuracy: 0.81}}},
		{name: "end", line: `{"type":"end","status":"failed","error":"rank 2 died","wall_s":12.5}`,
			want: Line{Type: "end", End: &End{Status: "failed", Error: "rank 2 died", WallS: 12.5}}},
		{name: "gpu", line: `{"type":"gpu","index":0,"mem_used_bytes":100,"mem_total_bytes":200,"util_pct":55}`,
			want: Line{Type: "gpu", GPU: &GPUSample{MemUsedBytes: 100, MemTotalBytes: 200, UtilPct: 55}}},
		{name: "unknown type", line: `{"type":"histogram","bins":[1,2]}`, want: Line{Type: "histogram"}},
		{name: "v0 run line, config spread", line: `{"type":"run","model":"gpt","tp":2,"rank":1,"host":"h"}`,
			want: Line{Type: "run", Run: &RunInfo{Config: json.RawMessage(`{"model":"gpt","tp":2}`), Rank: 1, TP: 2, Host: "h"}}},
		{name: "no type", line: `{"step":1}`, err: `no "type" field`},
		{name: "not an object", line: `[1,2]`, err: "not a JSON object but a JSON array"},
		{name: "garbage", line: `{"type":"step","step":1,`, err: "not valid JSON"},
		{name: "wrong kind", line: `{"type":"step","step":"one"}`, err: `field "step": string where a whole number is expected`},
		{name: "fraction step", line: `{"type":"step","step":1.5}`, err: `field "step": number 1.5 where a whole number is expected`},
		{name: "bad config", line: `{"type":"run","v":1,"config":[1]}`, err: "config"},
		{name: "trailing garbage", line: `{"type":"step","step":1} x`, err: "not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseLine([]byte(tt.line))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !equalLines(got, tt.want) {
				t.Errorf("got  %s\nwant %s", dump(got), dump(tt.want))
			}
		})
	}
}

// equalLines compares with NaN equal to NaN and configs as JSON values.
func equalLines(a, b Line) bool {
	if a.Run != nil && b.Run != nil {
		var ca, cb any
		_ = json.Unmarshal(a.Run.Config, &ca)
		_ = json.Unmarshal(b.Run.Config, &cb)
		if !reflect.DeepEqual(ca, cb) {
			return false
		}
		ra, rb := *a.Run, *b.Run
		ra.Config, rb.Config = nil, nil
		a.Run, b.Run = &ra, &rb
	}
	return dump(a) == dump(b)
}

func dump(l Line) string {
	b, err := json.Marshal(struct {
		T          string
		R          *RunInfo
		S, E, G, N any
	}{l.Type, l.Run, nanSafe(l.Step), nanSafe(l.Eval), nanSafe(l.GPU), l.End})
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// nanSafe renders a struct with NaNs as text JSON can hold.
func nanSafe(v any) any {
	rv := reflect.ValueOf(v)
	if rv.IsNil() {
		return nil
	}
	rv = rv.Elem()
	m := map[string]any{}
	for i := range rv.NumField() {
		f := rv.Field(i)
		if f.Kind() == reflect.Float64 && math.IsNaN(f.Float()) {
			m[rv.Type().Field(i).Name] = "NaN"
			continue
		}
		m[rv.Type().Field(i).Name] = f.Interface()
	}
	return m
}

// FuzzParseLine checks that ParseLine never panics, and that the fast path
// for step lines agrees with encoding/json on every line it accepts.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		`{"type":"step","step":7,"epoch":1,"loss":0.5,"lr":1e-4,"grad_norm":2,"tokens":64,"samples":2,"step_s":0.1,"comm_s":0.01,"mem_bytes":10,"mem_peak_bytes":20,"ts":5}`,
		`{"type":"step","step":1,"loss":null,"x":true,"y":false,"z":"s"}`,
		`{"type":"run","v":1,"config":{"model":"bert"},"rank":0}`,
		`{"type":"eval","step":1,"loss":0.1,"accuracy":null}`,
		`{"type":"end","status":"completed","wall_s":1}`,
		`{"type":"step","STEP":2}`, `{"type":"step","step":-0}`, `{"type":"step","loss":1E400}`,
		`{"type":"step","lr":1e99,"grad_norm":-2.5E-07,"epoch":3}`, `{"type":"step","lr":1e999}`, `{"type":"step","grad_norm":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		l, err := ParseLine(line)
		if err == nil && l.Type == "" {
			t.Fatal("no error and no type")
		}
		fast, ok := parseStepFast(line)
		// The summary's variant takes the same lines and the same values,
		// less the fields it leaves unset.
		part, partOK := parseStep(line, false)
		if partOK != ok {
			t.Fatalf("%q: parseStep without lr, grad_norm, epoch says %v, with them %v", line, partOK, ok)
		}
		if !ok {
			return
		}
		full := fast
		full.LR, full.GradNorm, full.Epoch = part.LR, part.GradNorm, part.Epoch
		if dump(Line{Step: &full}) != dump(Line{Step: &part}) {
			t.Fatalf("%q: summary parse %s, full %s", line, dump(Line{Step: &part}), dump(Line{Step: &fast}))
		}
		slow, err := parseLineJSON(line)
		if err != nil {
			t.Fatalf("fast path accepted %q, encoding/json says %v", line, err)
		}
		if slow.Type != TypeStep || dump(Line{Step: &fast}) != dump(Line{Step: slow.Step}) {
			t.Fatalf("%q: fast %s, encoding/json %s", line, dump(Line{Step: &fast}), dump(slow))
		}
	})
}
