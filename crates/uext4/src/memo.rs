//! `Memo`: a thread's few most recently used shared objects (locks of a lock
//! table, buffers of the buffer cache), each under its owner's id and a key.
//!
//! Finding a shared object through its owner's sharded map locks a shard's
//! mutex and counts a reference, both writes to lines that every thread
//! finding the same object writes too: two threads changing names in one
//! directory met there on every lock and every block of the directory they
//! took. A thread that remembers the object finds it without either.
//!
//! Invariants: a memo holds a reference, so what it remembers stays alive;
//! owners count remembered objects as held (never swept or evicted). Owner
//! ids are unique for the life of the process (`next_owner_id`), never
//! addresses: a dropped owner's objects are never mistaken for a new one's.
//! A new entry takes an empty slot, else the least recently used one's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Entries a thread remembers per kind of object.
pub(crate) const MEMO_SLOTS: usize = 8;

/// A new owner id, never handed out before in this process.
pub(crate) fn next_owner_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// (owner id, key, object) entries with their last use.
pub(crate) struct Memo<V> {
    slots: [Option<(u64, u64, Arc<V>)>; MEMO_SLOTS],
    used: [u64; MEMO_SLOTS],
    clock: u64,
}

impl<V> Default for Memo<V> {
    fn default() -> Memo<V> {
        Memo { slots: std::array::from_fn(|_| None), used: [0; MEMO_SLOTS], clock: 0 }
    }
}

impl<V> Memo<V> {
    /// The remembered object of (`owner`, `key`), marked used.
    pub(crate) fn find(&mut self, owner: u64, key: u64) -> Option<&Arc<V>> {
        let at = self.slots.iter().position(|s| s.as_ref().is_some_and(|(o, k, _)| *o == owner && *k == key))?;
        self.clock += 1;
        self.used[at] = self.clock;
        self.slots[at].as_ref().map(|(_, _, v)| v)
    }

    /// Remembers `value` as (`owner`, `key`) in place of the same key's entry,
    /// else an empty slot, else the least recently used entry.
    pub(crate) fn remember(&mut self, owner: u64, key: u64, value: Arc<V>) -> &Arc<V> {
        self.clock += 1;
        let same = self.slots.iter().position(|s| s.as_ref().is_some_and(|(o, k, _)| *o == owner && *k == key));
        let empty = || self.slots.iter().position(Option::is_none);
        let at = same.or_else(empty).unwrap_or_else(|| (0..MEMO_SLOTS).min_by_key(|&i| self.used[i]).unwrap_or(0));
        self.used[at] = self.clock;
        let (_, _, v) = self.slots[at].insert((owner, key, value));
        v
    }

    /// Forgets every entry of `owner`.
    pub(crate) fn forget_owner(&mut self, owner: u64) {
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(|(o, _, _)| *o == owner) {
                *slot = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut memo = Memo::default();
        for k in 0..MEMO_SLOTS as u64 {
            memo.remember(1, k, Arc::new(k));
        }
        assert_eq!(memo.find(1, 0).map(|v| **v), Some(0), "key 0 used again");
        memo.remember(1, 100, Arc::new(100));
        assert!(memo.find(1, 1).is_none(), "key 1 was the least recently used");
        assert!(memo.find(1, 0).is_some() && memo.find(1, 100).is_some());
        assert!(memo.find(2, 0).is_none(), "another owner's key 0");
        memo.forget_owner(1);
        assert!(memo.find(1, 0).is_none());
        // Emptied slots are filled before any remembered entry is replaced,
        // even one used longer ago than they were.
        let mut memo = Memo::default();
        memo.remember(2, 7, Arc::new(7));
        for k in 0..MEMO_SLOTS as u64 - 1 {
            memo.remember(1, k, Arc::new(k));
        }
        memo.forget_owner(1);
        for k in 0..MEMO_SLOTS as u64 - 1 {
            memo.remember(3, k, Arc::new(k));
        }
        assert!(memo.find(2, 7).is_some(), "an empty slot was there for every entry");
    }
}
