package mcpwire

import (
	"strings"
	"testing"
)

// What a model reads of the key: a fresh value per intended action, reused
// only to retry it, never an id of the thing the action acts on (a model
// that reuses a customer id for a second charge is silently replayed the
// first).
func TestKeyTextsAskForAFreshKeyPerAction(t *testing.T) {
	for name, text := range map[string]string{
		"KeyArgumentDescription": KeyArgumentDescription,
		"KeyMissingMessage":      KeyMissingMessage("idempotency_key"),
	} {
		lower := strings.ToLower(text)
		if strings.Contains(lower, "the thing it acts on") || strings.Contains(lower, "such as an order id") {
			t.Errorf("%s suggests reusing an existing id as the key: %q", name, text)
		}
		if !strings.Contains(lower, "fresh") || !strings.Contains(lower, "only to retry") {
			t.Errorf("%s does not ask for a fresh key per action, reused only to retry it: %q", name, text)
		}
	}
}

// KEY_MISSING names the argument first: stock hosts cannot set _meta, and
// the model reading the message can only fill the argument.
func TestKeyMissingNamesTheArgumentFirst(t *testing.T) {
	msg := KeyMissingMessage("orderId")
	arg, meta := strings.Index(msg, "orderId"), strings.Index(msg, "_meta")
	if arg < 0 || meta < 0 || arg > meta {
		t.Errorf("KeyMissingMessage(orderId) = %q: want the argument named before _meta", msg)
	}
	if msg := KeyMissingMessage(); !strings.Contains(msg, "_meta[\""+MetaKey+"\"]") || strings.Contains(msg, "argument") {
		t.Errorf("KeyMissingMessage() = %q: want _meta alone", msg)
	}
}
