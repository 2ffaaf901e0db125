//! uext4: an ext4 filesystem engine in user space.
//!
//! Layers, top to bottom (nothing imports upward): the namespace (`ns`: stat, paths,
//! walks, changes of names and attributes); files, directories, inline data and
//! xattrs (`file`, `dir`, `inline`, `xattr`); the inode table (`inodes`); block
//! mapping (`extent`); the allocator (`alloc`); the `journal`; the `volume`
//! (device, cache, geometry, superblock, descriptors, error state); the bounded
//! buffer `cache`; the `dev` block-device layer; and `format`, the pure dictionary
//! of on-disk structures. `fs` holds the `Filesystem` façade that the upper layers
//! extend; the lower ones (`volume` and below, `alloc`) are types of their own.
//! docs/ARCHITECTURE.md records the layers, types and lock order as built.

pub mod alloc;
pub mod cache;
pub mod clock;
pub mod dev;
pub mod dir;
pub mod error;
pub mod extent;
pub mod file;
pub mod format;
pub mod fs;
#[doc(hidden)]
pub mod fuzzing;
pub mod inline;
pub mod inodes;
pub mod journal;
pub mod locks;
pub mod mkfs;
pub mod ns;
pub mod tunables;
pub mod volume;
pub mod xattr;

pub use alloc::Owner;
pub use error::{Error, Result};
pub use file::space;
pub use fs::{Filesystem, Options};
pub use ns::change::SetAttr;
pub use ns::{FileType, Stat, ROOT_INO};
