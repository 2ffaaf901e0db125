//! The file layer: the data of regular files — reading (`read`), writing
//! (`write`), truncating (`truncate`), the space operations of fallocate and
//! lseek (`space`) and fallocate's range shifts (`shift`). Block maps are the
//! mapping layer's (`extent`), blocks the allocator's; names and attributes are the namespace's (`ns`), which calls in
//! here for setattr's size change.
//!
//! Every call takes the inode's lock, then one handle; file data never passes
//! through the metadata cache: it goes to the device before the commit of the
//! metadata that maps it, at once or, for a small file's new blocks, sorted
//! with others just before that commit (cache/write_behind.rs). Every file-data
//! access goes through `BufferCache::write_data_at`/`read_data_at`/`queue_data`.

mod read;
pub use read::{ReadPiece, ReadPlan};
mod shift;
pub mod space;
mod truncate;
mod write;
