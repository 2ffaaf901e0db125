//! `CachePadded`: a value alone on its cache lines.
//!
//! The lock tables, the buffer cache and the inode cache split their maps over
//! shards chosen by inode or block number, and two threads working side by side
//! touch neighbouring numbers (two files created at once get consecutive inode
//! numbers, so neighbouring shards). Shards packed in a `Vec` share cache
//! lines with their neighbours, so each of those threads' shard locks took the
//! line away from the other: no lock was contended, yet every access missed.
//! Each shard on lines of its own removes that false sharing. 128 bytes, not 64:
//! x86 processors fetch lines in adjacent pairs.

use std::ops::Deref;

/// `T`, aligned (and so sized) to 128 bytes.
#[derive(Default)]
#[repr(align(128))]
pub struct CachePadded<T>(pub T);

impl<T> Deref for CachePadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_never_share_a_line() {
        let v: Vec<CachePadded<parking_lot::Mutex<u8>>> = (0..4).map(|_| CachePadded::default()).collect();
        let a = &*v[0] as *const _ as usize;
        let b = &*v[1] as *const _ as usize;
        assert_eq!(a % 128, 0);
        assert!(b - a >= 128);
    }
}
