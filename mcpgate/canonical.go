package mcpgate

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// The fingerprint's RFC 8785 (JCS) canonical form, in time linear in its
// input but for sorting each object's members (n log n) and in memory
// linear too. It writes what github.com/gowebpki/jcs's Transform wrote,
// byte for byte (stored records are keyed by it), for the compact JSON
// json.Marshal writes; jcs sorted members by insertion into a list and
// built each nesting level's text anew, so 40000 members or a few thousand
// levels of nesting cost CPU-seconds to minutes.
//
// It reads the input once, writing the canonical text of every name,
// string, number and literal to one buffer in input order and recording
// where each object and member lies in it; then writes the result once,
// each object's members in sorted order.

// errLoneSurrogate refuses a \u escape of a UTF-16 surrogate that is not
// followed by another \u escape (jcs read past it in a member name).
var errLoneSurrogate = errors.New(`a \u escape of a lone UTF-16 surrogate (\ud800 to \udfff without a second \u escape)`)

// maxCanonicalDepth bounds nesting, as encoding/json does (it refuses
// deeper input before it gets here).
const maxCanonicalDepth = 10000

type canonicalizer struct {
	src []byte
	i   int
	// text is the canonical text of every token in input order, with the
	// separators of arrays and objects.
	text []byte
	objs []canonObject
	// mems holds each object's members, sorted, contiguously; pending the
	// members of the objects still being read.
	mems, pending []canonMember
	// keys holds the members' sort keys: their names in UTF-16 code units.
	keys []uint16
	// name is scratch for a string's decoded bytes.
	name []byte
	// work counts bytes written and code units compared, for the tests.
	work int
}

// canonObject is one object, in the order objects start.
type canonObject struct {
	// start and end delimit it in text, braces included.
	start, end int
	// mems[first:last] are its members, sorted.
	first, last int
	// after is the index of the first object not nested in it.
	after int
}

// canonMember is one member: `"name":value` at text[start:end], its sort
// key keys[key:keyEnd]; the objects nested in its value are the ones from
// objs[objs] that start before end.
type canonMember struct {
	start, end  int
	key, keyEnd int
	objs        int
}

// canonicalJSON returns the canonical form of src, compact JSON as
// json.Marshal writes it, and the work it took.
func canonicalJSON(src []byte) ([]byte, int, error) {
	c := &canonicalizer{src: src, text: make([]byte, 0, len(src))}
	c.space()
	if err := c.value(0); err != nil {
		return nil, 0, err
	}
	if c.space(); c.i != len(src) {
		return nil, 0, fmt.Errorf("unexpected %q after the JSON value", src[c.i])
	}
	out := c.span(make([]byte, 0, len(c.text)), 0, len(c.text), 0)
	c.work += len(out)
	return out, c.work, nil
}

// span appends text[a:b] to dst with each object in it (from objs[j] on)
// written with its members sorted.
func (c *canonicalizer) span(dst []byte, a, b, j int) []byte {
	for j < len(c.objs) && c.objs[j].start < b {
		o := c.objs[j]
		dst = append(dst, c.text[a:o.start]...)
		dst = append(dst, '{')
		for k := o.first; k < o.last; k++ {
			if k > o.first {
				dst = append(dst, ',')
			}
			m := c.mems[k]
			dst = c.span(dst, m.start, m.end, m.objs)
		}
		dst = append(dst, '}')
		a, j = o.end, o.after
	}
	return append(dst, c.text[a:b]...)
}

func (c *canonicalizer) space() {
	for c.i < len(c.src) {
		switch c.src[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

func (c *canonicalizer) next() (byte, error) {
	c.space()
	if c.i >= len(c.src) {
		return 0, errors.New("unexpected end of JSON")
	}
	return c.src[c.i], nil
}

func (c *canonicalizer) expect(b byte) error {
	got, err := c.next()
	if err != nil {
		return err
	}
	if got != b {
		return fmt.Errorf("expected %q, got %q", b, got)
	}
	c.i++
	return nil
}

func (c *canonicalizer) value(depth int) error {
	if depth > maxCanonicalDepth {
		return fmt.Errorf("nested deeper than %d", maxCanonicalDepth)
	}
	b, err := c.next()
	if err != nil {
		return err
	}
	switch b {
	case '{':
		return c.object(depth)
	case '[':
		return c.array(depth)
	case '"':
		if err := c.str(); err != nil {
			return err
		}
		c.decorate()
		return nil
	}
	return c.scalar()
}

func (c *canonicalizer) array(depth int) error {
	c.i++
	c.text = append(c.text, '[')
	for n := 0; ; n++ {
		b, err := c.next()
		if err != nil {
			return err
		}
		if b == ']' {
			c.i++
			c.text = append(c.text, ']')
			return nil
		}
		if n > 0 {
			if err := c.expect(','); err != nil {
				return err
			}
			c.text = append(c.text, ',')
		}
		if err := c.value(depth + 1); err != nil {
			return err
		}
	}
}

func (c *canonicalizer) object(depth int) error {
	c.i++
	idx := len(c.objs)
	c.objs = append(c.objs, canonObject{start: len(c.text)})
	c.text = append(c.text, '{')
	base := len(c.pending)
	for n := 0; ; n++ {
		b, err := c.next()
		if err != nil {
			return err
		}
		if b == '}' {
			c.i++
			break
		}
		if n > 0 {
			if err := c.expect(','); err != nil {
				return err
			}
			c.text = append(c.text, ',')
		}
		if b, err = c.next(); err != nil {
			return err
		}
		if b != '"' {
			return fmt.Errorf("expected a member name, got %q", b)
		}
		m := canonMember{start: len(c.text), key: len(c.keys), objs: len(c.objs)}
		if err := c.str(); err != nil {
			return err
		}
		for s := c.name; len(s) > 0; {
			// As jcs: each byte of invalid UTF-8 is U+FFFD.
			r, size := utf8.DecodeRune(s)
			c.keys = utf16.AppendRune(c.keys, r)
			s = s[size:]
		}
		m.keyEnd = len(c.keys)
		c.decorate()
		if err := c.expect(':'); err != nil {
			return err
		}
		c.text = append(c.text, ':')
		if err := c.value(depth + 1); err != nil {
			return err
		}
		m.end = len(c.text)
		c.pending = append(c.pending, m)
	}
	c.text = append(c.text, '}')
	members := c.pending[base:]
	slices.SortFunc(members, c.compare)
	for k := 1; k < len(members); k++ {
		if c.compare(members[k-1], members[k]) == 0 {
			return fmt.Errorf("duplicate member name %q", string(utf16.Decode(c.keys[members[k].key:members[k].keyEnd])))
		}
	}
	o := &c.objs[idx]
	o.end, o.first = len(c.text), len(c.mems)
	c.mems = append(c.mems, members...)
	o.last, o.after = len(c.mems), len(c.objs)
	c.pending = c.pending[:base]
	return nil
}

// compare orders member names by their UTF-16 code units (RFC 8785
// section 3.2.3).
func (c *canonicalizer) compare(a, b canonMember) int {
	ka, kb := c.keys[a.key:a.keyEnd], c.keys[b.key:b.keyEnd]
	n := min(len(ka), len(kb))
	for q := range n {
		if ka[q] != kb[q] {
			c.work += q + 1
			return int(ka[q]) - int(kb[q])
		}
	}
	c.work += n + 1
	return len(ka) - len(kb)
}

// str decodes the string at src[i] (its opening quote) into name, as jcs
// did: escapes resolved, other bytes as they are (invalid UTF-8 too), a
// surrogate escape with the \u escape after it as utf16.DecodeRune pairs
// them (U+FFFD for a pair that is none).
func (c *canonicalizer) str() error {
	c.i++
	c.name = c.name[:0]
	for {
		if c.i >= len(c.src) {
			return errors.New("unterminated string")
		}
		b := c.src[c.i]
		c.i++
		switch {
		case b == '"':
			return nil
		case b < ' ':
			return errors.New("a control character in a string")
		case b != '\\':
			c.name = append(c.name, b)
			continue
		}
		if c.i >= len(c.src) {
			return errors.New("unterminated string")
		}
		e := c.src[c.i]
		c.i++
		switch e {
		case '"', '\\', '/':
			c.name = append(c.name, e)
		case 'b':
			c.name = append(c.name, '\b')
		case 'f':
			c.name = append(c.name, '\f')
		case 'n':
			c.name = append(c.name, '\n')
		case 'r':
			c.name = append(c.name, '\r')
		case 't':
			c.name = append(c.name, '\t')
		case 'u':
			r, err := c.hex4()
			if err != nil {
				return err
			}
			if utf16.IsSurrogate(r) {
				if c.i+1 >= len(c.src) || c.src[c.i] != '\\' || c.src[c.i+1] != 'u' {
					return errLoneSurrogate
				}
				c.i += 2
				r2, err := c.hex4()
				if err != nil {
					return err
				}
				r = utf16.DecodeRune(r, r2)
			}
			c.name = utf8.AppendRune(c.name, r)
		default:
			return fmt.Errorf("unknown escape \\%c", e)
		}
	}
}

func (c *canonicalizer) hex4() (rune, error) {
	if c.i+4 > len(c.src) {
		return 0, errors.New(`unterminated \u escape`)
	}
	v, err := strconv.ParseUint(string(c.src[c.i:c.i+4]), 16, 16)
	if err != nil {
		return 0, fmt.Errorf(`bad \u escape: %w`, err)
	}
	c.i += 4
	return rune(v), nil
}

// decorate writes name to text as an RFC 8785 string: quoted, with \\, \",
// \b, \f, \n, \r and \t escaped, other control characters as \u00xx, and
// every other byte as it is.
func (c *canonicalizer) decorate() {
	c.text = append(c.text, '"')
	for _, b := range c.name {
		switch b {
		case '\\', '"':
			c.text = append(c.text, '\\', b)
		case '\b':
			c.text = append(c.text, '\\', 'b')
		case '\f':
			c.text = append(c.text, '\\', 'f')
		case '\n':
			c.text = append(c.text, '\\', 'n')
		case '\r':
			c.text = append(c.text, '\\', 'r')
		case '\t':
			c.text = append(c.text, '\\', 't')
		default:
			if b < ' ' {
				c.text = fmt.Appendf(c.text, `\u%04x`, b)
			} else {
				c.text = append(c.text, b)
			}
		}
	}
	c.text = append(c.text, '"')
}

// scalar writes a literal or a number (as an IEEE 754 double in ES6 form).
func (c *canonicalizer) scalar() error {
	start := c.i
	for c.i < len(c.src) {
		b := c.src[c.i]
		if b == ',' || b == ']' || b == '}' || b == ' ' || b == '\t' || b == '\n' || b == '\r' {
			break
		}
		c.i++
	}
	token := string(c.src[start:c.i])
	switch token {
	case "true", "false", "null":
		c.text = append(c.text, token...)
		return nil
	case "":
		return errors.New("a value is missing")
	}
	f, err := strconv.ParseFloat(token, 64)
	if err != nil {
		return err
	}
	s, err := jcs.NumberToJSON(f)
	if err != nil {
		return err
	}
	c.text = append(c.text, s...)
	return nil
}
