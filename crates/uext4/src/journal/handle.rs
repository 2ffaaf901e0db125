//! Transaction handles: every metadata change happens inside one.
//!
//! `let mut tx = fs.begin(credits)?; ... tx.dirty(&buf); ... tx.finish()?`. A handle
//! joins the journal's running transaction: the buffers it dirties are committed
//! together, by the journal thread, after the handle ends. `begin` never commits
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
//! puts the filesystem in its error state (`errors=`, see fs.rs). A handle that
//! failed before dirtying anything ends cleanly.

use crate::cache::Buffer;
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::journal::log::{Joined, HANDLES_HELD};
use std::sync::Arc;

pub struct Handle<'a> {
    pub(crate) fs: &'a Filesystem,
    /// Blocks this handle expects to dirty.
    pub credits: u32,
    dirtied: bool,
    finished: bool,
    joined: Option<Joined<'a>>,
}

impl Filesystem {
    /// Starts a handle for a change touching up to `credits` metadata blocks.
    pub fn begin(&self, credits: u32) -> Result<Handle<'_>> {
        if self.is_read_only() {
            return Err(Error::ReadOnly(self.read_only_reason().to_string()));
        }
        let joined = match self.journal.as_ref() {
            Some(journal) => {
                if HANDLES_HELD.with(|h| h.get()) == 0 && self.frees_wanted() {
                    // Space is short and blocks freed by uncommitted transactions
                    // would relieve it: let their commit land first.
                    journal.commit_all()?;
                }
                Some(journal.join(credits)?)
            }
            None => None,
        };
        HANDLES_HELD.with(|h| h.set(h.get() + 1));
        Ok(Handle { fs: self, credits, dirtied: false, finished: false, joined })
    }

    /// Whether space is short enough that the blocks waiting for a commit to be
    /// reusable are needed: an operation may want a few hundred blocks of
    /// headroom, and would otherwise fail with ENOSPC while they wait.
    fn frees_wanted(&self) -> bool {
        const LOW_SPACE_BLOCKS: u64 = 1024;
        let Some(journal) = self.journal.as_ref() else { return false };
        if journal.pending_free_blocks.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return false;
        }
        let reserved = self.sb.read().s_r_blocks_count;
        self.allocatable_blocks() < reserved + LOW_SPACE_BLOCKS
    }

    /// Refuses (before anything changes) an operation that could need more than
    /// `blocks` free blocks beyond those the caller may not take (the reserved
    /// ones, unless privileged): a change must not run out of space halfway (a
    /// handle cannot be undone once it has dirtied buffers).
    pub(crate) fn ensure_space(&self, blocks: u64) -> Result<()> {
        let reserved = self.reserved_blocks();
        let mut free = self.allocatable_blocks();
        if free < reserved + blocks {
            if let Some(journal) = self.journal.as_ref() {
                // Blocks freed by transactions not yet committed come back when
                // they commit: wait for that once and look again, as the kernel's
                // ext4_should_retry_alloc does (the journal thread takes no lock
                // the caller may hold; inside a handle we cannot wait).
                let pending = journal.pending_free_blocks.load(std::sync::atomic::Ordering::Relaxed) > 0;
                if pending && HANDLES_HELD.with(|h| h.get()) == 0 {
                    journal.commit_all()?;
                    free = self.allocatable_blocks();
                } else if pending {
                    journal.request_commit();
                }
            }
        }
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
        self.dirtied = true;
        match self.fs.journal.as_ref() {
            Some(journal) => journal.dirtied(buf),
            None => {
                self.fs.cache.mark_dirty(buf);
                self.fs.writeback_kick();
            }
        }
    }

    /// `ino` changed under this handle: an fsync of it waits for this transaction.
    pub(crate) fn note_inode(&self, ino: u32) {
        if let (Some(journal), Some(joined)) = (self.fs.journal.as_ref(), self.joined.as_ref()) {
            journal.note_inode(ino, joined.tid);
        }
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
            self.fs.fail_operation("an operation failed after changing metadata, which cannot be undone");
        }
        self.joined.take();
        HANDLES_HELD.with(|h| h.set(h.get() - 1));
    }
}
