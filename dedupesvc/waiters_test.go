package dedupesvc_test

import (
	"testing"

	"github.com/idemgate/idemgate/dedupesvc"
)

func TestWaitersWakeOnlyTheirRecord(t *testing.T) {
	t.Parallel()
	var w dedupesvc.Waiters[string]
	a, removeA := w.Add("a")
	a2, removeA2 := w.Add("a")
	b, removeB := w.Add("b")
	defer removeB()
	w.Wake("a")
	w.Wake("a") // a second wake before the first is read stays one
	for _, ch := range []<-chan struct{}{a, a2} {
		select {
		case <-ch:
		default:
			t.Fatal("a waiter of the woken record was not woken")
		}
	}
	select {
	case <-b:
		t.Fatal("a waiter of another record was woken")
	default:
	}
	removeA()
	removeA() // safe twice
	w.Wake("a")
	select {
	case <-a:
		t.Fatal("a removed waiter was woken")
	default:
	}
	select {
	case <-a2:
	default:
		t.Fatal("the remaining waiter of the record was not woken")
	}
	removeA2()
}
