package profile

import (
	"reflect"
	"slices"
	"strings"
)

// keyField is one key of a profile: an exported field of Profile, or of
// one of its facets (an embedded struct, whose fields TOML and JSON
// flatten into the profile's).
type keyField struct {
	reflect.StructField
	// index is the field's index path from the struct walked
	// (reflect.Value.FieldByIndex).
	index []int
}

// keyFields returns the exported fields of struct type t in declaration
// order, those of each untagged embedded struct in its place, as
// BurntSushi/toml and encoding/json flatten them.
func keyFields(t reflect.Type, at []int) []keyField {
	var out []keyField
	for i := range t.NumField() {
		f := t.Field(i)
		index := append(slices.Clip(at), i)
		switch {
		case f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag == "":
			out = append(out, keyFields(f.Type, index)...)
		case f.IsExported():
			out = append(out, keyField{StructField: f, index: index})
		}
	}
	return out
}

// tagName returns the name the field's tag (toml or json) gives it: ""
// when the tag gives none, "-" when it leaves the field out.
func (f keyField) tagName(tag string) string {
	name, _, _ := strings.Cut(f.Tag.Get(tag), ",")
	return name
}

// profileKeys returns the TOML key of every Profile field, facets' fields
// included.
func profileKeys() map[string]bool {
	m := map[string]bool{}
	for _, f := range keyFields(reflect.TypeFor[Profile](), nil) {
		if name := f.tagName("toml"); name != "" && name != "-" {
			m[name] = true
		}
	}
	return m
}
