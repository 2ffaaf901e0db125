//! The error state: what the kernel's `errors=continue|remount-ro|panic` does
//! once something goes wrong, and its record in the superblock.
//!
//! Invariants: the state only grows (none, recorded, read-only); the reason is
//! set before the state changes, so whoever sees an error also sees why; every
//! read-modify-write of the home superblock (an error record here, the journal's
//! needs_recovery flag) holds `home_superblock`, so neither undoes the other.

use crate::cache::BufferCache;
use crate::error::{Error, Result};
use crate::format::superblock::*;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU8, Ordering};
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
    /// Abort the process (errors=panic).
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
    pub(crate) fn record(&self, cache: &BufferCache, sb: &RwLock<Superblock>, why: &str, abort: bool) {
        self.record_as(cache, sb, why, abort, error_record(why));
    }

    /// As `record`, for an error at inode `ino` (0: none) and block `block`,
    /// which the superblock's record names as the kernel's does.
    pub(crate) fn record_at(&self, cache: &BufferCache, sb: &RwLock<Superblock>, why: &str, ino: u32, block: u64) {
        self.record_as(cache, sb, why, false, ErrorRecord { ino, block, ..error_record(why) });
    }

    fn record_as(&self, cache: &BufferCache, sb: &RwLock<Superblock>, why: &str, abort: bool, rec: ErrorRecord) {
        // The reason first, then the state: whoever sees the error state sees it whole.
        let _ = self.reason.set(why.to_string());
        let state = if self.behaviour == Errors::RemountRo || abort { ERROR_READ_ONLY } else { ERROR_RECORDED };
        self.state.fetch_max(state, Ordering::SeqCst);
        eprintln!("uext4: error: {why}");
        sb.write().record_error(&rec);
        if let Err(e) = self.write_home(cache, &rec) {
            eprintln!("uext4: recording the error in the superblock failed: {e}");
        }
        if self.behaviour == Errors::Panic {
            panic!("uext4: errors=panic: {why}");
        }
    }

    /// The journal superblock recorded an errno (an abort in a previous mount):
    /// as the kernel at mount, the error is recorded and the mount goes on.
    pub(crate) fn record_from_previous_mount(&self, cache: &BufferCache, sb: &RwLock<Superblock>, errno: i32) {
        let why = format!("the journal recorded error {errno} in a previous mount");
        let rec = error_record(&why);
        sb.write().record_error(&rec);
        let _ = self.write_home(cache, &rec);
    }

    /// Records the error in the superblock on disk: the home copy is patched, not
    /// replaced by the in-memory one (which holds changes no commit made durable).
    fn write_home(&self, cache: &BufferCache, rec: &ErrorRecord) -> Result<()> {
        let _home = self.home_superblock.lock();
        let dev = cache.device();
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        dev.read_at(SUPERBLOCK_OFFSET, &mut raw)?;
        let mut home = Superblock::from_bytes(&raw);
        home.record_error(rec);
        dev.write_at(SUPERBLOCK_OFFSET, &home.to_bytes())?;
        dev.flush()
    }
}

fn error_record(why: &str) -> ErrorRecord {
    // The function field names where uext4 noticed, as the kernel's names the C
    // function: the first words of the reason.
    let func: String = why.chars().take(32).collect();
    ErrorRecord { time: crate::clock::coarse_seconds(), ino: 0, block: 0, func, line: 0, errcode: EXT4_ERR_EIO }
}
