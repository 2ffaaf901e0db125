//! Transaction handles: every metadata change happens inside one.
//!
//! `let mut tx = fs.begin(credits)?; ... tx.dirty(&buf); ... tx.finish()?`. A handle
//! joins the journal's running transaction: the buffers it dirties are committed
//! together, and a commit waits for the handles in flight. Rule that keeps this
//! deadlock-free: take inode and directory locks *before* `begin`; inside a handle
//! take only the leaf locks (groups, allocator, cache). Without a journal a handle
//! only marks buffers dirty for the next sync.

use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::journal::log::HANDLES_HELD;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub struct Handle<'a> {
    pub(crate) fs: &'a Filesystem,
    /// Blocks this handle expects to dirty.
    pub credits: u32,
    touched: Vec<Arc<Buffer>>,
    _in_transaction: Option<parking_lot::RwLockReadGuard<'a, ()>>,
}

impl Filesystem {
    /// Starts a handle for a change touching up to `credits` metadata blocks.
    pub fn begin(&self, credits: u32) -> Result<Handle<'_>> {
        if self.is_read_only() {
            return Err(Error::ReadOnly(self.read_only_reason().to_string()));
        }
        // A transaction grown large or old commits before this handle joins it.
        self.commit_if_due()?;
        let gate = self.journal.as_ref().map(|j| j.gate.read_recursive());
        HANDLES_HELD.with(|h| h.set(h.get() + 1));
        Ok(Handle { fs: self, credits, touched: Vec::new(), _in_transaction: gate })
    }

    /// Refuses (before anything changes) an operation that could need more than
    /// `blocks` free blocks beyond those the caller may not take (the reserved
    /// ones, unless privileged): a change must not run out of space halfway (a
    /// handle cannot be undone once it has dirtied buffers).
    pub(crate) fn ensure_space(&self, blocks: u64) -> Result<()> {
        let reserved = self.reserved_blocks();
        let free = self.allocatable_blocks();
        if free < reserved + blocks {
            return Err(Error::NoSpace(format!(
                "{free} free blocks (not counting those freed since the last commit), {reserved} reserved, up to {blocks} needed"
            )));
        }
        Ok(())
    }
}

impl Handle<'_> {
    /// Records that `buf` was changed under this handle.
    pub fn dirty(&mut self, buf: &Arc<Buffer>) {
        if let Some(journal) = self.fs.journal.as_ref() {
            if self.fs.cache.mark_dirty(buf) {
                journal.running_blocks.fetch_add(1, Ordering::Relaxed);
            }
            journal.cancel_revoke(buf.block);
        } else {
            self.fs.cache.mark_dirty(buf);
        }
        if !self.touched.iter().any(|b| Arc::ptr_eq(b, buf)) {
            self.touched.push(buf.clone());
        }
    }

    pub fn finish(self) -> Result<()> {
        Ok(())
    }
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        HANDLES_HELD.with(|h| h.set(h.get() - 1));
    }
}
