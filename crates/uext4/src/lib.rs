//! uext4: an ext4 filesystem engine in user space.
//!
//! Layers, top to bottom (nothing imports upward): the namespace (`ns`: stat, paths,
//! walks); files, directories, inline data and xattrs (`file`, `dir`, `inline`,
//! `xattr`); block mapping (`extent`); the `journal`; the bounded buffer `cache`;
//! the `dev` block-device layer; and `format`, the pure dictionary of on-disk
//! structures. `fs` holds the `Filesystem` they all extend. docs/ARCHITECTURE.md
//! records the layers, types and lock order as built.

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
pub mod journal;
pub mod locks;
pub mod mkfs;
pub mod ns;
pub mod space;
pub mod tunables;
pub mod xattr;

pub use error::{Error, Result};
pub use fs::{Filesystem, Options};
pub use ns::change::{Owner, SetAttr};
pub use ns::{FileType, Stat, ROOT_INO};
