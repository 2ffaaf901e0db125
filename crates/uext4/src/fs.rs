//! `Filesystem`: an opened ext4 image and the operations on it.
//!
//! `Filesystem` is `Send + Sync` and every operation takes `&self`; state that
//! changes lives behind its own lock, taken in the order of docs/ARCHITECTURE.md.
//! Opening reads and checks the superblock and every group descriptor once; a
//! writable open also checks what the kernel checks before a read-write mount
//! (descriptors, bitmaps against their counts, orphan records) before it writes
//! anything, then starts the journal (or the write-back thread). Inodes are parsed
//! and their checksums verified once, then served from a bounded inode cache.
//! The error state (`errors=`) lives here too, shared with the journal's narrow
//! view of the filesystem (`JournalView`).
//!
//! The other modules (`alloc`, `extent`, `dir`, `file`, `space`, `xattr`,
//! `inline`, `ns`) add `impl Filesystem` blocks for their part.

use crate::cache::BufferCache;
use crate::dev::{BlockDevice, FileDevice, OverlayDevice};
use crate::error::{Error, Result};
use crate::format::group_desc::{GdCsum, GroupDesc, EXT4_BG_INODE_UNINIT};
use crate::format::inode::Inode;
use crate::format::superblock::*;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// incompat features this build reads; any other set bit refuses the open.
const INCOMPAT_SUPPORTED: u32 = INCOMPAT_FILETYPE
    | INCOMPAT_RECOVER
    | INCOMPAT_META_BG
    | INCOMPAT_EXTENTS
    | INCOMPAT_64BIT
    | INCOMPAT_FLEX_BG
    | INCOMPAT_CSUM_SEED
    | INCOMPAT_LARGEDIR
    | INCOMPAT_INLINE_DATA
    | INCOMPAT_MMP;

/// ro_compat features this build understands; others force a read-only open.
const RO_COMPAT_SUPPORTED: u32 = RO_COMPAT_SPARSE_SUPER
    | RO_COMPAT_LARGE_FILE
    | RO_COMPAT_HUGE_FILE
    | RO_COMPAT_GDT_CSUM
    | RO_COMPAT_DIR_NLINK
    | RO_COMPAT_EXTRA_ISIZE
    | RO_COMPAT_METADATA_CSUM
    | RO_COMPAT_ORPHAN_PRESENT;

const INODE_CACHE_SHARDS: usize = 16;

/// uext4 writes only extent-mapped files: without the extent feature, read-only.
const NO_EXTENTS_READ_ONLY: &str = "opened read-only: uext4 does not write filesystems without the extent feature";

#[derive(Clone, Debug)]
pub struct Options {
    pub read_only: bool,
    /// Skip checksum verification (for reading damaged images).
    pub ignore_checksums: bool,
    /// Buffer cache bound in MiB.
    pub cache_mb: usize,
    /// Inodes kept parsed in memory.
    pub inode_cache_entries: usize,
    /// The running transaction commits once it is this old, as the kernel's
    /// commit= mount option (the journal thread watches it; without a journal,
    /// the write-back thread writes dirty buffers home this often).
    pub commit_interval_secs: u64,
    /// Unwritten extents of up to this many blocks are zeroed out whole when one
    /// of their blocks is written, instead of split (0: never). Changeable while
    /// open (`Filesystem::set_tunable`).
    pub extent_zeroout_len: u32,
    /// What an error does, as the kernel's errors= mount option; None takes the
    /// superblock's s_errors (remount-ro when it names none).
    pub errors: Option<Errors>,
}

/// The kernel's errors= behaviours. Whatever the choice, an error that aborts the
/// journal (a failed commit, an operation failing halfway) leaves the filesystem
/// read-only, as the kernel's journal abort does; `Continue` goes on only after
/// errors that leave no half-done change behind (images without a journal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Errors {
    Continue,
    RemountRo,
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
    fn from_superblock(s_errors: u16) -> Errors {
        match s_errors {
            EXT4_ERRORS_CONTINUE => Errors::Continue,
            EXT4_ERRORS_PANIC => Errors::Panic,
            _ => Errors::RemountRo,
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            read_only: true,
            ignore_checksums: false,
            cache_mb: 256,
            inode_cache_entries: 65536,
            commit_interval_secs: 5,
            extent_zeroout_len: 256,
            errors: None,
        }
    }
}

/// Facts derived from the superblock that never change while the filesystem is open.
#[derive(Clone, Debug)]
pub struct Geometry {
    pub block_size: usize,
    pub inode_size: usize,
    pub inodes_per_group: u32,
    pub blocks_per_group: u32,
    pub group_count: u32,
    pub inodes_count: u32,
    pub blocks_count: u64,
    pub first_data_block: u32,
    pub desc_size: usize,
    pub csum_seed: u32,
    pub metadata_csum: bool,
    pub has_filetype: bool,
    pub has_extents: bool,
    pub has_dir_index: bool,
    pub has_inline_data: bool,
    pub huge_file: bool,
    pub largedir: bool,
    pub unsigned_hash: bool,
    pub def_hash_version: u8,
    pub hash_seed: [u32; 4],
    pub gd_csum: GdCsum,
    pub verify_checksums: bool,
}

pub struct Filesystem {
    pub(crate) cache: Arc<BufferCache>,
    pub(crate) geo: Geometry,
    pub(crate) sb: Arc<RwLock<Superblock>>,
    pub(crate) groups: Vec<RwLock<GroupDesc>>,
    inode_cache: Vec<Mutex<HashMap<u32, Arc<Inode>>>>,
    inode_cache_shard_capacity: usize,
    pub(crate) read_only: bool,
    /// Why the filesystem is read-only, for error messages.
    read_only_reason: String,
    /// Damage a read-only open went on with (a group descriptor checksum mismatch).
    damage_at_open: Option<String>,
    /// Set when a journal was replayed in memory at open.
    pub(crate) replayed_journal_blocks: usize,
    pub(crate) alloc: Arc<crate::alloc::AllocState>,
    /// Inodes whose extent tree split a node since the last sync: sync packs their
    /// trees again (see `extent::write`).
    pub(crate) extent_compact: Mutex<std::collections::HashSet<u32>>,
    /// The runtime tunable extent_zeroout_len (see `tunables`).
    pub(crate) extent_zeroout_len: std::sync::atomic::AtomicU32,
    /// Open-time tunables, kept to report them.
    pub(crate) commit_interval_secs: u64,
    pub(crate) cache_mb: usize,
    /// Open handles per inode: an unlinked inode lives until its last close.
    pub(crate) open_files: Mutex<HashMap<u32, u32>>,
    /// The orphan chain and orphan file as recorded on disk (ns/orphan.rs).
    pub(crate) orphans: Mutex<crate::ns::orphan::Orphans>,
    /// The rename lock (DESIGN.md level 1): only cross-directory renames take it.
    pub(crate) rename_lock: Mutex<()>,
    /// Directory name locks (DESIGN.md level 2; one per directory until pdirops).
    pub(crate) dir_locks: crate::locks::LockTable,
    /// Inode locks (DESIGN.md level 3), by inode number.
    pub(crate) inode_locks: crate::locks::LockTable,
    /// The jbd2 journal metadata is written through (writable opens of images with one).
    pub(crate) journal: Option<Arc<crate::journal::log::Journal>>,
    /// Group metadata (superblock copies, descriptors, bitmaps, inode tables) as
    /// sorted, merged block ranges [start, end): no file block may lie there.
    system_zone: Vec<(u64, u64)>,
    /// The error state (errors=), shared with the journal's view of the filesystem.
    pub(crate) errors: Arc<ErrorState>,
    /// The write-back thread of a writable image without a journal.
    writeback: Option<crate::cache::Writeback>,
}

/// Whether an error has put the filesystem in its error state, and why.
pub(crate) struct ErrorState {
    behaviour: Errors,
    /// `ERROR_NONE`, `ERROR_RECORDED` (errors=continue goes on) or `ERROR_READ_ONLY`
    /// (writes are refused with EROFS and fsync fails with EIO from here on). One
    /// atomic, so whoever sees an error also sees whether it made the filesystem
    /// read-only; it only ever grows.
    state: std::sync::atomic::AtomicU8,
    /// The first error; set before `state` changes, so it is there for whoever
    /// sees the state.
    reason: std::sync::OnceLock<String>,
    /// Held across every read-modify-write of the home superblock (the journal
    /// thread's needs_recovery flag, an error record from any thread), so neither
    /// undoes the other.
    home_superblock: Mutex<()>,
}

const ERROR_NONE: u8 = 0;
const ERROR_RECORDED: u8 = 1;
const ERROR_READ_ONLY: u8 = 2;

/// What the journal sees of the filesystem (`JournalOwner`): the superblock, the
/// cache and the allocator's free runs, never a whole `Filesystem`.
struct JournalView {
    cache: Arc<BufferCache>,
    sb: Arc<RwLock<Superblock>>,
    alloc: Arc<crate::alloc::AllocState>,
    geo: Geometry,
    errors: Arc<ErrorState>,
}

impl JournalView {
    fn group_first_block(&self, group: u32) -> u64 {
        self.geo.first_data_block as u64 + group as u64 * self.geo.blocks_per_group as u64
    }
}

impl crate::journal::log::JournalOwner for JournalView {
    fn set_needs_recovery(&self, on: bool) -> Result<()> {
        let bs = self.geo.block_size as u64;
        let buf = self.cache.get(SUPERBLOCK_OFFSET / bs)?;
        {
            let mut sb = self.sb.write();
            if on {
                sb.s_feature_incompat |= INCOMPAT_RECOVER;
            } else {
                sb.s_feature_incompat &= !INCOMPAT_RECOVER;
            }
            // The cached copy of the block reaches the disk only through the log
            // (see `stage_superblock`), so it always says needs_recovery: a copy
            // a checkpoint writes home must not clear the flag under a live log.
            let mut logged = sb.clone();
            logged.s_feature_incompat |= INCOMPAT_RECOVER;
            let off = (SUPERBLOCK_OFFSET % bs) as usize;
            buf.write()[off..off + SUPERBLOCK_SIZE].copy_from_slice(&logged.to_bytes());
        }
        // On disk only the flag changes: the in-memory superblock may hold changes
        // (an orphan list head, free counts) no commit has made durable yet, and a
        // crash must not find them home without the rest of their transaction.
        let _home = self.errors.home_superblock.lock();
        let dev = self.cache.device();
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        dev.read_at(SUPERBLOCK_OFFSET, &mut raw)?;
        let mut home = Superblock::from_bytes(&raw);
        if on {
            home.s_feature_incompat |= INCOMPAT_RECOVER;
        } else {
            home.s_feature_incompat &= !INCOMPAT_RECOVER;
        }
        // Not under the superblock lock: operations read it, and a flush is slow.
        dev.write_at(SUPERBLOCK_OFFSET, &home.to_bytes())?;
        dev.flush()
    }

    fn released(&self, freed: &[(u64, u64)]) {
        for &(start, len) in freed {
            let mut block = start;
            while block < start + len {
                let g = ((block - self.geo.first_data_block as u64) / self.geo.blocks_per_group as u64) as u32;
                let gstart = self.group_first_block(g);
                let in_group = (self.geo.blocks_count - gstart).min(self.geo.blocks_per_group as u64);
                let end = (start + len).min(gstart + in_group);
                if let Some(runs) = self.alloc.free_runs.get(g as usize) {
                    if let Some(runs) = runs.lock().as_mut() {
                        runs.put((block - gstart) as u32, (end - block) as u32);
                    }
                }
                block = end;
            }
        }
    }

    fn aborted(&self, why: &str) {
        record_error(&self.cache, &self.sb, &self.errors, why, true);
    }

    fn error_from_previous_mount(&self, errno: i32) {
        let why = format!("the journal recorded error {errno} in a previous mount");
        // As the kernel: the error is recorded, the mount goes on.
        let rec = error_record(&why);
        self.sb.write().record_error(&rec);
        let _ = write_error_home(&self.cache, &self.errors, &rec);
    }
}

fn error_record(why: &str) -> ErrorRecord {
    // The function field names where uext4 noticed, as the kernel's names the C
    // function: the first words of the reason.
    let func: String = why.chars().take(32).collect();
    ErrorRecord { time: crate::clock::coarse_seconds(), ino: 0, block: 0, func, line: 0, errcode: EXT4_ERR_EIO }
}

/// Records the error in the superblock on disk: the home copy is patched, not
/// replaced by the in-memory one (which holds changes no commit made durable).
fn write_error_home(cache: &BufferCache, errors: &ErrorState, rec: &ErrorRecord) -> Result<()> {
    let _home = errors.home_superblock.lock();
    let dev = cache.device();
    let mut raw = [0u8; SUPERBLOCK_SIZE];
    dev.read_at(SUPERBLOCK_OFFSET, &mut raw)?;
    let mut home = Superblock::from_bytes(&raw);
    home.record_error(rec);
    dev.write_at(SUPERBLOCK_OFFSET, &home.to_bytes())?;
    dev.flush()
}

/// The kernel's ext4_handle_error: record the error in the superblock, then do
/// what errors= says. `abort` errors (the journal stopped, or a change was left
/// half-done) make the filesystem read-only even under errors=continue.
fn record_error(cache: &BufferCache, sb: &RwLock<Superblock>, errors: &ErrorState, why: &str, abort: bool) {
    use std::sync::atomic::Ordering;
    // The reason first, then the state: whoever sees the error state sees it whole.
    let _ = errors.reason.set(why.to_string());
    let state = if errors.behaviour == Errors::RemountRo || abort { ERROR_READ_ONLY } else { ERROR_RECORDED };
    errors.state.fetch_max(state, Ordering::SeqCst);
    eprintln!("uext4: error: {why}");
    let rec = error_record(why);
    sb.write().record_error(&rec);
    if let Err(e) = write_error_home(cache, errors, &rec) {
        eprintln!("uext4: recording the error in the superblock failed: {e}");
    }
    if errors.behaviour == Errors::Panic {
        panic!("uext4: errors=panic: {why}");
    }
}

/// The image's blocks `[start, start + count)` lie beyond its end: the image is truncated.
fn check_device_size(dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    // u128: a hostile block count times a 64 KiB block overflows u64.
    let need = sb.s_blocks_count as u128 * sb.block_size() as u128;
    if (dev.size() as u128) < need {
        return Err(Error::corrupt(
            format!(
                "image is {} bytes but the superblock says {} blocks of {} bytes ({need} bytes): truncated",
                dev.size(),
                sb.s_blocks_count,
                sb.block_size()
            ),
            "device",
        ));
    }
    Ok(())
}

impl Filesystem {
    /// Opens an image file or block device. A writable open holds the image's
    /// exclusive lock until the filesystem is dropped, and is refused
    /// (`Error::Busy`) while the kernel or another uext4 process holds the image;
    /// a read-only open is not, and `in_use` says who else held it.
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Filesystem> {
        let dev = FileDevice::open(path.as_ref(), !opts.read_only)?;
        Self::open_device(Arc::new(dev), opts)
    }

    pub fn open_device(dev: Arc<dyn BlockDevice>, opts: Options) -> Result<Filesystem> {
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        if dev.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
            return Err(Error::corrupt(
                format!("image of {} bytes is too small to hold a superblock (truncated?)", dev.size()),
                "device",
            ));
        }
        dev.read_at(SUPERBLOCK_OFFSET, &mut raw)?;
        let sb = Superblock::parse(&raw, !opts.ignore_checksums)?;

        let unknown_incompat = sb.s_feature_incompat & !INCOMPAT_SUPPORTED;
        if unknown_incompat != 0 {
            let names: Vec<String> = sb
                .feature_names()
                .into_iter()
                .filter(|n| {
                    FEATURE_NAMES.iter().any(|&(w, bit, name)| w == 1 && bit & unknown_incompat != 0 && name == n)
                        || n.starts_with("FEATURE_I")
                })
                .collect();
            return Err(Error::unsupported(format!("incompatible feature(s) {}", names.join(", "))));
        }
        let mut read_only = opts.read_only;
        let mut reason = if read_only { "opened read-only".to_string() } else { String::new() };
        // Multi-mount protection needs a writer that keeps its MMP block's sequence
        // alive (the kernel's kmmpd); uext4 has none, so it only reads such images.
        if sb.has_incompat(INCOMPAT_MMP) && !read_only {
            return Err(Error::unsupported(
                "writing an image with multi-mount protection (mmp): uext4 does not run the MMP \
                 heartbeat; open read-only, or turn it off with tune2fs -O ^mmp when no other host uses it",
            ));
        }
        let unknown_ro = sb.s_feature_ro_compat & !RO_COMPAT_SUPPORTED;
        if unknown_ro != 0 && !read_only {
            return Err(Error::unsupported(format!(
                "read-only-compatible feature bits {unknown_ro:#x} ({}); open read-only",
                sb.feature_names().join(" ")
            )));
        }
        if unknown_ro != 0 {
            reason = format!("ro_compat features {unknown_ro:#x} are not understood for writing");
            read_only = true;
        }
        // Decided here, before a writable open would replay the journal onto the image.
        if !read_only && !sb.has_incompat(INCOMPAT_EXTENTS) {
            reason = NO_EXTENTS_READ_ONLY.to_string();
            read_only = true;
        }
        check_device_size(dev.as_ref(), &sb)?;

        let mut dev = dev;
        let mut replayed = 0;
        if sb.has_incompat(INCOMPAT_RECOVER) && sb.has_compat(COMPAT_HAS_JOURNAL) {
            if !read_only {
                let sb = Self::recover_journal_home(&dev, &sb, &opts)?;
                return Self::finish_open(dev, sb, opts, read_only, reason, replayed);
            }
            let (blocks, _) = Self::replay_journal_in_memory(&dev, &sb, &opts)?;
            replayed = blocks.len();
            dev = Arc::new(OverlayDevice::new(dev, sb.block_size(), blocks));
            // The replayed superblock is the one to use.
            dev.read_at(SUPERBLOCK_OFFSET, &mut raw)?;
            let replayed_sb = Superblock::parse(&raw, !opts.ignore_checksums)?;
            return Self::finish_open(dev, replayed_sb, opts, read_only, reason, replayed);
        }
        Self::finish_open(dev, sb, opts, read_only, reason, replayed)
    }

    fn finish_open(
        dev: Arc<dyn BlockDevice>,
        sb: Superblock,
        opts: Options,
        read_only: bool,
        reason: String,
        replayed_journal_blocks: usize,
    ) -> Result<Filesystem> {
        let geo = Geometry {
            block_size: sb.block_size() as usize,
            inode_size: sb.inode_size() as usize,
            inodes_per_group: sb.s_inodes_per_group,
            blocks_per_group: sb.s_blocks_per_group,
            group_count: sb.group_count() as u32,
            inodes_count: sb.s_inodes_count,
            blocks_count: sb.s_blocks_count,
            first_data_block: sb.s_first_data_block,
            desc_size: sb.desc_size(),
            csum_seed: sb.csum_seed(),
            metadata_csum: sb.has_metadata_csum(),
            has_filetype: sb.has_incompat(INCOMPAT_FILETYPE),
            has_extents: sb.has_incompat(INCOMPAT_EXTENTS),
            has_dir_index: sb.has_compat(COMPAT_DIR_INDEX),
            has_inline_data: sb.has_incompat(INCOMPAT_INLINE_DATA),
            huge_file: sb.has_ro_compat(RO_COMPAT_HUGE_FILE),
            largedir: sb.has_incompat(INCOMPAT_LARGEDIR),
            unsigned_hash: sb.s_flags & EXT2_FLAGS_UNSIGNED_HASH != 0,
            def_hash_version: sb.s_def_hash_version,
            hash_seed: sb.s_hash_seed,
            gd_csum: if sb.has_metadata_csum() {
                GdCsum::Crc32c { seed: sb.csum_seed() }
            } else if sb.has_ro_compat(RO_COMPAT_GDT_CSUM) {
                GdCsum::Crc16 { uuid: sb.s_uuid }
            } else {
                GdCsum::None
            },
            verify_checksums: !opts.ignore_checksums,
        };
        // uext4 writes only extent-mapped files: without the extent feature, read-only.
        let (read_only, reason) =
            if !read_only && !geo.has_extents { (true, NO_EXTENTS_READ_ONLY.to_string()) } else { (read_only, reason) };
        let cache = Arc::new(BufferCache::new(dev, geo.block_size, opts.cache_mb));
        // As the kernel's ext4_check_descriptors: a descriptor whose only fault is
        // its checksum refuses a writable mount and lets a read-only one go on.
        let bad_checksum = Self::first_bad_descriptor_checksum(&cache, &sb, &geo);
        let groups = Self::read_group_descriptors(&cache, &sb, &geo).map_err(|e| match (&bad_checksum, e) {
            (Some(bad), Error::Corrupt { what, location }) => Error::corrupt(format!("{what}; and {bad}"), location),
            (_, e) => e,
        })?;
        let (read_only, reason) = match &bad_checksum {
            None => (read_only, reason),
            Some(bad) if read_only => (true, format!("{bad}; opened read-only, as the kernel mounts such an image")),
            Some(bad) => {
                return Err(Error::corrupt(
                    format!(
                        "{bad}; a writable open is refused as the kernel refuses a read-write mount \
                         (open it read-only, or repair it with e2fsck)"
                    ),
                    "group descriptors",
                ))
            }
        };
        let shard_capacity = (opts.inode_cache_entries / INODE_CACHE_SHARDS).max(16);
        let alloc =
            Arc::new(crate::alloc::AllocState::new(&groups.iter().map(|g| g.read().clone()).collect::<Vec<_>>()));
        let errors = Arc::new(ErrorState {
            behaviour: opts.errors.unwrap_or(Errors::from_superblock(sb.s_errors)),
            state: ERROR_NONE.into(),
            reason: std::sync::OnceLock::new(),
            home_superblock: Mutex::new(()),
        });
        let fs = Filesystem {
            cache,
            geo,
            sb: Arc::new(RwLock::new(sb)),
            groups,
            alloc,
            extent_compact: Mutex::new(std::collections::HashSet::new()),
            extent_zeroout_len: std::sync::atomic::AtomicU32::new(opts.extent_zeroout_len),
            commit_interval_secs: opts.commit_interval_secs,
            cache_mb: opts.cache_mb,
            open_files: Mutex::new(HashMap::new()),
            orphans: Mutex::new(Default::default()),
            rename_lock: Mutex::new(()),
            dir_locks: crate::locks::LockTable::default(),
            inode_locks: crate::locks::LockTable::default(),
            inode_cache: (0..INODE_CACHE_SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            inode_cache_shard_capacity: shard_capacity,
            read_only,
            read_only_reason: reason,
            damage_at_open: bad_checksum,
            replayed_journal_blocks,
            journal: None,
            system_zone: Vec::new(),
            errors,
            writeback: None,
        };
        let mut fs = fs;
        fs.system_zone = fs.metadata_ranges().into_iter().map(|(start, end, _)| (start, end)).collect();
        fs.system_zone.sort_unstable();
        fs.system_zone.dedup_by(|next, prev| {
            let joins = next.0 <= prev.1;
            if joins {
                prev.1 = prev.1.max(next.1);
            }
            joins
        });
        if let Err(e) = fs.prepare_writes(&opts) {
            // Refused: nothing may be written back, dropping it included.
            fs.read_only = true;
            return Err(e);
        }
        Ok(fs)
    }

    /// What a writable open does before it hands the filesystem out: check the group
    /// descriptors, load the journal, finish the orphans of a previous session.
    fn prepare_writes(&mut self, opts: &Options) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        // New hash indexes take the default hash version: one e2fsck and the kernel
        // do not know would make every directory uext4 indexes unreadable to them.
        let hash = self.geo.def_hash_version;
        if self.geo.has_dir_index && hash > 2 {
            return Err(Error::corrupt(format!("default directory hash version {hash} is unknown"), "superblock"));
        }
        self.check_descriptors()?;
        self.check_block_bitmaps()?;
        // Orphans a previous session (uext4's or the kernel's) left in the chain or
        // the orphan file are checked before the journal is loaded (which writes its
        // superblock): a refused open must leave every byte as it was. They are
        // freed once the journal is ready.
        let orphans = self.pending_orphans()?;
        let interval = std::time::Duration::from_secs(opts.commit_interval_secs.max(1));
        if self.sb.read().has_compat(COMPAT_HAS_JOURNAL) {
            let map = self.journal_block_map()?;
            let view = Arc::new(JournalView {
                cache: self.cache.clone(),
                sb: self.sb.clone(),
                alloc: self.alloc.clone(),
                geo: self.geo.clone(),
                errors: self.errors.clone(),
            });
            let (want_64bit, want_csum) = {
                let sb = self.sb.read();
                (sb.is_64bit(), sb.has_metadata_csum())
            };
            self.journal = Some(crate::journal::log::Journal::load(
                map,
                self.cache.clone(),
                view,
                interval,
                want_64bit,
                want_csum,
            )?);
        } else {
            self.writeback = Some(self.cache.start_writeback(interval)?);
        }
        if !orphans.is_empty() {
            self.process_orphans(&orphans)?;
        }
        Ok(())
    }

    /// Every group's fixed metadata: (first block, end, what), unsorted.
    fn metadata_ranges(&self) -> Vec<(u64, u64, String)> {
        let itable_blocks =
            (self.geo.inodes_per_group as u64 * self.geo.inode_size as u64).div_ceil(self.geo.block_size as u64);
        let mut ranges = Vec::with_capacity(self.groups.len() * 4);
        for (g, gd) in self.groups.iter().enumerate() {
            let gd = gd.read();
            let start = self.group_first_block(g as u32);
            let base = self.base_meta_blocks(g as u32);
            if base > 0 {
                ranges.push((start, start + base, format!("group {g} superblock and descriptors")));
            }
            ranges.push((gd.bg_block_bitmap, gd.bg_block_bitmap + 1, format!("group {g} block bitmap")));
            ranges.push((gd.bg_inode_bitmap, gd.bg_inode_bitmap + 1, format!("group {g} inode bitmap")));
            ranges.push((gd.bg_inode_table, gd.bg_inode_table + itable_blocks, format!("group {g} inode table")));
        }
        ranges
    }

    /// The kernel's ext4_check_descriptors, and what the allocators rely on: each
    /// group's bitmaps and inode table lie in the filesystem (in their own group
    /// without flex_bg) and overlap neither the superblock and descriptors nor one
    /// another, and its free counts fit the group. Run before any writable open:
    /// new files would otherwise get blocks on top of the metadata.
    fn check_descriptors(&self) -> Result<()> {
        let flex_bg = self.sb.read().has_incompat(INCOMPAT_FLEX_BG);
        let ipg = self.geo.inodes_per_group;
        for (g, gd) in self.groups.iter().enumerate() {
            let gd = gd.read();
            let g = g as u32;
            let (first, in_group) = (self.group_first_block(g), self.blocks_in_group(g));
            let bad = |what: String| Err(Error::corrupt(what, format!("group {g} descriptor")));
            if gd.bg_free_blocks_count > in_group {
                return bad(format!("{} free blocks in a group of {in_group}", gd.bg_free_blocks_count));
            }
            if gd.bg_free_inodes_count > ipg {
                return bad(format!("{} free inodes in a group of {ipg}", gd.bg_free_inodes_count));
            }
            if gd.bg_itable_unused > ipg {
                return bad(format!("{} unused inode table entries in a group of {ipg}", gd.bg_itable_unused));
            }
            if !flex_bg {
                for (what, b) in [("block bitmap", gd.bg_block_bitmap), ("inode bitmap", gd.bg_inode_bitmap)] {
                    if b < first || b >= first + in_group as u64 {
                        return bad(format!("{what} at block {b} is not in the group"));
                    }
                }
            }
        }
        let mut ranges = self.metadata_ranges();
        ranges.sort_unstable_by_key(|r| (r.0, r.1));
        for w in ranges.windows(2) {
            let ((a_start, a_end, a), (b_start, b_end, b)) = (&w[0], &w[1]);
            if b_start < a_end {
                return Err(Error::corrupt(
                    format!("{b} (blocks {b_start}..{b_end}) overlaps {a} (blocks {a_start}..{a_end})"),
                    "group descriptors",
                ));
            }
        }
        Ok(())
    }

    /// Reads every initialized block bitmap once and compares its free blocks with
    /// the descriptor's count, so that no change discovers a disagreement halfway
    /// (after, say, taking an inode). A group that disagrees is left alone, as the
    /// kernel's mballoc leaves a group whose bitmap it finds corrupt: nothing is
    /// handed out from it and its free blocks leave the filesystem's count.
    fn check_block_bitmaps(&self) -> Result<()> {
        for g in 0..self.geo.group_count {
            let gd = self.groups[g as usize].read().clone();
            if gd.bg_flags & crate::format::group_desc::EXT4_BG_BLOCK_UNINIT != 0 {
                continue;
            }
            let buf = self.verified_block_bitmap(g, &gd)?;
            let runs = crate::alloc::FreeRuns::from_bitmap(&buf.read(), self.blocks_in_group(g));
            let mut slot = self.alloc.free_runs[g as usize].lock();
            if runs.total() == gd.bg_free_blocks_count as u64 {
                *slot = Some(runs);
                continue;
            }
            eprintln!(
                "uext4: corrupt filesystem: group {g}: block bitmap has {} free blocks, the descriptor says {}; \
                 not allocating from it (run e2fsck)",
                runs.total(),
                gd.bg_free_blocks_count
            );
            self.alloc.free_blocks.fetch_sub(gd.bg_free_blocks_count as u64, std::sync::atomic::Ordering::Relaxed);
            *slot = Some(crate::alloc::FreeRuns::default());
        }
        Ok(())
    }

    /// Blocks [start, start + len) may hold file data or tree nodes: inside the
    /// filesystem, past the first data block, and clear of the group metadata.
    pub(crate) fn check_metadata_free_range(&self, start: u64, len: u64, what: &dyn Fn() -> String) -> Result<()> {
        let end =
            start.checked_add(len).filter(|&e| start > self.geo.first_data_block as u64 && e <= self.geo.blocks_count);
        let Some(end) = end else {
            return Err(Error::corrupt(
                format!(
                    "blocks {start}..+{len} lie outside the filesystem ({}..{})",
                    self.geo.first_data_block + 1,
                    self.geo.blocks_count
                ),
                what(),
            ));
        };
        // The last zone starting before `end` is the only one that can overlap.
        let at = self.system_zone.partition_point(|z| z.0 < end);
        if let Some(&(zs, ze)) = at.checked_sub(1).and_then(|i| self.system_zone.get(i)) {
            if ze > start {
                return Err(Error::corrupt(
                    format!("blocks {start}..{end} overlap filesystem metadata (blocks {zs}..{ze})"),
                    what(),
                ));
            }
        }
        Ok(())
    }

    /// Where group `group`'s descriptor lives: (block, byte offset in it).
    pub fn group_desc_location(sb: &Superblock, group: u32) -> (u64, usize) {
        let bs = sb.block_size() as u64;
        let desc_size = sb.desc_size() as u64;
        let per_block = bs / desc_size;
        let first = sb.s_first_data_block as u64;
        let index_in_block = (group as u64 % per_block) as usize * desc_size as usize;
        let meta_group = group as u64 / per_block;
        if !sb.has_incompat(INCOMPAT_META_BG) || meta_group < sb.s_first_meta_bg as u64 {
            return (first + 1 + meta_group, index_in_block);
        }
        // meta_bg: each meta group's descriptor block sits in its first group,
        // after the superblock backup if that group has one.
        let g0 = meta_group * per_block;
        let group_start = first + g0 * sb.s_blocks_per_group as u64;
        let has_super = u64::from(group_has_superblock(sb, g0 as u32));
        (group_start + has_super, index_in_block)
    }

    /// The first group whose descriptor fails its checksum, described; None when
    /// all match (or checksums are not verified).
    fn first_bad_descriptor_checksum(cache: &BufferCache, sb: &Superblock, geo: &Geometry) -> Option<String> {
        if !geo.verify_checksums {
            return None;
        }
        (0..geo.group_count).find_map(|g| {
            let (block, off) = Self::group_desc_location(sb, g);
            if block >= geo.blocks_count {
                return None;
            }
            let buf = cache.get(block).ok()?;
            let data = buf.read();
            let raw = data.get(off..off + geo.desc_size)?;
            match GroupDesc::verify(raw, geo.desc_size, g, geo.gd_csum) {
                Err(Error::Corrupt { what, location }) => Some(format!("{location}: {what}")),
                _ => None,
            }
        })
    }

    fn read_group_descriptors(cache: &BufferCache, sb: &Superblock, geo: &Geometry) -> Result<Vec<RwLock<GroupDesc>>> {
        let mut groups = Vec::with_capacity(geo.group_count as usize);
        for g in 0..geo.group_count {
            let (block, off) = Self::group_desc_location(sb, g);
            if block >= geo.blocks_count {
                return Err(Error::corrupt(
                    format!("descriptor block {block} is beyond the end"),
                    format!("group {g}"),
                ));
            }
            let buf = cache.get(block)?;
            let data = buf.read();
            let raw = &data[off..off + geo.desc_size];
            let gd = GroupDesc::parse(raw, geo.desc_size);
            for (what, b) in [
                ("block bitmap", gd.bg_block_bitmap),
                ("inode bitmap", gd.bg_inode_bitmap),
                ("inode table", gd.bg_inode_table),
            ] {
                if b < geo.first_data_block as u64 || b >= geo.blocks_count {
                    return Err(Error::corrupt(
                        format!("{what} at block {b} lies outside the filesystem"),
                        format!("group {g}"),
                    ));
                }
            }
            let itable_blocks = (geo.inodes_per_group as u64 * geo.inode_size as u64).div_ceil(geo.block_size as u64);
            if gd.bg_inode_table + itable_blocks > geo.blocks_count {
                return Err(Error::corrupt("inode table runs past the end of the filesystem", format!("group {g}")));
            }
            groups.push(RwLock::new(gd));
        }
        Ok(groups)
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub fn superblock(&self) -> Superblock {
        self.sb.read().clone()
    }

    pub fn group_desc(&self, group: u32) -> Option<GroupDesc> {
        self.groups.get(group as usize).map(|g| g.read().clone())
    }

    /// What an error does to this filesystem (the `errors=` option, else the
    /// superblock's default).
    pub fn errors_behaviour(&self) -> Errors {
        self.errors.behaviour
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only || self.errors.state.load(std::sync::atomic::Ordering::SeqCst) == ERROR_READ_ONLY
    }

    /// EIO for a durability request (fsync, sync) refused by the error state.
    pub(crate) fn error_state_eio(&self) -> Error {
        let why = self.errors.reason.get().map_or("the filesystem is in its error state", |s| s.as_str());
        Error::Io(std::io::Error::other(format!("filesystem error state: {why}")))
    }

    /// Whether an error put the filesystem in its error state (see `Errors`).
    pub fn has_failed(&self) -> bool {
        self.errors.state.load(std::sync::atomic::Ordering::SeqCst) != ERROR_NONE
    }

    /// An operation failed in a way that cannot be undone (a handle ended after
    /// dirtying buffers without `finish`): abort the journal, so the half-done
    /// change never commits, and enter the error state.
    pub(crate) fn fail_operation(&self, why: &str) {
        match self.journal.as_ref() {
            Some(journal) => journal.abort(why),
            None => record_error(&self.cache, &self.sb, &self.errors, why, false),
        }
    }

    /// Without a journal: tells the write-back thread the dirty list has grown.
    pub(crate) fn writeback_kick(&self) {
        if let Some(w) = self.writeback.as_ref() {
            if self.cache.dirty_pressure() {
                w.kick();
            }
        }
    }

    /// The physical block behind each block of the journal inode.
    fn journal_block_map(&self) -> Result<Vec<u64>> {
        let jino = self.sb.read().s_journal_inum;
        if jino == 0 {
            return Err(Error::unsupported("writing through an external journal device"));
        }
        let inode = self.inode(jino)?;
        let bs = self.geo.block_size as u64;
        let count = inode.i_size / bs;
        let mut map = Vec::with_capacity(count as usize);
        let mut lblk = 0;
        while lblk < count {
            let m = self.map_blocks(jino, &inode, lblk, count - lblk)?;
            match m.kind {
                crate::extent::MapKind::Mapped(p) => map.extend((0..m.len).map(|i| p + i)),
                _ => {
                    return Err(Error::corrupt(format!("journal has a hole at block {lblk}"), format!("inode {jino}")))
                }
            }
            lblk += m.len;
        }
        Ok(map)
    }

    /// Who else held the image when it was opened read-only (a uext4 mount, the
    /// kernel): what is read may be stale or caught half-changed.
    pub fn in_use(&self) -> Option<String> {
        self.cache.device().in_use()
    }

    pub fn read_only_reason(&self) -> &str {
        match self.errors.reason.get() {
            Some(why) if self.is_read_only() && !self.read_only => why,
            _ => &self.read_only_reason,
        }
    }

    /// Damage found at open that a read-only open goes on with, if any.
    pub fn damage_at_open(&self) -> Option<&str> {
        self.damage_at_open.as_deref()
    }

    /// How many blocks the journal replay (in memory) supplied at open; 0 if none.
    pub fn replayed_journal_blocks(&self) -> usize {
        self.replayed_journal_blocks
    }

    pub fn cache(&self) -> &BufferCache {
        &self.cache
    }

    /// Checks that `block` (found in metadata of `what`) lies inside the filesystem.
    pub(crate) fn check_block(&self, block: u64, what: &dyn Fn() -> String) -> Result<()> {
        if block < self.geo.first_data_block as u64 || block >= self.geo.blocks_count {
            return Err(Error::corrupt(
                format!("block {block} lies outside the filesystem (0..{})", self.geo.blocks_count),
                what(),
            ));
        }
        Ok(())
    }

    /// The inode, parsed and checksum-verified once, then cached.
    pub fn inode(&self, ino: u32) -> Result<Arc<Inode>> {
        if ino == 0 || ino > self.geo.inodes_count {
            return Err(Error::corrupt(
                format!("inode number {ino} is out of range 1..={}", self.geo.inodes_count),
                "inode reference",
            ));
        }
        let shard = &self.inode_cache[ino as usize % INODE_CACHE_SHARDS];
        if let Some(i) = shard.lock().get(&ino) {
            return Ok(i.clone());
        }
        self.read_inode_from_table(ino)
    }

    /// Makes `inode` the cached copy of `ino` (after a write).
    pub(crate) fn cache_inode(&self, ino: u32, inode: Inode) -> Arc<Inode> {
        let inode = Arc::new(inode);
        let mut s = self.inode_cache[ino as usize % INODE_CACHE_SHARDS].lock();
        if s.len() >= self.inode_cache_shard_capacity {
            // Crude but bounded: drop the shard; parsed inodes are cheap to rebuild
            // from the buffer cache, which keeps their table blocks.
            s.clear();
        }
        s.insert(ino, inode.clone());
        inode
    }

    /// Parses an inode from its table block and caches it while still holding the
    /// block's read lock, so a concurrent write_inode (which needs the write lock)
    /// cannot have its newer copy replaced by this older one.
    fn read_inode_from_table(&self, ino: u32) -> Result<Arc<Inode>> {
        let group = (ino - 1) / self.geo.inodes_per_group;
        let index = (ino - 1) % self.geo.inodes_per_group;
        let gd = self.groups[group as usize].read().clone();
        if gd.bg_flags & EXT4_BG_INODE_UNINIT != 0 && self.geo.gd_csum != GdCsum::None {
            return Err(Error::corrupt(
                format!("inode {ino} lies in uninitialized group {group}"),
                format!("inode {ino}"),
            ));
        }
        let byte = index as u64 * self.geo.inode_size as u64;
        let block = gd.bg_inode_table + byte / self.geo.block_size as u64;
        let off = (byte % self.geo.block_size as u64) as usize;
        let buf = self.cache.get(block)?;
        let data = buf.read();
        let slot = &data[off..off + self.geo.inode_size];
        let inode = Inode::parse(slot).map_err(|e| match e {
            Error::Corrupt { what, .. } => Error::corrupt(what, format!("inode {ino}")),
            e => e,
        })?;
        if self.geo.metadata_csum && self.geo.verify_checksums {
            inode.verify_checksum(ino, self.geo.csum_seed)?;
        }
        Ok(self.cache_inode(ino, inode))
    }

    /// Per-inode checksum seed for its extent, directory and htree blocks.
    pub(crate) fn inode_seed(&self, ino: u32, inode: &Inode) -> u32 {
        crate::format::inode::inode_csum_seed(self.geo.csum_seed, ino, inode.i_generation)
    }

    /// Writable open of an image whose journal needs recovery: the replayed blocks
    /// go home, the journal is marked empty and needs_recovery is cleared, in that
    /// order, each step flushed (a crash in between just recovers again).
    fn recover_journal_home(dev: &Arc<dyn BlockDevice>, sb: &Superblock, opts: &Options) -> Result<Superblock> {
        let (blocks, next_sequence) = Self::replay_journal_in_memory(dev, sb, opts)?;
        let before_replay = sb;
        let bs = sb.block_size() as u64;
        for (block, data) in &blocks {
            dev.write_at(block * bs, data)?;
        }
        dev.flush()?;
        let probe = Self::finish_open(dev.clone(), sb.clone(), opts.clone(), true, String::new(), 0)?;
        let jino = sb.s_journal_inum;
        let jinode = probe.inode(jino)?;
        let crate::extent::MapKind::Mapped(jsb_block) = probe.map_blocks(jino, &jinode, 0, 1)?.kind else {
            return Err(Error::corrupt("journal has no superblock block", format!("inode {jino}")));
        };
        let mut raw = vec![0u8; bs as usize];
        dev.read_at(jsb_block * bs, &mut raw)?;
        let mut jsb = crate::format::journal::JournalSuperblock::parse(&raw)?;
        jsb.s_start = 0;
        jsb.s_sequence = next_sequence;
        dev.write_at(jsb_block * bs, &jsb.to_bytes())?;
        dev.flush()?;
        let mut raw_sb = [0u8; SUPERBLOCK_SIZE];
        dev.read_at(SUPERBLOCK_OFFSET, &mut raw_sb)?;
        let mut sb = Superblock::parse(&raw_sb, !opts.ignore_checksums)?;
        sb.s_feature_incompat &= !INCOMPAT_RECOVER;
        // The journal's copy of the superblock predates any error recorded since:
        // keep the record, as the kernel's ext4_load_journal does.
        sb.keep_error_info(before_replay);
        dev.write_at(SUPERBLOCK_OFFSET, &sb.to_bytes())?;
        dev.flush()?;
        Ok(sb)
    }

    fn replay_journal_in_memory(
        dev: &Arc<dyn BlockDevice>,
        sb: &Superblock,
        opts: &Options,
    ) -> Result<(std::collections::BTreeMap<u64, Vec<u8>>, u32)> {
        // The journal inode is read through a temporary read-only filesystem on the
        // unreplayed image: its blocks are not themselves journaled.
        let probe = Self::finish_open(dev.clone(), sb.clone(), opts.clone(), true, String::new(), 0)?;
        probe.journal_replay_blocks()
    }
}

/// Whether `group` carries a superblock backup: group 0 and 1 always, and with
/// sparse_super only powers of 3, 5 and 7 (and the sparse_super2 pair).
pub fn group_has_superblock(sb: &Superblock, group: u32) -> bool {
    if group == 0 {
        return true;
    }
    if sb.has_compat(COMPAT_SPARSE_SUPER2) {
        return group == sb.s_backup_bgs[0] || group == sb.s_backup_bgs[1];
    }
    if group <= 1 || !sb.has_ro_compat(RO_COMPAT_SPARSE_SUPER) {
        return true;
    }
    if group.is_multiple_of(2) {
        return false;
    }
    [3u32, 5, 7].iter().any(|&base| {
        let mut n = base;
        while n < group {
            n = match n.checked_mul(base) {
                Some(v) => v,
                None => return false,
            };
        }
        n == group
    })
}

impl Filesystem {
    /// Writes the superblock's counters and every change home (through the journal
    /// when there is one, leaving it empty), then flushes the device.
    pub fn sync(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        if self.is_read_only() {
            return Err(self.error_state_eio());
        }
        self.compact_split_extent_trees()?;
        {
            // The handle first: beginning one may wait for a commit, and the journal
            // thread takes the superblock lock.
            let mut tx = self.begin(1)?;
            // The orphans lock before the superblock's (ns/orphan.rs): orphan_present
            // goes once the orphan file is empty, as at the kernel's clean unmount.
            let orphans = self.orphans.lock();
            let mut sb = self.sb.write();
            sb.s_free_blocks_count = self.free_blocks();
            sb.s_free_inodes_count = self.free_inodes() as u32;
            sb.s_wtime = crate::clock::coarse_seconds();
            if Self::orphan_file_in_use(&orphans) == Some(false) {
                sb.s_feature_ro_compat &= !RO_COMPAT_ORPHAN_PRESENT;
            }
            self.stage_superblock(&mut tx, &sb)?;
            drop(sb);
            drop(orphans);
            tx.finish()?;
        }
        match self.journal.as_ref() {
            // Through the log, then home: the image is then consistent without it.
            Some(journal) => journal.checkpoint_all(),
            None => self.cache.flush(),
        }
    }
}

impl Filesystem {
    /// Packs the extent trees whose nodes split since the last sync or commit
    /// (see `extent::write`). The caller holds no inode lock.
    pub(crate) fn compact_split_extent_trees(&self) -> Result<()> {
        let to_compact: Vec<u32> = self.extent_compact.lock().drain().collect();
        for ino in to_compact {
            let _lock = self.inode_locks.lock(ino as u64);
            let mut inode = (*self.inode(ino)?).clone();
            if inode.i_links_count == 0 {
                continue;
            }
            let mut tx = self.begin(16)?;
            self.compact_extent_tree(&mut tx, ino, &mut inode)?;
            self.write_inode(&mut tx, ino, &inode)?;
            tx.finish()?;
        }
        Ok(())
    }
}

impl Filesystem {
    /// Closes without writing anything back, as a crash would: what the journal
    /// committed survives, the rest is lost. For crash tests.
    pub fn abandon(mut self) {
        self.read_only = true;
        // The journal thread and the write-back thread stop where they are.
        if let Some(journal) = self.journal.as_ref() {
            journal.shutdown();
        }
        self.writeback.take();
    }
}

impl Drop for Filesystem {
    fn drop(&mut self) {
        if !self.is_read_only() {
            if let Err(e) = self.sync() {
                eprintln!("uext4: writing back on close failed: {e}");
            }
        }
        if let Some(journal) = self.journal.as_ref() {
            journal.shutdown();
        }
        self.writeback.take();
    }
}
