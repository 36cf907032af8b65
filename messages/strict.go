package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
)

// DecodeStrictJSON decodes data, which must hold exactly one JSON value, into
// v (a pointer) more strictly than encoding/json does, so that every reader
// of the document sees the same thing jetcrew acts on:
//   - an object key must be exactly the name of one of the target struct's
//     fields (encoding/json also accepts "Profile" or "PROFILE" for
//     "profile"); unknown keys are refused;
//   - no object, at any depth (maps and free-form values included), may hold
//     the same key twice (encoding/json keeps the last one, other parsers
//     the first);
//   - nothing may follow the value.
//
// The error says which key of which object broke the rule. It is used on
// everything jetcrew reads from outside: run requests, relay bodies and dead
// letters.
func DecodeStrictJSON(data []byte, v any) error {
	t := reflect.TypeOf(v)
	if t == nil || t.Kind() != reflect.Pointer {
		return errors.New("decode target must be a pointer")
	}
	if err := checkStrictJSON(data, t.Elem()); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}

// checkStrictJSON walks data's tokens beside type t and returns the first
// inexact or duplicate key. Syntax errors are left to the decoder.
func checkStrictJSON(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	err := strictValue(dec, t, "")
	var se *json.SyntaxError
	if errors.As(err, &se) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil // the decoder reports it with its position
	}
	return err
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// strictValue consumes one value from dec. t is the Go type it decodes into,
// nil for a value whose keys are free (any, json.RawMessage, custom
// unmarshalers): there only duplicates are refused.
func strictValue(dec *json.Decoder, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t != nil && (t.Kind() == reflect.Interface || reflect.PointerTo(t).Implements(unmarshalerType)) {
		t = nil
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		return strictObject(dec, t, path)
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for i := 0; dec.More(); i++ {
			if err := strictValue(dec, elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	}
	return nil
}

// strictObject consumes the members of an object whose '{' was read.
func strictObject(dec *json.Decoder, t reflect.Type, path string) error {
	var fields map[string]reflect.Type
	var elem reflect.Type
	switch {
	case t != nil && t.Kind() == reflect.Struct:
		fields = jsonFields(t)
	case t != nil && t.Kind() == reflect.Map:
		elem = t.Elem()
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		where := strings.TrimPrefix(path+"."+key, ".")
		if seen[key] {
			return fmt.Errorf("key %q appears twice (a key may appear once)", where)
		}
		seen[key] = true
		if fields != nil {
			ft, ok := fields[key]
			if !ok {
				return unknownKey(fields, where, key)
			}
			elem = ft
		}
		if err := strictValue(dec, elem, where); err != nil {
			return err
		}
	}
	_, err := dec.Token()
	return err
}

// unknownKey describes a key that is no field's exact name.
func unknownKey(fields map[string]reflect.Type, where, key string) error {
	for name := range fields {
		if strings.EqualFold(name, key) {
			return fmt.Errorf("key %q is not %q: keys are matched exactly, case included", where, name)
		}
	}
	return fmt.Errorf("unknown field %q", where)
}

var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// jsonFields returns the JSON names of struct t's fields (embedded structs
// without a name flattened, as encoding/json does) and their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			for k, v := range jsonFields(ft) {
				m[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	fieldCache.Store(t, m)
	return m
}
