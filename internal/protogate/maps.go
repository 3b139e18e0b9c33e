package protogate

import "google.golang.org/protobuf/reflect/protoreflect"

// HasMap reports whether a message of md can hold a map field, at any
// depth: the one thing protobuf's default encoder writes in a random order
// (Go's map order), so the one thing that makes two encodings of one
// message differ unless they are deterministic.
func HasMap(md protoreflect.MessageDescriptor) bool {
	return hasMap(md, map[protoreflect.FullName]bool{})
}

func hasMap(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if f.IsMap() {
			return true
		}
		if m := f.Message(); m != nil && hasMap(m, seen) {
			return true
		}
	}
	return false
}
