package sqlitestore

// QueuedForTest returns how many operations wait for the group commit.
func (s *Store) QueuedForTest() int { return s.group.Queued() }

// WritingForTest returns how many operations the group commit writes now.
func (s *Store) WritingForTest() int { return s.group.Writing() }
