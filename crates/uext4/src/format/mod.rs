//! Every on-disk ext4 and jbd2 structure: parse from bytes, write to bytes, checksums, hashes.
//!
//! This layer is pure: no I/O, no locks, no allocation policy. Field names follow the
//! kernel's `ext4.h` so that anyone who knows ext4 finds their way.

pub mod acl;
pub mod bitmap;
pub mod bytes;
pub mod csum;
pub mod dirent;
pub mod extent;
pub mod group_desc;
pub mod hash;
pub mod htree;
pub mod inode;
pub mod journal;
pub mod superblock;
pub mod xattr;
