package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Line is one decoded metrics line: Type says which of the pointers is set.
// Lines of a type this version does not know have only Type set.
type Line struct {
	Type string
	Run  *RunInfo
	Step *Step
	Eval *Eval
	GPU  *GPUSample
	End  *End
}

// ParseLine decodes one metrics line (without its newline). Unknown fields
// are ignored; a float written as null reads as NaN; a line without a "type"
// or that is not a JSON object is an error.
//
// Step lines, nearly all of a file, take a hand-written path that handles
// flat objects of plain values; anything else it meets (escapes, nested
// values, another type) goes through encoding/json, which also words the
// errors.
func ParseLine(line []byte) (Line, error) {
	if s, ok := parseStepFast(line); ok {
		return Line{Type: TypeStep, Step: &s}, nil
	}
	return parseLineJSON(line)
}

func parseLineJSON(line []byte) (Line, error) {
	var head struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(line, &head); err != nil {
		return Line{}, jsonError(err)
	}
	if head.Type == nil {
		return Line{}, errors.New(`no "type" field`)
	}
	if *head.Type == "" {
		return Line{}, errors.New(`"type" is empty`)
	}
	l := Line{Type: *head.Type}
	var err error
	switch l.Type {
	case TypeRun:
		l.Run, err = decodeRun(line)
	case TypeStep:
		s := Step{Loss: nan, LR: nan, GradNorm: nan}
		err = json.Unmarshal(line, &s)
		l.Step = &s
	case TypeEval:
		e := Eval{Loss: nan, Accuracy: nan}
		err = json.Unmarshal(line, &e)
		l.Eval = &e
	case TypeGPU:
		g := GPUSample{UtilPct: nan}
		err = json.Unmarshal(line, &g)
		l.GPU = &g
	case TypeEnd:
		var e End
		err = json.Unmarshal(line, &e)
		l.End = &e
	}
	if err != nil {
		return Line{}, fmt.Errorf("%s line: %w", l.Type, jsonError(err))
	}
	return l, nil
}

// decodeRun reads a run line. Version 1 nests the config under "config";
// files without "v" spread the config's fields over the run line itself, so
// then the whole line, less the placement fields, is the config.
func decodeRun(line []byte) (*RunInfo, error) {
	var r RunInfo
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, err
	}
	if len(r.Config) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(r.Config, &obj); err != nil || obj == nil {
			return nil, errors.New(`"config" is not a JSON object`)
		}
		return &r, nil
	}
	if r.V == 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(line, &obj); err != nil {
			return nil, err
		}
		for _, k := range []string{"type", "v", "rank", "world", "tp_rank", "dp_rank", "host",
			"total_steps", "params", "flops_per_token", "peak_flops", "start"} {
			delete(obj, k)
		}
		cfg, err := json.Marshal(obj)
		if err != nil {
			return nil, err
		}
		r.Config = cfg
	}
	return &r, nil
}

// jsonError drops encoding/json's "json: " prefix and Go type names, which
// mean nothing to a person reading a metrics file.
func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return fmt.Errorf("not a JSON object but a JSON %s", te.Value)
		}
		return fmt.Errorf("field %q: %s where a %s is expected", te.Field, te.Value, kindName(te.Type.Kind().String()))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("not valid JSON at byte %d: %s", se.Offset, bytes.TrimPrefix([]byte(se.Error()), []byte("json: ")))
	}
	return errors.New(string(bytes.TrimPrefix([]byte(err.Error()), []byte("json: "))))
}

func kindName(k string) string {
	switch k {
	case "int", "int64":
		return "whole number"
	case "float64":
		return "number"
	case "string":
		return "string"
	}
	return k
}

// parseStepFast decodes a step line made of a flat JSON object whose values
// are plain strings (no escapes), numbers, null, true or false. It reports
// false for anything else, and for lines of another type, leaving them to
// encoding/json; what it accepts, encoding/json accepts with the same values
// (FuzzParseLine checks this).
func parseStepFast(b []byte) (Step, bool) { return parseStep(b, true) }

// parseStep is parseStepFast; without full it checks lr, grad_norm and
// epoch but leaves them unset (a summary does not show them).
func parseStep(b []byte, full bool) (Step, bool) {
	s := Step{Loss: nan, LR: nan, GradNorm: nan}
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return s, false
	}
	i = skipWS(b, i+1)
	isStep := false
	if i < len(b) && b[i] == '}' {
		return s, false
	}
	for {
		// key
		if i >= len(b) || b[i] != '"' {
			return s, false
		}
		ks := i + 1
		ke := plainStringEnd(b, ks)
		if ke < 0 {
			return s, false
		}
		key := b[ks:ke]
		i = skipWS(b, ke+1)
		if i >= len(b) || b[i] != ':' {
			return s, false
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			return s, false
		}
		// value
		vs := i
		kind := b[i]
		switch {
		case kind == '"':
			ve := plainStringEnd(b, i+1)
			if ve < 0 {
				return s, false
			}
			i = ve + 1
		case kind == '-' || (kind >= '0' && kind <= '9'):
			i = numberEnd(b, i)
			if i < 0 {
				return s, false
			}
		case hasLiteral(b, i, "null"):
			i += 4
		case hasLiteral(b, i, "true"):
			i += 4
		case hasLiteral(b, i, "false"):
			i += 5
		default:
			return s, false
		}
		val := b[vs:i]
		if !setStepField(&s, key, val, &isStep, full) {
			return s, false
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return s, false
		}
		if b[i] == '}' {
			i = skipWS(b, i+1)
			return s, isStep && i == len(b)
		}
		if b[i] != ',' {
			return s, false
		}
		i = skipWS(b, i+1)
	}
}

// setStepField stores one value; false means "leave this line to the slow
// path" (a type mismatch, which encoding/json will word as an error).
func setStepField(s *Step, key, val []byte, isStep *bool, full bool) bool {
	if !full {
		switch string(key) {
		case "lr", "grad_norm":
			return checkFloat(val)
		case "epoch":
			var e int64
			return setInt64(&e, val)
		}
	}
	switch string(key) {
	case "type":
		if string(val) != `"step"` {
			return false
		}
		*isStep = true
	case "step":
		return setInt(&s.Step, val)
	case "epoch":
		return setInt(&s.Epoch, val)
	case "loss":
		return setFloat(&s.Loss, val)
	case "lr":
		return setFloat(&s.LR, val)
	case "grad_norm":
		return setFloat(&s.GradNorm, val)
	case "tokens":
		return setInt64(&s.Tokens, val)
	case "samples":
		return setInt64(&s.Samples, val)
	case "step_s":
		return setFloat(&s.StepS, val)
	case "comm_s":
		return setFloat(&s.CommS, val)
	case "mem_bytes":
		return setInt64(&s.MemBytes, val)
	case "mem_peak_bytes":
		return setInt64(&s.MemPeakBytes, val)
	case "host_syncs":
		return setInt64(&s.HostSyncs, val)
	case "bubble":
		return setFloat(&s.Bubble, val)
	case "bubble_theory":
		return setFloat(&s.BubbleTheory, val)
	case "ts":
		return setFloat(&s.TS, val)
	default:
		// encoding/json matches keys case-insensitively: "Loss" sets Loss.
		for _, k := range stepKeys {
			if bytes.EqualFold(key, []byte(k)) {
				return false
			}
		}
	}
	return true
}

var stepKeys = []string{"type", "step", "epoch", "loss", "lr", "grad_norm", "tokens", "samples",
	"step_s", "comm_s", "mem_bytes", "mem_peak_bytes", "host_syncs", "bubble", "bubble_theory", "ts"}

func setFloat(dst *float64, val []byte) bool {
	if val[0] == 'n' {
		return true // like encoding/json: the field keeps its preset (NaN or 0)
	}
	// Past 17 characters a number nearly always has more digits than
	// fastFloat takes (a float32 loss printed as float64 has 16 or 17).
	if len(val) <= 17 {
		if v, ok := fastFloat(val); ok {
			*dst = v
			return true
		}
	}
	v, err := strconv.ParseFloat(string(val), 64)
	if err != nil {
		return false
	}
	*dst = v
	return true
}

// checkFloat reports whether setFloat would take val, without converting
// it when it can tell: null, and numbers too short to overflow or
// underflow (at most 30 characters before an exponent of at most two
// digits).
func checkFloat(val []byte) bool {
	if val[0] == 'n' {
		return true
	}
	if val[0] == '-' || (val[0] >= '0' && val[0] <= '9') {
		e := len(val)
		for i, c := range val {
			if c == 'e' || c == 'E' {
				e = i
				break
			}
		}
		exp := val[min(e+1, len(val)):]
		if len(exp) > 0 && (exp[0] == '+' || exp[0] == '-') {
			exp = exp[1:]
		}
		if e <= 30 && len(exp) <= 2 {
			return true
		}
	}
	var f float64
	return setFloat(&f, val)
}

// pow10 holds the powers of ten that float64 represents exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
	1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// fastFloat converts a JSON number (already checked by numberEnd) when its
// digits fit in 2^53 and its power of ten is exact: then one multiply or
// divide is correctly rounded (Clinger's fast path). Otherwise it reports
// false and strconv does the work.
func fastFloat(b []byte) (float64, bool) {
	i, neg := 0, false
	if b[0] == '-' {
		neg, i = true, 1
	}
	var mant uint64
	digits, exp := 0, 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		mant = mant*10 + uint64(b[i]-'0')
		if mant != 0 {
			digits++
		}
	}
	if i < len(b) && b[i] == '.' {
		for i++; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			mant = mant*10 + uint64(b[i]-'0')
			if mant != 0 {
				digits++
			}
			exp--
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		eneg := false
		if b[i] == '+' || b[i] == '-' {
			eneg = b[i] == '-'
			i++
		}
		e := 0
		for ; i < len(b) && e < 1000; i++ {
			e = e*10 + int(b[i]-'0')
		}
		if eneg {
			e = -e
		}
		exp += e
	}
	if i < len(b) || digits > 15 {
		return 0, false // too many digits to be sure
	}
	f := float64(mant)
	switch {
	case exp == 0:
	case exp < 0 && -exp < len(pow10):
		f /= pow10[-exp]
	case exp > 0 && exp < len(pow10):
		f *= pow10[exp]
	default:
		return 0, false
	}
	if neg {
		f = -f
	}
	return f, true
}

func setInt64(dst *int64, val []byte) bool {
	if val[0] == 'n' {
		return true // encoding/json leaves the field as it was
	}
	// Fast path for plain non-negative integers, the usual case.
	if len(val) <= 18 && val[0] != '-' {
		var v int64
		for _, c := range val {
			if c < '0' || c > '9' {
				return false
			}
			v = v*10 + int64(c-'0')
		}
		*dst = v
		return true
	}
	v, err := strconv.ParseInt(string(val), 10, 64)
	if err != nil {
		return false
	}
	*dst = v
	return true
}

func setInt(dst *int, val []byte) bool {
	v := int64(*dst)
	if !setInt64(&v, val) {
		return false
	}
	*dst = int(v)
	return true
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// plainStringEnd returns the index of the closing quote of a string starting
// at i (after the opening quote), or -1 if it holds an escape, a control
// character, a non-ASCII byte or no closing quote.
func plainStringEnd(b []byte, i int) int {
	for ; i < len(b); i++ {
		c := b[i]
		if c == '"' {
			return i
		}
		if c == '\\' || c < 0x20 || c >= 0x80 {
			return -1
		}
	}
	return -1
}

// numberEnd returns the end of the JSON number starting at i, or -1 if it
// does not follow JSON's number grammar.
func numberEnd(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		if i = digits(b, i+1); i < 0 {
			return -1
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i = digits(b, i); i < 0 {
			return -1
		}
	}
	return i
}

// digits skips the decimal digits of b from i, at least one, and returns
// where they end, or -1 when there is none.
func digits(b []byte, i int) int {
	d := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	if i == d {
		return -1
	}
	return i
}

func hasLiteral(b []byte, i int, lit string) bool {
	return len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit
}
