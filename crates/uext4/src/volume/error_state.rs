//! The error state: what the kernel's `errors=continue|remount-ro|panic` does
//! once something goes wrong, and its record in the superblock.
//!
//! Invariants: the state only grows (none, recorded, read-only); the reason is
//! set before the state changes, so whoever sees an error also sees why; every
//! read-modify-write of the home superblock (an error record here, the journal's
//! needs_recovery flag) holds `home_superblock`, so neither undoes the other.

use crate::cache::BufferCache;
use crate::error::{Error, ErrorSite as Site, Result};
use crate::format::superblock::*;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::OnceLock;

/// The kernel's errors= behaviours. Whatever the choice, an error that aborts the
/// journal (a failed commit, an operation failing halfway) leaves the filesystem
/// read-only, as the kernel's journal abort does; `Continue` goes on only after
/// errors that leave no half-done change behind (images without a journal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Errors {
    /// Go on (errors=continue).
    Continue,
    /// Refuse changes from then on (errors=remount-ro).
    RemountRo,
    /// Stop (errors=panic): the filesystem turns read-only and the call that
    /// met the error panics, with a message `is_errors_panic` recognizes; a
    /// frontend ends there, as the kernel's panic stops the machine.
    Panic,
}

impl std::str::FromStr for Errors {
    type Err = Error;
    fn from_str(s: &str) -> Result<Errors> {
        match s {
            "continue" => Ok(Errors::Continue),
            "remount-ro" => Ok(Errors::RemountRo),
            "panic" => Ok(Errors::Panic),
            _ => Err(Error::Invalid(format!("errors={s}: expected continue, remount-ro or panic"))),
        }
    }
}

impl std::fmt::Display for Errors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Errors::Continue => "continue",
            Errors::RemountRo => "remount-ro",
            Errors::Panic => "panic",
        })
    }
}

impl Errors {
    /// The superblock's default (s_errors); remount-ro when it names none.
    pub fn from_superblock(s_errors: u16) -> Errors {
        match s_errors {
            EXT4_ERRORS_CONTINUE => Errors::Continue,
            EXT4_ERRORS_PANIC => Errors::Panic,
            _ => Errors::RemountRo,
        }
    }
}

const ERROR_NONE: u8 = 0;
const ERROR_RECORDED: u8 = 1;
const ERROR_READ_ONLY: u8 = 2;

/// Whether an error has put the filesystem in its error state, and why.
pub(crate) struct ErrorState {
    behaviour: Errors,
    /// `ERROR_NONE`, `ERROR_RECORDED` (errors=continue goes on) or `ERROR_READ_ONLY`
    /// (writes are refused with EROFS and fsync fails with EIO from here on).
    state: AtomicU8,
    /// The first error; set before `state` changes.
    reason: OnceLock<String>,
    /// Held across every read-modify-write of the home superblock.
    pub(crate) home_superblock: Mutex<()>,
}

impl ErrorState {
    pub(crate) fn new(behaviour: Errors) -> ErrorState {
        ErrorState { behaviour, state: ERROR_NONE.into(), reason: OnceLock::new(), home_superblock: Mutex::new(()) }
    }

    pub(crate) fn behaviour(&self) -> Errors {
        self.behaviour
    }

    /// Writes are refused from here on.
    pub(crate) fn is_read_only(&self) -> bool {
        self.state.load(Ordering::SeqCst) == ERROR_READ_ONLY
    }

    /// Any error was recorded.
    pub(crate) fn has_failed(&self) -> bool {
        self.state.load(Ordering::SeqCst) != ERROR_NONE
    }

    pub(crate) fn reason(&self) -> Option<&str> {
        self.reason.get().map(|s| s.as_str())
    }

    /// The kernel's ext4_handle_error: record the error in the superblock, then do
    /// what errors= says. `abort` errors (the journal stopped, or a change was left
    /// half-done) make the filesystem read-only even under errors=continue.
    pub(crate) fn record(&self, cache: &BufferCache, sb: &RwLock<Superblock>, site: Site, why: &str, abort: bool) {
        self.record_as(cache, sb, why, abort, error_record(site));
    }

    /// As `record`, for an error at inode `ino` (0: none) and block `block`,
    /// which the superblock's record names as the kernel's does.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_at(
        &self,
        cache: &BufferCache,
        sb: &RwLock<Superblock>,
        site: Site,
        why: &str,
        ino: u32,
        block: u64,
    ) {
        self.record_as(cache, sb, why, false, ErrorRecord { ino, block, ..error_record(site) });
    }

    fn record_as(&self, cache: &BufferCache, sb: &RwLock<Superblock>, why: &str, abort: bool, rec: ErrorRecord) {
        // The reason first, then the state: whoever sees the error state sees it whole.
        let _ = self.reason.set(why.to_string());
        // errors=panic stops everything, as the kernel's panic stops the machine:
        // read-only first, so that nothing unwinding the panic (a close) writes.
        let stops = self.behaviour != Errors::Continue;
        let state = if stops || abort { ERROR_READ_ONLY } else { ERROR_RECORDED };
        self.state.fetch_max(state, Ordering::SeqCst);
        eprintln!("uext4: error: {why}");
        sb.write().record_error(&rec);
        if let Err(e) = self.write_home(cache, &rec) {
            eprintln!("uext4: recording the error in the superblock failed: {e}");
        }
        if self.behaviour == Errors::Panic {
            // The payload starts with ERRORS_PANIC, by which a frontend tells
            // this stop from a bug (see `is_errors_panic`).
            ERRORS_PANICKED.store(true, Ordering::SeqCst);
            panic!("{ERRORS_PANIC}{why}");
        }
    }

    /// The journal superblock recorded an errno (an abort in a previous mount):
    /// as the kernel's ext4_clear_journal_err at mount, the filesystem is marked
    /// as having errors (no new record: the abort recorded its own) and the
    /// open goes on.
    pub(crate) fn mark_from_previous_mount(&self, cache: &BufferCache, sb: &RwLock<Superblock>, errno: i32) {
        eprintln!(
            "uext4: warning: the journal recorded error {errno} in a previous mount; \
             marking the filesystem as having errors (run e2fsck -f)"
        );
        sb.write().mark_errors();
        if let Err(e) = self.patch_home(cache, Superblock::mark_errors) {
            eprintln!("uext4: marking the superblock as having errors failed: {e}");
        }
    }

    /// Records the error in the superblock on disk.
    fn write_home(&self, cache: &BufferCache, rec: &ErrorRecord) -> Result<()> {
        self.patch_home(cache, |home| home.record_error(rec))
    }

    /// Changes the home superblock on disk by `change` and flushes: the home copy
    /// is patched, not replaced by the in-memory one (which holds changes no
    /// commit made durable).
    fn patch_home(&self, cache: &BufferCache, change: impl FnOnce(&mut Superblock)) -> Result<()> {
        let _home = self.home_superblock.lock();
        let dev = cache.device();
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        dev.read_at(SUPERBLOCK_OFFSET, &mut raw)?;
        let mut home = Superblock::from_bytes(&raw);
        change(&mut home);
        dev.write_at(SUPERBLOCK_OFFSET, &home.to_bytes())?;
        dev.flush()
    }
}

/// How an errors=panic stop's panic message begins.
const ERRORS_PANIC: &str = "uext4: errors=panic: ";

/// Set (for good) when an errors=panic stop panics in this process.
static ERRORS_PANICKED: AtomicBool = AtomicBool::new(false);

/// Whether a panic is an errors=panic stop (the image asked for it) rather than
/// a bug, by its message or, for a panic passed on from another thread (a
/// scope's "a scoped thread panicked"), because such a stop happened in this
/// process: a frontend reports the one as the image's choice.
pub fn is_errors_panic(message: &str) -> bool {
    message.starts_with(ERRORS_PANIC) || errors_panicked()
}

/// Whether an errors=panic stop has happened in this process.
pub fn errors_panicked() -> bool {
    ERRORS_PANICKED.load(Ordering::SeqCst)
}

fn error_record(site: Site) -> ErrorRecord {
    ErrorRecord {
        time: crate::clock::coarse_seconds(),
        ino: 0,
        block: 0,
        func: site.func.to_string(),
        line: 0,
        errcode: error_code_of_errno(site.errno),
    }
}
