//! The file layer: the data of regular files — reading (`read`), writing
//! (`write`), truncating (`truncate`), the space operations of fallocate and
//! lseek (`space`) and fallocate's range shifts (`shift`). Block maps are the
//! mapping layer's (`extent`), blocks the allocator's; names and attributes are the namespace's (`ns`), which calls in
//! here for setattr's size change.
//!
//! Every call takes the inode's lock, then one handle; file data goes to the
//! device directly (it never passes through the metadata cache), before the
//! commit of the metadata that maps it.

mod read;
pub use read::{ReadPiece, ReadPlan};
mod shift;
pub mod space;
mod truncate;
mod write;
