package httpgate

// The canonical JSON of httpgate before it streamed (kept to prove the new
// one byte-identical: TestCanonicalJSONMatchesTheLegacyOne,
// FuzzCanonicalJSON). It decoded into a token per value, copied each
// member's canonical form once per nesting level and cost ~35 times the
// body in memory.

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

const legacyMaxDepth = 64

// legacyCanonicalJSON is body in RFC 8785 canonical form (the JSON
// Canonicalization Scheme: object members sorted by their names' UTF-16
// code units, no whitespace, numbers as ECMAScript prints them, strings
// with the minimal escapes). jcs.Transform does the same, but copies every
// nested value once per level and insertion-sorts each object's members,
// quadratic on a hostile body (100,000 members, or 100,000 levels); this
// sorts members in O(n log n), copies a value once per level it is nested
// in, at most legacyMaxDepth, and uses jcs for numbers. An invalid body, a duplicate legacyMember name,
// invalid UTF-8 or nesting over legacyMaxDepth is an error: such a body is
// fingerprinted as its bytes.
func legacyCanonicalJSON(body []byte) ([]byte, error) {
	if !utf8.Valid(body) {
		return nil, errors.New("not UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(body))
	if err := legacyCanonicalValue(dec, &out, 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON value")
	}
	return out.Bytes(), nil
}

// legacyMember is one object legacyMember, its value already in canonical form.
type legacyMember struct {
	name  string
	key   []uint16
	value []byte
}

func legacyCanonicalValue(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	if depth > legacyMaxDepth {
		return errors.New("nested too deep")
	}
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '[':
			out.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := legacyCanonicalValue(dec, out, depth+1); err != nil {
					return err
				}
			}
			_, err := dec.Token() // ]
			out.WriteByte(']')
			return err
		case '{':
			// Each legacyMember is written to its own buffer to be sorted, then
			// copied once into its parent's.
			var members []legacyMember
			for dec.More() {
				nameTok, err := dec.Token()
				if err != nil {
					return err
				}
				name, _ := nameTok.(string)
				var v bytes.Buffer
				if err := legacyCanonicalValue(dec, &v, depth+1); err != nil {
					return err
				}
				members = append(members, legacyMember{name: name, key: utf16.Encode([]rune(name)), value: v.Bytes()})
			}
			if _, err := dec.Token(); err != nil { // }
				return err
			}
			slices.SortFunc(members, func(a, b legacyMember) int { return slices.Compare(a.key, b.key) })
			out.WriteByte('{')
			for i, m := range members {
				if i > 0 {
					if m.name == members[i-1].name {
						return errors.New("duplicate legacyMember name")
					}
					out.WriteByte(',')
				}
				legacyWriteString(out, m.name)
				out.WriteByte(':')
				out.Write(m.value)
			}
			out.WriteByte('}')
			return nil
		}
		return errors.New("unexpected delimiter")
	case string:
		if strings.ContainsRune(t, utf8.RuneError) {
			// The decoder turns a lone surrogate escape ("\ud800") into
			// U+FFFD, so two different bodies would read alike.
			return errors.New("a string with U+FFFD or a lone surrogate")
		}
		legacyWriteString(out, t)
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil {
			return err
		}
		if !legacySameDecimal(string(t), f) {
			// JCS numbers are doubles: 9007199254740993 would read as
			// 9007199254740992, another request.
			return errors.New("a number a double does not hold exactly")
		}
		s, err := jcs.NumberToJSON(f)
		if err != nil {
			return err
		}
		out.WriteString(s)
	case bool:
		out.WriteString(strconv.FormatBool(t))
	case nil:
		out.WriteString("null")
	}
	return nil
}

// legacyWriteString writes s as RFC 8785 does: \" \\ \b \f \n \r \t, \u00xx for
// the other control characters, everything else as is.
func legacyWriteString(out *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	out.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"', '\\':
			out.WriteByte('\\')
			out.WriteByte(c)
		case '\b':
			out.WriteString(`\b`)
		case '\f':
			out.WriteString(`\f`)
		case '\n':
			out.WriteString(`\n`)
		case '\r':
			out.WriteString(`\r`)
		case '\t':
			out.WriteString(`\t`)
		default:
			if c < 0x20 {
				out.WriteString(`\u00`)
				out.WriteByte(hex[c>>4])
				out.WriteByte(hex[c&0xf])
			} else {
				out.WriteByte(c)
			}
		}
	}
	out.WriteByte('"')
}

// legacySameDecimal reports whether the JSON number text is the decimal value of
// f's shortest representation, the one JCS writes: so canonicalising it
// loses nothing. It compares significant digits and decimal exponents, in
// time linear in the text.
func legacySameDecimal(text string, f float64) bool {
	d1, e1 := legacyDecimalOf(text)
	d2, e2 := legacyDecimalOf(strconv.FormatFloat(f, 'e', -1, 64))
	return d1 == d2 && (d1 == "" || e1 == e2)
}

// legacyDecimalOf is a decimal number's significant digits, without leading or
// trailing zeros, and the exponent of its first digit ("" for zero).
func legacyDecimalOf(text string) (digits string, exp int) {
	text = strings.TrimPrefix(text, "-")
	mantissa, expText, _ := strings.Cut(strings.ToLower(text), "e")
	e, _ := strconv.Atoi(expText)
	whole, frac, _ := strings.Cut(mantissa, ".")
	all := whole + frac
	lead := len(all) - len(strings.TrimLeft(all, "0"))
	all = strings.TrimRight(all[lead:], "0")
	if all == "" {
		return "", 0
	}
	return all, e + len(whole) - lead
}
