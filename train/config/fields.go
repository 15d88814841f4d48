package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// Keys are the TOML keys of Config's fields (grad_accum), in order: the one
// list hpcrun's training flags are read from (--grad-accum).
func Keys() []string {
	t := reflect.TypeOf(Config{})
	var keys []string
	for i := range t.NumField() {
		if key := tomlKey(t.Field(i)); key != "" {
			keys = append(keys, key)
		}
	}
	return keys
}

// Set sets the field whose TOML key is key to v: an int, int64, float64,
// string or bool as the field is, or its text ("4" for an int: a flag read
// as a string, like sweep's lists).
func (c *Config) Set(key string, v any) error {
	cv := reflect.ValueOf(c).Elem()
	for i := range cv.NumField() {
		if tomlKey(cv.Type().Field(i)) != key {
			continue
		}
		f, val := cv.Field(i), reflect.ValueOf(v)
		if text, ok := v.(string); ok && f.Kind() != reflect.String {
			parsed, err := parseKind(text, f.Kind())
			if err != nil {
				return fmt.Errorf("%s %q: %v", key, text, err)
			}
			val = reflect.ValueOf(parsed)
		}
		if !val.IsValid() || val.Kind() != f.Kind() {
			return fmt.Errorf("%s is an option of type %s, not %T", key, f.Type(), v)
		}
		f.Set(val.Convert(f.Type()))
		return nil
	}
	return fmt.Errorf("no option %q", key)
}

// parseKind reads text as a value of kind.
func parseKind(text string, kind reflect.Kind) (any, error) {
	switch kind {
	case reflect.Int:
		return strconv.Atoi(text)
	case reflect.Int64:
		return strconv.ParseInt(text, 10, 64)
	case reflect.Float64:
		return strconv.ParseFloat(text, 64)
	case reflect.Bool:
		return strconv.ParseBool(text)
	}
	return nil, fmt.Errorf("a %s option cannot be given as text", kind)
}

// Strings is the value of every field as text, by TOML key; the fields
// whose text is empty are left out (hpcrun --help shows the defaults so).
func (c Config) Strings() map[string]string {
	cv := reflect.ValueOf(c)
	out := map[string]string{}
	for i := range cv.NumField() {
		if v := fmt.Sprint(cv.Field(i).Interface()); v != "" {
			out[tomlKey(cv.Type().Field(i))] = v
		}
	}
	return out
}

func tomlKey(f reflect.StructField) string {
	key, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
	return key
}
