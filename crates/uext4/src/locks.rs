//! A table of locks created on demand and dropped when no one holds or waits for
//! them: one lock per inode (or per directory) without a lock per inode in memory.
//!
//! Callers that take several must take them in ascending key order (DESIGN.md's
//! lock order); `lock_many` does that for them.

use parking_lot::{ArcMutexGuard, Mutex, RawMutex};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Default)]
pub struct LockTable {
    locks: Mutex<HashMap<u64, Arc<Mutex<()>>>>,
}

pub struct Held<'a> {
    table: &'a LockTable,
    key: u64,
    guard: Option<ArcMutexGuard<RawMutex, ()>>,
}

impl LockTable {
    pub fn lock(&self, key: u64) -> Held<'_> {
        let m = self.locks.lock().entry(key).or_default().clone();
        Held { table: self, key, guard: Some(Mutex::lock_arc(&m)) }
    }

    /// Takes the lock of `key` only if nobody holds it.
    pub fn try_lock(&self, key: u64) -> Option<Held<'_>> {
        let m = self.locks.lock().entry(key).or_default().clone();
        match Mutex::try_lock_arc(&m) {
            Some(guard) => Some(Held { table: self, key, guard: Some(guard) }),
            None => {
                // Not held by us: dropping this unheld entry removes it from the map
                // once nobody else holds or waits for it.
                drop(Held { table: self, key, guard: None });
                None
            }
        }
    }

    /// Locks every distinct key, in ascending order.
    pub fn lock_many(&self, keys: &[u64]) -> Vec<Held<'_>> {
        let mut keys = keys.to_vec();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter().map(|k| self.lock(k)).collect()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let guard = self.guard.take();
        drop(guard);
        let mut map = self.table.locks.lock();
        // Only the map's own reference left: nobody holds or waits for this lock.
        if map.get(&self.key).is_some_and(|m| Arc::strong_count(m) == 1) {
            map.remove(&self.key);
        }
    }
}
