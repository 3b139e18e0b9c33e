package httpgate

import (
	"bytes"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// maxJSONDepth bounds the nesting a canonical body may have: a value nested
// deeper than 64 containers makes the body fingerprinted as its bytes.
const maxJSONDepth = 64

// canonical is a JSON body read for its RFC 8785 canonical form (the JSON
// Canonicalization Scheme: object members sorted by their names' UTF-16
// code units, no whitespace, numbers as ECMAScript prints them, strings with
// the minimal escapes), which writeTo streams without building it. It holds
// offsets into the body, not copies: objStart and objOff say where each
// non-empty object starts and which run of members is its own, members the
// offset of each member's name, sorted within its object. That is 4 bytes a
// member and 8 a non-empty object; as every member owns at least 4 bytes of
// the body (`"":` and the '{' or ',' before it) and every object its '}',
// at most 2.4 bytes per byte of body.
//
// The form is byte-identical to what github.com/gowebpki/jcs made of the
// body before (fingerprint_legacy_test.go proves it), except that a member
// name with a lone surrogate escape ("\ud800") makes the body invalid, as
// such a string value already did: the decoder read both "\ud800" and
// "\udc00" as U+FFFD, so two requests fingerprinted alike.
type canonical struct {
	body []byte
	// size is the length of the canonical form.
	size     int
	objStart []int32
	objOff   []int32
	members  []int32
}

// parse modes: validate and count, then record each object, then fill and
// sort each object's members.
const (
	modeCount = iota
	modeObjects
	modeMembers
)

type parser struct {
	c    *canonical
	mode int
	// objects and nMembers count, in modeCount, the non-empty objects and
	// all members; obj is the next object's index in the later modes.
	objects, nMembers int
	obj               int
	// num is scratch for formatting a number.
	num [64]byte
}

var errInvalid = errors.New("not canonical JSON")

// parseCanonical reads body for its canonical form. An invalid body (RFC
// 8259 as encoding/json reads it), invalid UTF-8, a duplicate member name,
// a string value with U+FFFD or a lone surrogate escape, a member name with
// a lone surrogate escape, a number a double does not hold exactly, or
// nesting over maxJSONDepth is an error: such a body is fingerprinted as its
// bytes.
func parseCanonical(body []byte) (*canonical, error) {
	if len(body) > math.MaxInt32 || !utf8.Valid(body) {
		return nil, errInvalid
	}
	c := &canonical{body: body}
	p := &parser{c: c, mode: modeCount}
	if err := p.document(); err != nil {
		return nil, err
	}
	c.objStart = make([]int32, p.objects)
	c.objOff = make([]int32, p.objects+1)
	c.members = make([]int32, p.nMembers)
	for _, mode := range []int{modeObjects, modeMembers} {
		p.mode, p.obj = mode, 0
		if err := p.document(); err != nil {
			return nil, err
		}
		if mode == modeObjects {
			for k := range p.objects { // counts to offsets
				c.objOff[k+1] += c.objOff[k]
			}
		}
	}
	return c, nil
}

func (p *parser) document() error {
	b := p.c.body
	i := skipSpace(b, 0)
	end, err := p.value(i, 0)
	if err != nil {
		return err
	}
	if skipSpace(b, end) != len(b) {
		return errInvalid
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// value parses the value at b[i] (no space before it), depth containers
// deep, and returns the offset after it.
func (p *parser) value(i, depth int) (int, error) {
	if depth > maxJSONDepth {
		return 0, errInvalid
	}
	b := p.c.body
	if i >= len(b) {
		return 0, errInvalid
	}
	switch c := b[i]; {
	case c == '{':
		return p.object(i, depth)
	case c == '[':
		if p.mode == modeCount {
			p.c.size += 2 // []
		}
		j := skipSpace(b, i+1)
		if j < len(b) && b[j] == ']' {
			return j + 1, nil
		}
		for n := 0; ; n++ {
			if n > 0 && p.mode == modeCount {
				p.c.size++ // ,
			}
			end, err := p.value(j, depth+1)
			if err != nil {
				return 0, err
			}
			j = skipSpace(b, end)
			if j >= len(b) {
				return 0, errInvalid
			}
			switch b[j] {
			case ',':
				j = skipSpace(b, j+1)
			case ']':
				return j + 1, nil
			default:
				return 0, errInvalid
			}
		}
	case c == '"':
		end, size, err := scanString(b, i, p.mode == modeCount, true)
		if p.mode == modeCount {
			p.c.size += size
		}
		return end, err
	case c == 't':
		return p.literal(i, "true")
	case c == 'f':
		return p.literal(i, "false")
	case c == 'n':
		return p.literal(i, "null")
	default:
		end, ok := scanNumber(b, i)
		if !ok {
			return 0, errInvalid
		}
		if p.mode == modeCount {
			out, ok := formatNumber(p.num[:0], b[i:end])
			if !ok {
				return 0, errInvalid
			}
			p.c.size += len(out)
		}
		return end, nil
	}
}

func (p *parser) literal(i int, lit string) (int, error) {
	if !bytes.HasPrefix(p.c.body[i:], []byte(lit)) {
		return 0, errInvalid
	}
	if p.mode == modeCount {
		p.c.size += len(lit)
	}
	return i + len(lit), nil
}

// object parses the object at b[i]. In modeObjects it records the
// object's start and member count, in modeMembers its members' names,
// sorted, refusing a duplicate.
func (p *parser) object(i, depth int) (int, error) {
	b, c := p.c.body, p.c
	if p.mode == modeCount {
		c.size += 2 // {}
	}
	j := skipSpace(b, i+1)
	if j < len(b) && b[j] == '}' {
		return j + 1, nil
	}
	k := p.obj
	p.obj++
	switch p.mode {
	case modeCount:
		p.objects++
	case modeObjects:
		c.objStart[k] = int32(i)
	}
	next := 0 // modeMembers: where the next member goes
	if p.mode == modeMembers {
		next = int(c.objOff[k])
	}
	for n := 0; ; n++ {
		if j >= len(b) || b[j] != '"' {
			return 0, errInvalid
		}
		switch p.mode {
		case modeCount:
			p.nMembers++
			if n > 0 {
				c.size++ // ,
			}
			c.size++ // :
		case modeObjects:
			c.objOff[k+1]++
		case modeMembers:
			c.members[next] = int32(j)
			next++
		}
		end, size, err := scanString(b, j, p.mode == modeCount, false)
		if err != nil {
			return 0, err
		}
		if p.mode == modeCount {
			c.size += size
		}
		j = skipSpace(b, end)
		if j >= len(b) || b[j] != ':' {
			return 0, errInvalid
		}
		end, err = p.value(skipSpace(b, j+1), depth+1)
		if err != nil {
			return 0, err
		}
		j = skipSpace(b, end)
		if j >= len(b) {
			return 0, errInvalid
		}
		if b[j] == ',' {
			j = skipSpace(b, j+1)
			continue
		}
		if b[j] != '}' {
			return 0, errInvalid
		}
		if p.mode == modeMembers {
			own := c.members[c.objOff[k]:c.objOff[k+1]]
			slices.SortFunc(own, func(x, y int32) int { return compareNames(b, int(x), int(y)) })
			for m := 1; m < len(own); m++ {
				if compareNames(b, int(own[m-1]), int(own[m])) == 0 {
					return 0, errors.New("duplicate member name")
				}
			}
		}
		return j + 1, nil
	}
}

// scanString reads the JSON string at b[i] (its opening quote) and returns
// the offset after it and, when count is set, the length of its canonical
// form. A lone surrogate escape is an error; so is U+FFFD in a value (the
// legacy form refused it, as a lone surrogate decoded to it), not in a name.
func scanString(b []byte, i int, count, value bool) (end, size int, err error) {
	size = 2
	for j := i + 1; j < len(b); {
		c := b[j]
		switch {
		case c == '"':
			return j + 1, size, nil
		case c < 0x20:
			return 0, 0, errInvalid
		case c != '\\':
			if value && c == 0xEF && j+2 < len(b) && b[j+1] == 0xBF && b[j+2] == 0xBD {
				return 0, 0, errInvalid // U+FFFD
			}
			size++
			j++
			continue
		}
		r, n, ok := unescape(b, j)
		if !ok {
			return 0, 0, errInvalid
		}
		if value && r == utf8.RuneError {
			return 0, 0, errInvalid
		}
		if count {
			size += escapedLen(r)
		}
		j += n
	}
	return 0, 0, errInvalid
}

// unescape reads the escape at b[j] (a backslash): the rune it stands for
// and its length, a surrogate pair's two escapes as one rune. A lone
// surrogate is not ok.
func unescape(b []byte, j int) (rune, int, bool) {
	if j+1 >= len(b) {
		return 0, 0, false
	}
	switch b[j+1] {
	case '"', '\\', '/':
		return rune(b[j+1]), 2, true
	case 'b':
		return '\b', 2, true
	case 'f':
		return '\f', 2, true
	case 'n':
		return '\n', 2, true
	case 'r':
		return '\r', 2, true
	case 't':
		return '\t', 2, true
	case 'u':
		r1, ok := hex4(b, j+2)
		if !ok {
			return 0, 0, false
		}
		if !utf16.IsSurrogate(r1) {
			return r1, 6, true
		}
		if j+7 < len(b) && b[j+6] == '\\' && b[j+7] == 'u' {
			if r2, ok := hex4(b, j+8); ok {
				if r := utf16.DecodeRune(r1, r2); r != utf8.RuneError {
					return r, 12, true
				}
			}
		}
		return 0, 0, false // a lone surrogate
	}
	return 0, 0, false
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// escapedLen is the length of r in a canonical string.
func escapedLen(r rune) int {
	switch {
	case r == '"', r == '\\', r == '\b', r == '\f', r == '\n', r == '\r', r == '\t':
		return 2
	case r < 0x20:
		return 6
	}
	return utf8.RuneLen(r)
}

// appendEscaped appends r as a canonical string holds it.
func appendEscaped(out []byte, r rune) []byte {
	const hex = "0123456789abcdef"
	switch r {
	case '"', '\\':
		return append(out, '\\', byte(r))
	case '\b':
		return append(out, '\\', 'b')
	case '\f':
		return append(out, '\\', 'f')
	case '\n':
		return append(out, '\\', 'n')
	case '\r':
		return append(out, '\\', 'r')
	case '\t':
		return append(out, '\\', 't')
	}
	if r < 0x20 {
		return append(out, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
	}
	return utf8.AppendRune(out, r)
}

// scanNumber returns the end of the JSON number at b[i] (RFC 8259:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?).
func scanNumber(b []byte, i int) (int, bool) {
	digits := func(j int) int {
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		return j
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i + 1)
	default:
		return 0, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

// formatNumber appends the canonical form of the JSON number text (valid
// per scanNumber) to out: the double it reads as, as ECMAScript prints it.
// It is not ok when the text is not exactly that double's decimal value
// (9007199254740993, 0.10000000000000001) or overflows: canonicalising
// would lose the difference.
func formatNumber(out, text []byte) ([]byte, bool) {
	if len(text) <= 16 && !bytes.ContainsAny(text, ".eE") {
		// An integer of at most 15 digits is exactly a double and prints
		// as itself; -0 prints as 0.
		if digits := len(text) - bytes.IndexByte(text, '-') - 1; digits <= 15 {
			if string(text) == "-0" {
				return append(out, '0'), true
			}
			return append(out, text...), true
		}
	}
	f, err := strconv.ParseFloat(string(text), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) || !sameDecimal(text, f) {
		return out, false
	}
	if f == 0 {
		return append(out, '0'), true
	}
	if f < 0 {
		out = append(out, '-')
		f = -f
	}
	if f < 1e21 && f >= 1e-6 {
		return strconv.AppendFloat(out, f, 'f', -1, 64), true
	}
	start := len(out)
	out = strconv.AppendFloat(out, f, 'e', -1, 64)
	// Go writes 1e+09 where ECMAScript writes 1e+9.
	if e := bytes.IndexByte(out[start:], 'e'); e > 0 && out[start+e+2] == '0' {
		e += start
		out = append(out[:e+2], out[e+3:]...)
	}
	return out, true
}

// sameDecimal reports whether the JSON number text is the decimal value of
// f's shortest representation, the one JCS writes: so canonicalising it
// loses nothing. It compares significant digits and decimal exponents, in
// time linear in the text.
func sameDecimal(text []byte, f float64) bool {
	var scratch [32]byte
	d1, n1, e1, ok := decimalOf(text)
	if !ok {
		return false
	}
	d2, n2, e2, _ := decimalOf(strconv.AppendFloat(scratch[:0], f, 'e', -1, 64))
	return n1 == n2 && d1 == d2 && (n1 == 0 || e1 == e2)
}

// decimalOf is a decimal number's significant digits (without leading or
// trailing zeros; none for zero), their count and the exponent of the
// first. A text of more than 17 significant digits, which no shortest
// double has, is not ok.
func decimalOf(text []byte) (digits [17]byte, n, exp int, ok bool) {
	if len(text) > 0 && text[0] == '-' {
		text = text[1:]
	}
	mantissa, expText := text, []byte(nil)
	if e := bytes.IndexAny(text, "eE"); e >= 0 {
		mantissa, expText = text[:e], text[e+1:]
	}
	e, err := strconv.Atoi(string(expText))
	if err != nil {
		e = 0 // as the legacy form read an exponent out of int's range
	}
	whole := mantissa
	if dot := bytes.IndexByte(mantissa, '.'); dot >= 0 {
		whole = mantissa[:dot]
	}
	lead, zeros, seen := 0, 0, false
	for _, c := range mantissa {
		switch {
		case c == '.':
			continue
		case c == '0' && !seen:
			lead++
		case c == '0':
			zeros++
		default:
			seen = true
			if n+zeros+1 > len(digits) {
				return digits, 0, 0, false
			}
			for ; zeros > 0; zeros-- {
				digits[n] = '0'
				n++
			}
			digits[n] = c
			n++
		}
	}
	if n == 0 {
		return digits, 0, 0, true
	}
	return digits, n, e + len(whole) - lead, true
}

// compareNames compares the member names at b[x] and b[y] (their opening
// quotes) by their UTF-16 code units, as RFC 8785 sorts them, decoding
// escapes as it goes.
func compareNames(b []byte, x, y int) int {
	i, j := x+1, y+1
	// ASCII, unescaped: bytes compare as code units do.
	for {
		ci, cj := b[i], b[j]
		if ci == '\\' || cj == '\\' || ci >= 0x80 || cj >= 0x80 {
			break
		}
		if ci != cj {
			switch {
			case ci == '"':
				return -1
			case cj == '"':
				return 1
			case ci < cj:
				return -1
			}
			return 1
		}
		if ci == '"' {
			return 0
		}
		i, j = i+1, j+1
	}
	u, v := units{b: b, i: i}, units{b: b, i: j}
	for {
		cu, okU := u.next()
		cv, okV := v.next()
		switch {
		case !okU && !okV:
			return 0
		case !okU:
			return -1
		case !okV:
			return 1
		case cu != cv:
			if cu < cv {
				return -1
			}
			return 1
		}
	}
}

// units reads a JSON string's UTF-16 code units, from b[i] to its closing
// quote; the string is valid (parser checked it).
type units struct {
	b       []byte
	i       int
	pending uint16
	hasPend bool
}

func (u *units) next() (uint16, bool) {
	if u.hasPend {
		u.hasPend = false
		return u.pending, true
	}
	c := u.b[u.i]
	switch {
	case c == '"':
		return 0, false
	case c == '\\':
		if u.b[u.i+1] == 'u' {
			// Each \uXXXX is one code unit, a surrogate pair's halves too.
			r, _ := hex4(u.b, u.i+2)
			u.i += 6
			return uint16(r), true
		}
		r, n, _ := unescape(u.b, u.i)
		u.i += n
		return uint16(r), true
	case c < 0x80:
		u.i++
		return uint16(c), true
	}
	r, n := utf8.DecodeRune(u.b[u.i:])
	u.i += n
	if r >= 0x10000 {
		r1, r2 := utf16.EncodeRune(r)
		u.pending, u.hasPend = uint16(r2), true
		return uint16(r1), true
	}
	return uint16(r), true
}

// sink buffers the canonical form on its way to w (a hash), so w sees a
// few large writes.
type sink struct {
	w   io.Writer
	buf []byte
	// num and esc are scratch for a number and an escape.
	num [64]byte
	esc [8]byte
}

// writeString writes a short constant.
func (s *sink) writeString(p string) {
	if len(s.buf)+len(p) > cap(s.buf) {
		s.flush()
	}
	s.buf = append(s.buf, p...)
}

func (s *sink) write(p []byte) {
	if len(s.buf)+len(p) > cap(s.buf) {
		s.flush()
		if len(p) > cap(s.buf) {
			_, _ = s.w.Write(p)
			return
		}
	}
	s.buf = append(s.buf, p...)
}

func (s *sink) byte(c byte) {
	if len(s.buf) == cap(s.buf) {
		s.flush()
	}
	s.buf = append(s.buf, c)
}

func (s *sink) flush() {
	_, _ = s.w.Write(s.buf)
	s.buf = s.buf[:0]
}

// writeTo writes the canonical form, c.size bytes, to w.
func (c *canonical) writeTo(w io.Writer) {
	s := &sink{w: w, buf: make([]byte, 0, min(4096, c.size))}
	c.emit(s, skipSpace(c.body, 0))
	s.flush()
}

// emit writes the canonical form of the value at body[i] and returns the
// offset after it; the body is valid (parseCanonical read it).
func (c *canonical) emit(s *sink, i int) int {
	b := c.body
	switch b[i] {
	case '{':
		j := skipSpace(b, i+1)
		if b[j] == '}' {
			s.writeString("{}")
			return j + 1
		}
		k, _ := slices.BinarySearch(c.objStart, int32(i))
		s.byte('{')
		last := 0 // the end of the member last in the body
		for n, m := range c.members[c.objOff[k]:c.objOff[k+1]] {
			if n > 0 {
				s.byte(',')
			}
			j := c.emitString(s, int(m))
			j = skipSpace(b, j) + 1 // past ':'
			s.byte(':')
			last = max(last, c.emit(s, skipSpace(b, j)))
		}
		s.byte('}')
		return skipSpace(b, last) + 1
	case '[':
		s.byte('[')
		j := skipSpace(b, i+1)
		if b[j] == ']' {
			s.byte(']')
			return j + 1
		}
		for {
			j = skipSpace(b, c.emit(s, j))
			if b[j] == ']' {
				s.byte(']')
				return j + 1
			}
			s.byte(',')
			j = skipSpace(b, j+1)
		}
	case '"':
		return c.emitString(s, i)
	case 't':
		s.writeString("true")
		return i + 4
	case 'f':
		s.writeString("false")
		return i + 5
	case 'n':
		s.writeString("null")
		return i + 4
	}
	end, _ := scanNumber(b, i)
	out, _ := formatNumber(s.num[:0], b[i:end])
	s.write(out)
	return end
}

// emitString writes the canonical form of the string at body[i] and
// returns the offset after it.
func (c *canonical) emitString(s *sink, i int) int {
	b := c.body
	s.byte('"')
	run := i + 1 // start of bytes written as they are
	for j := i + 1; ; {
		switch b[j] {
		case '"':
			s.write(b[run:j])
			s.byte('"')
			return j + 1
		case '\\':
			s.write(b[run:j])
			r, n, _ := unescape(b, j)
			s.write(appendEscaped(s.esc[:0], r))
			j += n
			run = j
		default:
			j++
		}
	}
}
