package mcpbridge

import (
	"bytes"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// typeResolver resolves what protojson resolved when it wrote a message:
// the embedded types of its Anys and its extensions.
type typeResolver interface {
	protoregistry.ExtensionTypeResolver
	protoregistry.MessageTypeResolver
}

// int64Numbers rewrites js, the compacted protojson of a message of type md
// (json.Compact's output, with no insignificant whitespace), so that every
// 64-bit integer protojson wrote as a decimal string ("500") is a JSON
// number with the same digits (500): int64, uint64, sint64, fixed64 and
// sfixed64 fields, singular, repeated and as map values, in nested messages,
// oneofs and extensions, Int64Value and UInt64Value, and inside an Any by
// the embedded type's descriptor. Everything else is copied byte for byte:
// members in protojson's order, map keys (JSON object names are strings),
// strings that are not 64-bit integers, and the other well-known types
// (Timestamp, Duration, Struct, Value, ListValue, FieldMask, Empty, the
// other wrappers). It reads js once, guided by the descriptors, so the
// rewrite is linear and the same bytes give the same bytes. It rewrites js
// in place (the rewrite only drops bytes, so what it writes never passes
// what it has read) and returns the rewritten prefix of it.
func int64Numbers(js []byte, md protoreflect.MessageDescriptor, types typeResolver) ([]byte, error) {
	w := &int64Writer{in: js, out: js[:0], types: types}
	if err := w.message(md); err != nil {
		return nil, err
	}
	if w.pos != len(w.in) {
		return nil, w.errorf("data after the message")
	}
	return w.out, nil
}

// int64Writer copies in to out, value by value, unquoting 64-bit integers.
// out is in's own memory: every read of in is at or past pos, and every
// write to out is below it (append's copies may overlap their source, as
// memmove).
type int64Writer struct {
	in    []byte
	pos   int // the next byte of in to read
	out   []byte
	types typeResolver
}

func (w *int64Writer) errorf(format string, args ...any) error {
	return fmt.Errorf("mcpbridge: writing 64-bit integers as numbers, at byte %d of the response's protojson: %s", w.pos, fmt.Sprintf(format, args...))
}

// peek is the next byte, or 0 at the end.
func (w *int64Writer) peek() byte {
	if w.pos < len(w.in) {
		return w.in[w.pos]
	}
	return 0
}

// expect copies the next byte, which must be c.
func (w *int64Writer) expect(c byte) error {
	if w.peek() != c {
		return w.errorf("want %q", c)
	}
	w.out = append(w.out, c)
	w.pos++
	return nil
}

// message copies a value of type md (not null).
func (w *int64Writer) message(md protoreflect.MessageDescriptor) error {
	switch md.FullName() {
	case "google.protobuf.Int64Value", "google.protobuf.UInt64Value":
		return w.int64()
	case "google.protobuf.Any":
		return w.any()
	}
	if _, ok := wellKnown(md, false); ok {
		return w.skip() // no 64-bit integers in its protojson form
	}
	if err := w.expect('{'); err != nil {
		return err
	}
	return w.members(md)
}

// members copies the members of an object of md's fields up to its closing
// brace, from just after its opening brace or a member's comma. A member
// md does not name (or any, when md is nil) is copied as it is.
func (w *int64Writer) members(md protoreflect.MessageDescriptor) error {
	if w.peek() == '}' {
		return w.expect('}')
	}
	for {
		name, err := w.key()
		if err != nil {
			return err
		}
		if fd := w.field(md, name); fd != nil {
			err = w.value(fd)
		} else {
			err = w.skip()
		}
		if err != nil {
			return err
		}
		if w.peek() != ',' {
			return w.expect('}')
		}
		w.pos++
		w.out = append(w.out, ',')
	}
}

// field is md's field protojson names name: by its JSON name, or an
// extension by its full name in brackets.
func (w *int64Writer) field(md protoreflect.MessageDescriptor, name string) protoreflect.FieldDescriptor {
	if md == nil {
		return nil
	}
	if fd := md.Fields().ByJSONName(name); fd != nil {
		return fd
	}
	if n := len(name); n > 2 && name[0] == '[' && name[n-1] == ']' {
		xt, err := w.types.FindExtensionByName(protoreflect.FullName(name[1 : n-1]))
		if err == nil && xt.TypeDescriptor().ContainingMessage().FullName() == md.FullName() {
			return xt.TypeDescriptor()
		}
	}
	return nil
}

// value copies fd's value: null (an unset message), a map's object, a
// list's array, or one value.
func (w *int64Writer) value(fd protoreflect.FieldDescriptor) error {
	switch {
	case w.peek() == 'n':
		return w.skip()
	case fd.IsMap():
		if err := w.expect('{'); err != nil {
			return err
		}
		if w.peek() == '}' {
			return w.expect('}')
		}
		for {
			if _, err := w.key(); err != nil { // a key stays a string
				return err
			}
			if err := w.singular(fd.MapValue()); err != nil {
				return err
			}
			if w.peek() != ',' {
				return w.expect('}')
			}
			w.pos++
			w.out = append(w.out, ',')
		}
	case fd.IsList():
		if err := w.expect('['); err != nil {
			return err
		}
		if w.peek() == ']' {
			return w.expect(']')
		}
		for {
			if err := w.singular(fd); err != nil {
				return err
			}
			if w.peek() != ',' {
				return w.expect(']')
			}
			w.pos++
			w.out = append(w.out, ',')
		}
	}
	return w.singular(fd)
}

// singular copies one value of fd's kind.
func (w *int64Writer) singular(fd protoreflect.FieldDescriptor) error {
	switch fd.Kind() {
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return w.int64()
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if w.peek() == 'n' {
			return w.skip()
		}
		return w.message(fd.Message())
	}
	return w.skip()
}

// int64 copies a 64-bit integer: protojson's decimal string as a number
// with the same digits; anything else (not protojson's) as it is.
func (w *int64Writer) int64() error {
	if w.peek() != '"' {
		return w.skip()
	}
	end, err := stringEnd(w.in, w.pos)
	if err != nil {
		return w.errorf("%v", err)
	}
	if digits := w.in[w.pos+1 : end-1]; jsonInteger(digits) {
		w.out = append(w.out, digits...)
	} else {
		w.out = append(w.out, w.in[w.pos:end]...)
	}
	w.pos = end
	return nil
}

// any copies a google.protobuf.Any: protojson writes "@type" first, then
// the embedded message's members, or, for a well-known embedded type, its
// form as "value". An Any whose type does not resolve is copied as it is.
func (w *int64Writer) any() error {
	if err := w.expect('{'); err != nil {
		return err
	}
	if w.peek() == '}' { // an empty Any
		return w.expect('}')
	}
	name, err := w.key()
	if err != nil {
		return err
	}
	if name != "@type" {
		return w.errorf("an Any's first member is %q, not @type", name)
	}
	end, err := valueEnd(w.in, w.pos)
	if err != nil {
		return w.errorf("%v", err)
	}
	var url string // read before skip copies it over
	if err := json.Unmarshal(w.in[w.pos:end], &url); err != nil {
		return w.errorf("an Any's @type: %v", err)
	}
	if err := w.skip(); err != nil {
		return err
	}
	if w.peek() != ',' {
		return w.expect('}')
	}
	w.pos++
	w.out = append(w.out, ',')
	mt, err := w.types.FindMessageByURL(url)
	if err != nil {
		return w.members(nil)
	}
	md := mt.Descriptor()
	if _, ok := wellKnown(md, false); !ok {
		return w.members(md)
	}
	if name, err := w.key(); err != nil {
		return err
	} else if name != "value" {
		return w.errorf("an Any of %s has %q, not value", md.FullName(), name)
	}
	if err := w.message(md); err != nil {
		return err
	}
	return w.expect('}')
}

// key copies an object member's name and its colon, and returns the name.
func (w *int64Writer) key() (string, error) {
	if w.peek() != '"' {
		return "", w.errorf("want a member name")
	}
	end, err := stringEnd(w.in, w.pos)
	if err != nil {
		return "", w.errorf("%v", err)
	}
	raw := w.in[w.pos:end]
	name := string(raw[1 : len(raw)-1])
	if bytes.IndexByte(raw, '\\') >= 0 {
		if err := json.Unmarshal(raw, &name); err != nil {
			return "", w.errorf("%v", err)
		}
	}
	w.out = append(w.out, raw...)
	w.pos = end
	return name, w.expect(':')
}

// skip copies one value as it is.
func (w *int64Writer) skip() error {
	end, err := valueEnd(w.in, w.pos)
	if err != nil {
		return w.errorf("%v", err)
	}
	w.out = append(w.out, w.in[w.pos:end]...)
	w.pos = end
	return nil
}

// valueEnd is the index just after the compact JSON value at in[i].
func valueEnd(in []byte, i int) (int, error) {
	if i >= len(in) {
		return 0, fmt.Errorf("want a value")
	}
	switch in[i] {
	case '"':
		return stringEnd(in, i)
	case '{', '[':
		depth := 0
		for i < len(in) {
			switch in[i] {
			case '"':
				end, err := stringEnd(in, i)
				if err != nil {
					return 0, err
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
			i++
		}
		return 0, fmt.Errorf("an unterminated object or array")
	}
	start := i // a number, true, false or null
	for i < len(in) && in[i] != ',' && in[i] != '}' && in[i] != ']' {
		i++
	}
	if i == start {
		return 0, fmt.Errorf("want a value")
	}
	return i, nil
}

// stringEnd is the index just after the JSON string starting at in[i].
func stringEnd(in []byte, i int) (int, error) {
	for j := i + 1; j < len(in); j++ {
		switch in[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("an unterminated string")
}

// jsonInteger reports whether b is an integer as JSON writes one: an
// optional minus, then 0 or digits not starting with 0.
func jsonInteger(b []byte) bool {
	if len(b) > 0 && b[0] == '-' {
		b = b[1:]
	}
	if len(b) == 0 || (b[0] == '0' && len(b) > 1) {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
