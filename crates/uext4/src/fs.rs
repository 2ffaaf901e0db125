//! `Filesystem`: the façade over the layers — an opened ext4 image and the
//! operations on it.
//!
//! `Filesystem` is `Send + Sync` and every operation takes `&self`; state that
//! changes lives behind its own lock, taken in the order of docs/ARCHITECTURE.md.
//! Opening reads and checks the superblock, builds the `Volume` (device, cache,
//! geometry, superblock, group descriptors) and the `Allocator` on it; a writable
//! open also checks what the kernel checks before a read-write mount
//! (descriptors, bitmaps against their counts, orphan records) before it writes
//! anything, then starts the journal (or the write-back thread). The journal sees
//! the filesystem only through `JournalView`.
//!
//! The upper layers (`inodes`, `extent`, `dir`, `file`, `xattr`, `inline`, `ns`)
//! add `impl Filesystem` blocks for their part; the lower ones (`volume`,
//! `alloc`, `journal`, `cache`, `dev`) know nothing of it.

use crate::alloc::{ActingAs, Allocator, MainlinePolicy, Owner};
use crate::cache::BufferCache;
use crate::dev::{BlockDevice, FileDevice, OverlayDevice};
use crate::error::{Error, ErrorSite, Result};
use crate::format::group_desc::GroupDesc;
use crate::format::inode::Inode;
use crate::format::superblock::*;
use crate::journal::handle::Handle;
use crate::volume::{ErrorState, Volume};
use parking_lot::{Mutex, RwLock};
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

pub use crate::volume::{group_has_superblock, Errors, Geometry};

pub(crate) const INODE_CACHE_SHARDS: usize = 16;

/// How to open a filesystem. `Default` opens read-only with a 256 MiB cache and
/// the kernel's defaults; set `read_only: false` to change it.
///
/// ```
/// let opts = uext4::Options { read_only: false, cache_mb: 64, ..uext4::Options::default() };
/// assert!(!opts.read_only);
/// ```
#[derive(Clone, Debug)]
pub struct Options {
    /// Open without writing anything (the default); a journal that needs recovery
    /// is replayed in memory only.
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
    /// Directory inode reservation (seed 000; `alloc::dir_ireserve`): inode
    /// slots kept for each new directory's files. Off by default.
    pub dir_ireserve: crate::alloc::DirReserve,
    /// Inode goals from the name hash in indexed directories (seed 003;
    /// `alloc::hash_goal`). Off by default.
    pub hash_goal: bool,
    /// Parallel directory operations (seed 002; `ns::pdirops`): changes in an
    /// indexed directory lock the names they touch, not the whole directory.
    /// On by default.
    pub pdirops: bool,
    /// Inline data for new inodes (seed 004; `inline`): on an image with the
    /// inline_data feature, new directories and files whose first write fits are
    /// kept in the inode, as the kernel keeps them. On by default; no effect on
    /// images without the feature.
    pub inline_data: bool,
    /// Sees every device request, sorted by what it holds and priced on model
    /// disks (`dev::io_model`); for benchmarks. The model may outlive the
    /// filesystem (a reopen keeps counting).
    #[doc(hidden)]
    pub io_model: Option<Arc<crate::dev::IoModel>>,
    /// Where on the device the filesystem lies: all of it, from a byte offset,
    /// or in partition N of an MBR or GPT table. Nothing outside it is read
    /// or written.
    pub region: crate::dev::Region,
    /// A writable open of an image with a journal writes home directly and
    /// leaves the journal empty, as mkfs.ext4 -d and libext2fs do: no crash
    /// safety, but no log writes and nothing in the image that depends on when
    /// commits happened (reproducible images, image building).
    pub bypass_journal: bool,
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
            dir_ireserve: crate::alloc::DirReserve::Off,
            hash_goal: false,
            pdirops: true,
            inline_data: true,
            io_model: None,
            region: crate::dev::Region::Whole,
            bypass_journal: false,
        }
    }
}

/// One shard of the parsed-inode cache, alone on its cache lines.
pub(crate) type InodeCacheShard = crate::padded::CachePadded<Mutex<crate::number_map::NumberMap<u32, Arc<Inode>>>>;

/// An opened ext4 filesystem: every operation takes `&self`, from any thread
/// (see the crate's examples). Dropping it writes everything back (as
/// [`Filesystem::sync`]) and lets go of the image.
pub struct Filesystem {
    /// The device, cache, geometry, superblock, descriptors, journal and error state.
    pub(crate) vol: Arc<Volume>,
    pub(crate) alloc: Arc<Allocator>,
    /// Parsed inodes (inodes.rs), sharded by inode number.
    pub(crate) inode_cache: Vec<InodeCacheShard>,
    pub(crate) inode_cache_shard_capacity: usize,
    /// Set when the journal needed recovery at open (see `replayed_journal_blocks`).
    pub(crate) replayed_journal_blocks: usize,
    /// Inodes whose extent tree split a node since the last sync: sync packs their
    /// trees again (see `extent::write`).
    pub(crate) extent_compact: Mutex<std::collections::HashSet<u32>>,
    /// The runtime tunable extent_zeroout_len (see `tunables`).
    pub(crate) extent_zeroout_len: std::sync::atomic::AtomicU32,
    /// Open-time tunables, kept to report them.
    pub(crate) commit_interval_secs: u64,
    pub(crate) cache_mb: usize,
    pub(crate) dir_ireserve: crate::alloc::DirReserve,
    pub(crate) hash_goal: bool,
    /// Open handles per inode: an unlinked inode lives until its last close.
    pub(crate) open_files: crate::number_map::ShardedMap<u32>,
    /// Files made without a name (`create_tmpfile`) that `link` may still give
    /// one: the kernel's I_LINKABLE, cleared by the link or the last close.
    pub(crate) linkable: Mutex<std::collections::HashSet<u32>>,
    /// The orphan chain and orphan file as recorded on disk (ns/orphan.rs).
    pub(crate) orphans: Mutex<crate::ns::orphan::Orphans>,
    /// The rename lock (lock order level 1): only cross-directory renames take it.
    pub(crate) rename_lock: Mutex<()>,
    /// pdirops (seed 002): indexed directories take their changes by name.
    pub(crate) pdirops: bool,
    /// The inline_data option as given, and whether it acts (the image has the feature).
    pub(crate) inline_data: bool,
    pub(crate) inline_on: bool,
    /// New regular files never written yet: the kernel's EXT4_STATE_MAY_INLINE_DATA,
    /// which lets a first write that fits make the file inline (inline/file.rs).
    pub(crate) may_inline: crate::number_map::ShardedMap<()>,
    /// Directory locks (level 2a), by directory inode: shared by pdirops changes
    /// in an indexed directory, exclusive for every other change of its names.
    pub(crate) dir_locks: crate::locks::RwLockTable,
    /// Name locks (level 2b), by (directory, hash slot of the name): what two
    /// pdirops changes of one name meet on (exclusive), and what a lookup waits
    /// on (shared) so that it sees a change of its name whole (ns/pdirops.rs).
    pub(crate) name_locks: crate::locks::RwLockTable,
    /// Subdirectory-link locks (level 2c), by directory inode: on images without
    /// dir_nlink, what a new subdirectory's check of its parent's link limit and
    /// the count's change happen under together (ns/change.rs).
    pub(crate) subdir_link_locks: crate::locks::LockTable,
    /// Inode locks (level 3), by inode number: exclusive to change an inode,
    /// shared by changes of a directory's names (which only touch its times and
    /// link count, under `attr_locks`).
    pub(crate) inode_locks: crate::locks::RwLockTable,
    /// A directory inode's short attribute updates (level 5b): times, link count
    /// and, from a change holding its structure lock for writing, size and map.
    pub(crate) attr_locks: crate::locks::LockTable,
    /// Directory structure locks (level 5), by directory inode: read to look up or
    /// list, write to change the directory's blocks, index or size, so that no
    /// reader sees a split or a conversion half made (dir/mod.rs).
    pub(crate) dir_structure: crate::locks::RwLockTable,
}

/// What the journal sees of the filesystem (`JournalOwner`): the superblock, the
/// cache, the error state and the allocator's commit callback, never a whole
/// `Filesystem`. The allocator is held weakly: it holds the volume, which holds
/// the journal, which holds this view.
struct JournalView {
    cache: Arc<BufferCache>,
    sb: Arc<RwLock<Superblock>>,
    alloc: std::sync::Weak<Allocator>,
    geo: Geometry,
    errors: Arc<ErrorState>,
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

    fn committed(&self, tid: u64) {
        if let Some(alloc) = self.alloc.upgrade() {
            alloc.committed(tid);
        }
    }

    fn aborted(&self, site: ErrorSite, why: &str) {
        self.errors.record(&self.cache, &self.sb, site, why, true);
    }

    fn error_from_previous_mount(&self, errno: i32) {
        self.errors.mark_from_previous_mount(&self.cache, &self.sb, errno);
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
    /// Opens an image file or block device. A writable open holds the exclusive
    /// lock of the image's bytes its filesystem lies in (`Options::region`)
    /// until the filesystem is dropped, and is refused (`Error::Busy`) while the
    /// kernel or another uext4 process holds any of them; a read-only open is
    /// not, and `in_use` says who else held them.
    ///
    /// # Errors
    /// `Busy` when a writable open finds the image held (another uext4 process, the kernel); `Io` when
    /// it cannot be opened or read; `Corrupt` for a damaged superblock, descriptors or journal;
    /// `Unsupported` for features this build does not handle (named); `Invalid` when `Options::region`
    /// names no part of the image; `ReadOnly` when a writable open is refused (an image the kernel
    /// would only mount read-only).
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Filesystem> {
        let dev = FileDevice::open_region(path.as_ref(), !opts.read_only, opts.region)?;
        Self::open_device(Arc::new(dev), opts)
    }

    /// Opens the filesystem on any [`BlockDevice`]: a memory image, a partition, a
    /// device with fault injection.
    ///
    /// # Errors
    /// As [`Filesystem::open`], less the image lock (the caller owns `dev`).
    pub fn open_device(dev: Arc<dyn BlockDevice>, opts: Options) -> Result<Filesystem> {
        let dev = crate::dev::BoundedDevice::open(dev, opts.region)?;
        let dev: Arc<dyn BlockDevice> = match &opts.io_model {
            Some(model) => Arc::new(crate::dev::TracedDevice::new(dev, model.clone())),
            None => dev,
        };
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        if dev.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
            return Err(Error::corrupt(
                format!("image of {} bytes is too small to hold a superblock (truncated?)", dev.size()),
                "device",
            ));
        }
        dev.read_at(SUPERBLOCK_OFFSET, &mut raw)?;
        let sb = Superblock::parse(&raw, !opts.ignore_checksums).map_err(|e| match e {
            // A whole-disk image (a VM disk) has its filesystems in partitions.
            Error::Corrupt { what, location }
                if opts.region == crate::dev::Region::Whole
                    && crate::dev::starts_with_partition_table(dev.as_ref()) =>
            {
                Error::Corrupt {
                    what: format!(
                        "{what}; the image starts with a partition table: name one of its partitions \
                         (--partition N)"
                    ),
                    location,
                }
            }
            // The superblock's place is the region's, not the image's: say so.
            Error::Corrupt { what, location } => {
                let location = match opts.region {
                    crate::dev::Region::Whole => location,
                    crate::dev::Region::Offset(at) => {
                        format!("{location} of the filesystem asked for at byte {at} of the image")
                    }
                    crate::dev::Region::Partition(n) => format!("{location} of partition {n}"),
                };
                Error::Corrupt { what, location }
            }
            e => e,
        })?;

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
        // Named: bigalloc (uext4 allocates blocks, not clusters), quota, verity...
        let unknown_ro_names = || {
            let named: Vec<&str> =
                FEATURE_NAMES.iter().filter(|&&(w, bit, _)| w == 2 && bit & unknown_ro != 0).map(|f| f.2).collect();
            let unnamed = unknown_ro & !FEATURE_NAMES.iter().filter(|f| f.0 == 2).fold(0, |m, f| m | f.1);
            match unnamed {
                0 => named.join(", "),
                bits => format!("{} (bits {bits:#x})", named.join(", ")),
            }
        };
        if unknown_ro != 0 && !read_only {
            return Err(Error::unsupported(format!(
                "writing with read-only-compatible feature(s) {} (bits {unknown_ro:#x}); open read-only",
                unknown_ro_names()
            )));
        }
        if unknown_ro != 0 {
            reason = format!("opened read-only: uext4 does not write feature(s) {}", unknown_ro_names());
            read_only = true;
        }
        check_device_size(dev.as_ref(), &sb)?;

        let mut dev = dev;
        let mut replayed = 0;
        if sb.has_incompat(INCOMPAT_RECOVER) && sb.has_compat(COMPAT_HAS_JOURNAL) {
            if !read_only {
                let (sb, replayed) = Self::recover_journal_home(&dev, &sb, &opts)?;
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
        let geo = Geometry::of(&sb, !opts.ignore_checksums);
        let inline_on = opts.inline_data && geo.has_inline_data;
        let vol = Arc::new(Volume::open(dev, sb, geo, opts.cache_mb, opts.errors, read_only, reason)?);
        let policy = match read_only {
            true => Box::new(MainlinePolicy),
            false => crate::alloc::policy_for(&vol, opts.dir_ireserve, opts.hash_goal)?,
        };
        let alloc = Arc::new(Allocator::new(vol.clone(), policy));
        let shard_capacity = (opts.inode_cache_entries / INODE_CACHE_SHARDS).max(16);
        let fs = Filesystem {
            vol,
            alloc,
            extent_compact: Mutex::new(std::collections::HashSet::new()),
            extent_zeroout_len: std::sync::atomic::AtomicU32::new(opts.extent_zeroout_len),
            commit_interval_secs: opts.commit_interval_secs,
            cache_mb: opts.cache_mb,
            dir_ireserve: opts.dir_ireserve,
            hash_goal: opts.hash_goal,
            open_files: Default::default(),
            linkable: Mutex::new(std::collections::HashSet::new()),
            orphans: Mutex::new(Default::default()),
            rename_lock: Mutex::new(()),
            pdirops: opts.pdirops,
            inline_data: opts.inline_data,
            inline_on,
            may_inline: Default::default(),
            dir_locks: crate::locks::RwLockTable::default(),
            name_locks: crate::locks::RwLockTable::default(),
            inode_locks: crate::locks::RwLockTable::default(),
            attr_locks: crate::locks::LockTable::default(),
            subdir_link_locks: crate::locks::LockTable::default(),
            dir_structure: crate::locks::RwLockTable::default(),
            inode_cache: (0..INODE_CACHE_SHARDS).map(|_| Default::default()).collect(),
            inode_cache_shard_capacity: shard_capacity,
            replayed_journal_blocks,
        };
        if let Err(e) = fs.check_root().and_then(|()| fs.prepare_writes(&opts)) {
            // Refused: nothing may be written back, dropping it included.
            fs.vol.make_read_only();
            return Err(e);
        }
        Ok(fs)
    }

    /// As the kernel's ext4_fill_super ("corrupt root inode, run e2fsck"): a
    /// root that is not a live directory refuses the open, writable or not,
    /// rather than every path failing later with a misleading error. A root
    /// that cannot be read at all is left to the checks that name why (a bad
    /// descriptor, a checksum) and to the walks that meet it.
    fn check_root(&self) -> Result<()> {
        if self.vol.check_descriptors().is_err() {
            return Ok(());
        }
        let Ok(root) = self.inode(crate::ns::ROOT_INO) else { return Ok(()) };
        if !root.is_dir()
            || root.i_links_count == 0
            || root.i_size == 0 && !root.has_flag(crate::format::inode::EXT4_INLINE_DATA_FL)
        {
            return Err(Error::corrupt(
                format!(
                    "the root is not a directory with contents (mode {:o}, {} links, {} bytes)",
                    root.i_mode, root.i_links_count, root.i_size
                ),
                "inode 2",
            ));
        }
        Ok(())
    }

    /// What a writable open does before it hands the filesystem out: check the group
    /// descriptors, load the journal, finish the orphans of a previous session.
    fn prepare_writes(&self, opts: &Options) -> Result<()> {
        if self.vol.opened_read_only() {
            // An I/O model still wants to know the journal's blocks (a benchmark
            // opens an image read-only to classify another writer's requests);
            // an unreadable journal only leaves them unclassified.
            if opts.io_model.is_some() && self.vol.sb.read().has_compat(COMPAT_HAS_JOURNAL) {
                if let Ok(map) = self.journal_block_map() {
                    self.vol.register_journal_blocks(&map);
                }
            }
            return Ok(());
        }
        // New hash indexes take the default hash version: one e2fsck and the kernel
        // do not know would make every directory uext4 indexes unreadable to them.
        let hash = self.vol.geo.def_hash_version;
        if self.vol.geo.has_dir_index && hash > 2 {
            return Err(Error::corrupt(format!("default directory hash version {hash} is unknown"), "superblock"));
        }
        self.vol.check_descriptors()?;
        self.check_bad_block_list()?;
        self.alloc.check_block_bitmaps()?;
        // Orphans a previous session (uext4's or the kernel's) left in the chain or
        // the orphan file are checked before the journal is loaded (which writes its
        // superblock): a refused open must leave every byte as it was. They are
        // freed once the journal is ready.
        let orphans = self.pending_orphans()?;
        let interval = std::time::Duration::from_secs(opts.commit_interval_secs.max(1));
        let vol = &self.vol;
        if vol.sb.read().has_compat(COMPAT_HAS_JOURNAL) && opts.bypass_journal {
            // The journal's blocks stay metadata (never allocated, classified);
            // the log itself is left as the open found it: empty.
            vol.register_journal_blocks(&self.journal_block_map()?);
            vol.set_writeback(vol.cache.start_writeback(interval)?);
        } else if vol.sb.read().has_compat(COMPAT_HAS_JOURNAL) {
            let map = self.journal_block_map()?;
            vol.register_journal_blocks(&map);
            let view = Arc::new(JournalView {
                cache: vol.cache.clone(),
                sb: vol.sb.clone(),
                alloc: Arc::downgrade(&self.alloc),
                geo: vol.geo.clone(),
                errors: vol.errors.clone(),
            });
            let (want_64bit, want_csum) = {
                let sb = vol.sb.read();
                (sb.is_64bit(), sb.has_metadata_csum())
            };
            vol.set_journal(crate::journal::log::Journal::load(
                map,
                vol.cache.clone(),
                view,
                interval,
                want_64bit,
                want_csum,
            )?);
        } else {
            vol.set_writeback(vol.cache.start_writeback(interval)?);
        }
        if !orphans.is_empty() {
            self.process_orphans(&orphans)?;
        }
        // As the kernel's ext4_setup_super: the open goes on, with a word to the user.
        if vol.sb.read().s_state & EXT4_ERROR_FS != 0 {
            eprintln!("uext4: warning: opening a filesystem with errors for writing; running e2fsck -f is recommended");
        }
        Ok(())
    }

    /// The bad-block inode (1) lists blocks never to be used. One listing group
    /// metadata (a bitmap or an inode table on a bad block) leaves nothing safe to
    /// write until e2fsck relocates it: the writable open is refused.
    fn check_bad_block_list(&self) -> Result<()> {
        const BAD_BLOCKS_INO: u32 = 1;
        let inode = self.inode(BAD_BLOCKS_INO)?;
        if inode.i_blocks == 0 || inode.has_flag(crate::format::inode::EXT4_INLINE_DATA_FL) {
            return Ok(());
        }
        let spb = self.vol.geo.block_size as u64 / 512;
        let listed = inode.i_blocks / spb;
        let reach = self.block_map_reach();
        let (mut lblk, mut seen) = (0, 0);
        while seen < listed && lblk < reach {
            let m = self.map_blocks(BAD_BLOCKS_INO, &inode, lblk, reach - lblk)?;
            if let crate::extent::MapKind::Mapped(p) = m.kind {
                self.vol.check_metadata_free_range(p, m.len, &|| "the bad block list (inode 1)".to_string())?;
                seen += m.len;
            }
            lblk += m.len;
        }
        Ok(())
    }

    #[doc(hidden)]
    /// Where group `group`'s descriptor lives: (block, byte offset in it).
    pub fn group_desc_location(sb: &Superblock, group: u32) -> (u64, usize) {
        crate::volume::group_desc_location(sb, group)
    }

    #[doc(hidden)]
    pub fn geometry(&self) -> &Geometry {
        &self.vol.geo
    }

    #[doc(hidden)]
    /// The storage under the filesystem (device, cache, superblock, descriptors,
    /// journal): what the lower layers are built on.
    pub fn volume(&self) -> &Arc<Volume> {
        &self.vol
    }

    #[doc(hidden)]
    pub fn superblock(&self) -> Superblock {
        self.vol.sb.read().clone()
    }

    #[doc(hidden)]
    pub fn group_desc(&self, group: u32) -> Option<GroupDesc> {
        self.vol.groups.get(group as usize).map(|g| g.read().clone())
    }

    /// What an error does to this filesystem (the `errors=` option, else the
    /// superblock's default).
    pub fn errors_behaviour(&self) -> Errors {
        self.vol.errors.behaviour()
    }

    /// Whether changes are refused: a read-only open, one forced read-only (see
    /// `read_only_reason`), or an error that made the filesystem read-only.
    pub fn is_read_only(&self) -> bool {
        self.vol.is_read_only()
    }

    /// Whether an error put the filesystem in its error state (see `Errors`).
    pub fn has_failed(&self) -> bool {
        self.vol.errors.has_failed()
    }

    #[doc(hidden)]
    /// Something outside the library (a frontend's bug, a panic between requests)
    /// has left the filesystem's state in doubt: abort the journal, so nothing
    /// not yet committed becomes durable, and enter the error state, as the
    /// kernel does when a filesystem path hits a bug.
    pub fn fail(&self, why: &str) {
        self.vol.fail_operation(ErrorSite { func: "frontend_failure", errno: 0 }, why);
    }

    #[doc(hidden)]
    /// Starts a handle for a change touching up to `credits` metadata blocks (see
    /// journal/handle.rs). Outside any handle, when space is short and blocks freed
    /// by uncommitted transactions would relieve it, their commit lands first.
    ///
    /// # Errors
    /// `ReadOnly` when the filesystem is read-only or in its error state.
    pub fn begin(&self, credits: u32) -> Result<Handle<'_>> {
        if let Some(journal) = self.vol.journal() {
            let outside_handles = crate::journal::log::HANDLES_HELD.with(|h| h.get()) == 0;
            if outside_handles && !self.vol.is_read_only() && self.alloc.frees_wanted() {
                journal.commit_all()?;
            }
        }
        self.vol.begin(credits)
    }

    /// Free blocks now (the reserved ones included).
    pub fn free_blocks(&self) -> u64 {
        self.alloc.free_blocks()
    }

    /// Free inodes now.
    pub fn free_inodes(&self) -> u64 {
        self.alloc.free_inodes()
    }

    #[doc(hidden)]
    /// The inode windows directories hold now (`dir_ireserve`), by directory.
    pub fn inode_windows(&self) -> Vec<(u32, crate::alloc::Window)> {
        self.alloc.policy().windows()
    }

    #[doc(hidden)]
    /// The hash span of directory `dir` (`hash_goal`), if one is in memory.
    pub fn hash_span(&self, dir: u32) -> Option<crate::alloc::hash_goal::Span> {
        self.alloc.policy().hash_span(dir)
    }

    /// Makes the calling thread act as `who` until the guard drops: a privileged
    /// caller may take the reserved blocks. Operations that create an inode act as
    /// its owner for their own duration.
    pub fn acting_as(&self, who: Owner) -> ActingAs {
        crate::alloc::acting_as(who)
    }

    #[doc(hidden)]
    /// Whether `who` may take the reserved blocks.
    pub fn may_use_reserved(&self, who: Owner) -> bool {
        self.alloc.may_use_reserved(who)
    }

    /// The physical block behind each block of the journal inode.
    fn journal_block_map(&self) -> Result<Vec<u64>> {
        let jino = self.vol.sb.read().s_journal_inum;
        if jino == 0 {
            return Err(Error::unsupported("writing through an external journal device"));
        }
        let inode = self.inode(jino)?;
        let bs = self.vol.geo.block_size as u64;
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
        self.vol.cache.device().in_use()
    }

    /// Why a writable open was made read-only (an unknown ro_compat feature, a
    /// descriptor checksum...); empty when it was not.
    pub fn read_only_reason(&self) -> &str {
        self.vol.read_only_reason()
    }

    #[doc(hidden)]
    /// Damage found at open that a read-only open goes on with, if any.
    pub fn damage_at_open(&self) -> Option<&str> {
        self.vol.damage_at_open()
    }

    #[doc(hidden)]
    /// How many blocks journal recovery supplied at open (in memory for a
    /// read-only open, written home for a writable one); 0 if none was needed.
    pub fn replayed_journal_blocks(&self) -> usize {
        self.replayed_journal_blocks
    }

    #[doc(hidden)]
    pub fn cache(&self) -> &BufferCache {
        &self.vol.cache
    }

    /// Writable open of an image whose journal needs recovery: the replayed blocks
    /// go home, the journal is marked empty and needs_recovery is cleared, in that
    /// order, each step flushed (a crash in between just recovers again).
    /// Returns the superblock and how many blocks went home.
    fn recover_journal_home(
        dev: &Arc<dyn BlockDevice>,
        sb: &Superblock,
        opts: &Options,
    ) -> Result<(Superblock, usize)> {
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
        Ok((sb, blocks.len()))
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

impl Filesystem {
    /// Drops the cached metadata blocks that are clean and held by nobody, as
    /// the kernel's drop_caches does: later accesses read them from the device
    /// again (for cold-cache measurements, and for tests that need reads to
    /// happen). Parsed inodes stay cached. Returns how many blocks went.
    pub fn drop_caches(&self) -> usize {
        self.vol.cache.drop_clean()
    }

    /// Writes the superblock's counters and every change home (through the journal
    /// when there is one, leaving it empty), then flushes the device.
    ///
    /// # Errors
    /// `Io` (EIO) once the filesystem has failed (a journal abort, an error recorded), when the
    /// device fails, or when file data that waited for a commit (cache/write_behind.rs) failed to
    /// reach the device since the last sync.
    pub fn sync(&self) -> Result<()> {
        if self.vol.opened_read_only() {
            return Ok(());
        }
        if self.is_read_only() {
            return Err(self.vol.error_state_eio());
        }
        self.compact_split_extent_trees()?;
        // Nothing dirtied since the open or the last sync, and the counters as
        // the superblock has them: nothing is written (file data written
        // meanwhile is flushed), so a session that changed nothing leaves every
        // byte as it found it.
        let counters_agree = {
            let sb = self.vol.sb.read();
            sb.s_free_blocks_count == self.free_blocks() && sb.s_free_inodes_count == self.free_inodes() as u32
        };
        if !self.vol.changed.swap(false, std::sync::atomic::Ordering::Relaxed) && counters_agree {
            self.vol.cache.send_data();
            self.vol.cache.device().flush()?;
            return self.report_data_failure(None);
        }
        {
            // The handle first: beginning one may wait for a commit, and the journal
            // thread takes the superblock lock.
            let mut tx = self.begin(1)?;
            // The orphans lock before the superblock's (ns/orphan.rs): orphan_present
            // goes once the orphan file is empty, as at the kernel's clean unmount.
            let orphans = self.orphans.lock();
            let mut sb = self.vol.sb.write();
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
        match self.vol.journal() {
            // Through the log, then home: the image is then consistent without it.
            Some(journal) => journal.checkpoint_all()?,
            None => self.vol.cache.flush()?,
        }
        self.report_data_failure(None)
    }

    /// EIO when file data that waited to be written (cache/write_behind.rs)
    /// failed to reach the device since the last report: `ino`'s, or any for
    /// None. As the kernel reports a failed write-back at fsync and syncfs.
    pub(crate) fn report_data_failure(&self, ino: Option<u32>) -> Result<()> {
        let cache = &self.vol.cache;
        let failed = match ino {
            Some(ino) => cache.take_data_failure(ino),
            None => cache.take_any_data_failure(),
        };
        match (failed, ino) {
            (false, _) => Ok(()),
            (true, Some(ino)) => Err(Error::Io(std::io::Error::other(format!(
                "inode {ino}: the device refused file data written to it earlier"
            )))),
            (true, None) => {
                Err(Error::Io(std::io::Error::other("the device refused file data written earlier".to_string())))
            }
        }
    }
}

impl Filesystem {
    /// Packs the extent trees whose nodes split since the last sync or commit
    /// (see `extent::write`). The caller holds no inode lock.
    pub(crate) fn compact_split_extent_trees(&self) -> Result<()> {
        let to_compact: Vec<u32> = self.extent_compact.lock().drain().collect();
        for ino in to_compact {
            let _lock = self.inode_locks.write(ino as u64);
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
    pub fn abandon(self) {
        self.vol.make_read_only();
        // The journal thread and the write-back thread stop where they are.
        self.vol.stop_threads();
    }
}

impl Drop for Filesystem {
    fn drop(&mut self) {
        if !self.is_read_only() {
            if let Err(e) = self.close_all_inodes() {
                eprintln!("uext4: releasing files still open on close failed: {e}");
            }
            if let Err(e) = self.sync() {
                eprintln!("uext4: writing back on close failed: {e}");
            }
        } else if !self.vol.opened_read_only()
            && self.vol.journal().is_none()
            && self.errors_behaviour() != Errors::Panic
        {
            // An error made a filesystem without a journal read-only. There is no
            // log to keep changes whole, so, as the kernel's write-back does, what
            // was changed before the error still goes home (acknowledged work is
            // not dropped); the superblock records the error, so e2fsck runs next.
            // errors=panic stops where it is, as the kernel's panic does.
            if let Err(e) = self.vol.cache.flush() {
                eprintln!("uext4: writing back on close after an error failed: {e}");
            }
        }
        self.vol.stop_threads();
    }
}
