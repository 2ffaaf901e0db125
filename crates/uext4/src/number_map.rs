//! Hash maps keyed by inode and block numbers, with a hasher made for them.
//!
//! The standard library's SipHash resists keys chosen to collide, at a cost
//! that showed in profiles: every lock taken through a lock table, every
//! buffer-cache and inode-cache lookup hashes a number, several times per
//! operation (about a tenth of crunl's CPU went to hashing and the lock
//! tables' maps). Here a key is mixed by one multiplication, and the high
//! half of the product is folded into the low half, so that the map's bucket
//! index (low bits) and control byte (high bits) both depend on every bit of
//! the key. The keys come from the image, so a hostile one could make some
//! collide; the maps they land in are bounded (cache shards, locks in use),
//! so that costs time, never correctness.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by a number (`u32` or `u64`) with `NumberHasher`.
pub type NumberMap<K, V> = HashMap<K, V, BuildHasherDefault<NumberHasher>>;

/// The multiplier of Fibonacci hashing: 2^64 divided by the golden ratio, odd.
pub(crate) const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Which of `shards` (a power of two, at least 2) a number-keyed map shard
/// `key` belongs to: the top bits of its Fibonacci product, so that runs of
/// keys (consecutive inode numbers) and keys a stride apart (the same slot of
/// each group's inode table, inode numbers 8,192 apart) both spread. `key %
/// shards` put the second kind all in one shard: two threads creating files in
/// two directories of different groups met on one shard lock every operation.
pub(crate) fn shard_of(key: u64, shards: usize) -> usize {
    debug_assert!(shards >= 2 && shards.is_power_of_two());
    (key.wrapping_mul(GOLDEN) >> (64 - shards.trailing_zeros())) as usize
}

/// A map by inode number in mutex-guarded shards, each on cache lines of its
/// own: for the per-inode notes that operations on different inodes would
/// otherwise meet on one mutex for (open counts, inodes that may turn inline,
/// the transaction that last changed an inode).
pub(crate) struct ShardedMap<V> {
    shards: Vec<crate::padded::CachePadded<parking_lot::Mutex<NumberMap<u32, V>>>>,
}

impl<V> ShardedMap<V> {
    const SHARDS: usize = 16;

    /// The shard holding `ino`, locked.
    pub(crate) fn shard(&self, ino: u32) -> parking_lot::MutexGuard<'_, NumberMap<u32, V>> {
        self.shards[shard_of(ino as u64, Self::SHARDS)].lock()
    }

    /// Every shard in turn, each locked while `f` runs on it.
    pub(crate) fn for_each_shard(&self, mut f: impl FnMut(&mut NumberMap<u32, V>)) {
        for shard in &self.shards {
            f(&mut shard.lock());
        }
    }
}

impl<V> Default for ShardedMap<V> {
    fn default() -> ShardedMap<V> {
        ShardedMap { shards: (0..Self::SHARDS).map(|_| Default::default()).collect() }
    }
}

/// See the module comment.
#[derive(Clone, Copy, Debug, Default)]
pub struct NumberHasher(u64);

impl Hasher for NumberHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(GOLDEN);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn strided_keys_spread_over_low_and_high_bits() {
        let build = BuildHasherDefault::<NumberHasher>::default();
        // Block numbers a group apart (multiples of 2^15) and inode numbers
        // in a run: distinct low 10 bits and top 7 bits for most of them.
        for keys in [(0..1024u64).map(|i| i << 15).collect::<Vec<_>>(), (1..1025u64).collect()] {
            let low: std::collections::HashSet<u64> = keys.iter().map(|k| build.hash_one(k) & 1023).collect();
            let top: std::collections::HashSet<u64> = keys.iter().map(|k| build.hash_one(k) >> 57).collect();
            assert!(low.len() > 600, "{} distinct bucket indexes of 1024", low.len());
            assert_eq!(top.len(), 128, "every control byte value is used");
        }
        // Shards: a run and a stride of a group's inodes each use most shards.
        for keys in [(1..65u64).collect::<Vec<_>>(), (0..64u64).map(|g| g * 8192 + 5001).collect()] {
            let used: std::collections::HashSet<usize> = keys.iter().map(|&k| shard_of(k, 64)).collect();
            assert!(used.len() > 36, "{} of 64 shards used", used.len());
            assert!(keys.iter().all(|&k| shard_of(k, 16) < 16));
        }
        let mut map: NumberMap<u32, u32> = NumberMap::default();
        map.insert(7, 1);
        assert_eq!(map.get(&7), Some(&1));
    }
}
