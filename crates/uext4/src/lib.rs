//! uext4: an ext4 filesystem engine in user space.
//!
//! Layers, top to bottom (nothing imports upward): the filesystem (`fs`) with its
//! directory, file and xattr readers; `journal` recovery; the bounded buffer `cache`;
//! the `dev` block-device layer; and `format`, the pure dictionary of on-disk structures.

pub mod cache;
pub mod dev;
pub mod error;
pub mod format;

pub use error::{Error, Result};
