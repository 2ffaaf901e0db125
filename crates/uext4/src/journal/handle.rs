//! Transaction handles: every metadata change happens inside one.
//!
//! `let mut tx = fs.begin(credits)?; ... tx.dirty(&buf); ... tx.finish()?`. Until
//! uext4 writes through the jbd2 journal, a handle only marks the buffers it touched
//! dirty in the cache (write-back happens at sync); the journal will make the same
//! calls join a running transaction, so callers do not change when it arrives.

use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use std::sync::Arc;

pub struct Handle<'a> {
    pub(crate) fs: &'a Filesystem,
    /// Blocks this handle may dirty; the journal will reserve log space for them.
    pub credits: u32,
    touched: Vec<Arc<Buffer>>,
}

impl Filesystem {
    /// Starts a handle for a change touching up to `credits` metadata blocks.
    pub fn begin(&self, credits: u32) -> Result<Handle<'_>> {
        if self.is_read_only() {
            return Err(Error::ReadOnly(self.read_only_reason().to_string()));
        }
        Ok(Handle { fs: self, credits, touched: Vec::new() })
    }

    /// Refuses (before anything changes) an operation that could need more than
    /// `blocks` free blocks beyond the reserved ones: a change must not run out of
    /// space halfway, since there is no journal yet to undo the half done.
    pub(crate) fn ensure_space(&self, blocks: u64) -> Result<()> {
        let reserved = self.sb.read().s_r_blocks_count;
        let free = self.free_blocks();
        if free < reserved + blocks {
            return Err(Error::NoSpace(format!("{free} free blocks, {reserved} reserved, up to {blocks} needed")));
        }
        Ok(())
    }
}

impl Handle<'_> {
    /// Records that `buf` was changed under this handle.
    pub fn dirty(&mut self, buf: &Arc<Buffer>) {
        self.fs.cache.mark_dirty(buf);
        if !self.touched.iter().any(|b| Arc::ptr_eq(b, buf)) {
            self.touched.push(buf.clone());
        }
    }

    pub fn finish(self) -> Result<()> {
        Ok(())
    }
}
