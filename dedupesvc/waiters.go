package dedupesvc

import "sync"

// Waiters is the in-memory registry a Notifier keeps: which waiting Begins to
// wake for which record. The zero value is ready; it is safe for concurrent
// use. Records are named by any comparable id (a RecordID, or a hash of it).
type Waiters[ID comparable] struct {
	mu  sync.Mutex
	set map[ID]map[chan struct{}]struct{}
}

// Add registers a waiter for id and returns its channel, which receives
// after Wake(id), and the function that removes it (safe to call twice).
func (w *Waiters[ID]) Add(id ID) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.set == nil {
		w.set = map[ID]map[chan struct{}]struct{}{}
	}
	chans, ok := w.set[id]
	if !ok {
		chans = map[chan struct{}]struct{}{}
		w.set[id] = chans
	}
	chans[ch] = struct{}{}
	w.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			w.mu.Lock()
			delete(chans, ch)
			if len(chans) == 0 {
				delete(w.set, id)
			}
			w.mu.Unlock()
		})
	}
}

// Wake wakes every waiter of id. A waiter already woken stays woken once: it
// re-reads the record anyway.
func (w *Waiters[ID]) Wake(id ID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.set[id] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
