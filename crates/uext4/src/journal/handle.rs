//! Transaction handles: every metadata change happens inside one.
//!
//! `let mut tx = vol.begin(credits)?; ... tx.dirty(&buf); ... tx.finish()?` (the
//! `Filesystem` façade's `begin` first lets pending frees commit when space is
//! short). A handle joins the journal's running transaction: the buffers it
//! dirties are committed together, by the journal thread, after the handle ends. `begin` never commits
//! in the caller's thread; it waits only when the running transaction has passed
//! its hard limit (see log.rs), and a nested `begin` of the same thread never
//! waits. Rule that keeps this deadlock-free: take inode and directory locks
//! *before* `begin`; inside a handle take only the leaf locks (groups, allocator,
//! cache), and never wait for a commit. Without a journal a handle only marks
//! buffers dirty for the write-back thread or the next sync.
//!
//! All or nothing. An operation checks everything that can refuse it (space,
//! names, limits, permissions) *before* its first `tx.dirty`; it then either
//! completes and calls `finish`, or fails. A handle that ends without `finish`
//! after dirtying buffers (an error returned with `?` halfway) cannot be undone:
//! it aborts the journal, so the half-done transaction never becomes durable, and
//! puts the filesystem in its error state (`errors=`, see volume/error_state.rs). A handle that
//! failed before dirtying anything ends cleanly.

use crate::cache::Buffer;
use crate::error::Result;
use crate::journal::log::{Joined, HANDLES_HELD};
use crate::volume::Volume;
use std::sync::Arc;

pub struct Handle<'a> {
    vol: &'a Volume,
    /// Blocks this handle expects to dirty.
    pub credits: u32,
    dirtied: bool,
    finished: bool,
    joined: Option<Joined<'a>>,
}

impl<'a> Handle<'a> {
    /// A handle of `vol` that joined the running transaction (`joined`), or, on a
    /// volume without a journal, none. Only `Volume::begin` makes one.
    pub(crate) fn new(vol: &'a Volume, credits: u32, joined: Option<Joined<'a>>) -> Handle<'a> {
        HANDLES_HELD.with(|h| h.set(h.get() + 1));
        Handle { vol, credits, dirtied: false, finished: false, joined }
    }
}

impl Handle<'_> {
    /// Records that `buf` was changed under this handle.
    pub fn dirty(&mut self, buf: &Arc<Buffer>) {
        self.dirtied = true;
        // Read before written: every handle of every thread passes here, and
        // a store would take the line (and its neighbours') from the others.
        if !self.vol.changed.load(std::sync::atomic::Ordering::Relaxed) {
            self.vol.changed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        match self.vol.journal() {
            Some(journal) => journal.dirtied(buf),
            None => {
                self.vol.cache.mark_dirty(buf);
                self.vol.writeback_kick();
            }
        }
    }

    /// `ino` changed under this handle: an fsync of it waits for this transaction.
    pub(crate) fn note_inode(&self, ino: u32) {
        if let (Some(journal), Some(joined)) = (self.vol.journal(), self.joined.as_ref()) {
            journal.note_inode(ino, joined.tid);
        }
    }

    /// The transaction this handle belongs to; None without a journal.
    pub(crate) fn tid(&self) -> Option<u64> {
        self.joined.as_ref().map(|j| j.tid)
    }

    pub fn finish(mut self) -> Result<()> {
        self.finished = true;
        Ok(())
    }
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        // Abort while still inside the transaction, so it cannot close and commit
        // half-done in between (the abort itself waits for no commit).
        if self.dirtied && !self.finished {
            // The error that stopped the operation went to its caller; the record
            // says where (the kernel's ext4_journal_abort_handle) with no errno.
            let site = crate::error::ErrorSite { func: "handle_unfinished", errno: 0 };
            self.vol.fail_operation(site, "an operation failed after changing metadata, which cannot be undone");
        }
        self.joined.take();
        HANDLES_HELD.with(|h| h.set(h.get() - 1));
    }
}
