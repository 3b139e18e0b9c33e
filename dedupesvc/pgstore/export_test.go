package pgstore

// QueuedForTest returns how many statements wait for the group commit.
func (s *Store) QueuedForTest() int { return s.group.Queued() }

// WritingForTest returns how many statements the group commit writes now.
func (s *Store) WritingForTest() int { return s.group.Writing() }
