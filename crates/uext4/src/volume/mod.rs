//! `Volume`: the storage every layer above stands on — the device behind its
//! bounded buffer cache, the geometry fixed at open, the superblock, the group
//! descriptors, the journal (or, without one, the write-back thread) and the
//! error state.
//!
//! It is what the lower layers take instead of a `Filesystem`: the allocator
//! (`alloc::Allocator`) and transaction handles (`Volume::begin`) need nothing
//! above it, so they can be built and tested on a `Volume` alone. A `Volume`
//! knows no inodes, extents or names.
//!
//! Invariants: `geo` never changes after open. A group's descriptor changes only
//! under its lock (`groups[g]` taken for writing: the allocator's group lock) and
//! is written to the primary descriptor table in the same handle. `system_zone`
//! holds every group's fixed metadata as sorted, merged ranges. The journal is
//! set at most once, by a writable open, before the first handle begins.

mod error_state;
mod inode_table;

pub(crate) use error_state::ErrorState;
pub use error_state::{errors_panicked, is_errors_panic, Errors};

use crate::cache::{BufferCache, Writeback};
use crate::dev::{BlockDevice, IoClass};
use crate::error::{Error, ErrorSite, Result};
use crate::format::group_desc::{GdCsum, GroupDesc};
use crate::format::superblock::*;
use crate::journal::handle::Handle;
use crate::journal::log::Journal;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

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
    /// Groups in a flex group (1 without flex_bg).
    pub groups_per_flex: u32,
    /// The first inode a file may have (`s_first_ino`; 11 at revision 0).
    pub first_ino: u32,
}

impl Geometry {
    pub fn of(sb: &Superblock, verify_checksums: bool) -> Geometry {
        Geometry {
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
            verify_checksums,
            groups_per_flex: if sb.has_incompat(INCOMPAT_FLEX_BG) {
                // Validated at parse to at most 31; a shift past the group count
                // changes nothing (every group is then in flex group 0).
                1u32.checked_shl(sb.s_log_groups_per_flex as u32).unwrap_or(u32::MAX)
            } else {
                1
            },
            first_ino: sb.first_ino(),
        }
    }

    /// The group block `block` lies in. Precondition: `first_data_block <= block`.
    pub fn group_of_block(&self, block: u64) -> u32 {
        ((block - self.first_data_block as u64) / self.blocks_per_group as u64) as u32
    }

    pub fn group_first_block(&self, group: u32) -> u64 {
        self.first_data_block as u64 + group as u64 * self.blocks_per_group as u64
    }

    /// Blocks in `group` (the last group may be short).
    pub fn blocks_in_group(&self, group: u32) -> u32 {
        (self.blocks_count - self.group_first_block(group)).min(self.blocks_per_group as u64) as u32
    }

    /// Blocks of one group's inode table.
    pub fn inode_table_blocks(&self) -> u64 {
        (self.inodes_per_group as u64 * self.inode_size as u64).div_ceil(self.block_size as u64)
    }

    /// Whether every slot sharing slot `index`'s inode-table block, but `index`
    /// itself, is free in the group's inode `bitmap`: then nothing in that
    /// block needs reading (the inode's write makes it from zeros).
    pub(crate) fn inode_block_others_free(&self, bitmap: &[u8], index: u32) -> bool {
        let per_block = (self.block_size / self.inode_size) as u32;
        let first = index / per_block * per_block;
        (first..(first + per_block).min(self.inodes_per_group))
            .all(|i| i == index || !crate::format::bitmap::test_bit(bitmap, i as usize))
    }
}

pub struct Volume {
    pub(crate) cache: Arc<BufferCache>,
    pub(crate) geo: Geometry,
    pub(crate) sb: Arc<RwLock<Superblock>>,
    pub(crate) groups: Vec<RwLock<GroupDesc>>,
    /// Group metadata (superblock copies, descriptors, bitmaps, inode tables) as
    /// sorted, merged block ranges [start, end): no file block may lie there.
    system_zone: Vec<(u64, u64)>,
    /// The jbd2 journal metadata is written through (writable opens of images with one).
    journal: OnceLock<Arc<Journal>>,
    /// The write-back thread of a writable image without a journal.
    writeback: Mutex<Option<Writeback>>,
    /// The error state (errors=), shared with the journal's view of the filesystem.
    pub(crate) errors: Arc<ErrorState>,
    /// Opened read-only, or made so (a refused open, an abandoned one): nothing
    /// is written back.
    read_only: AtomicBool,
    /// Why the volume was opened read-only, for error messages.
    read_only_reason: String,
    /// Damage a read-only open went on with (a group descriptor checksum mismatch).
    damage_at_open: Option<String>,
    /// A handle dirtied metadata since the open or the last sync: a sync with
    /// nothing to write leaves the image (its superblock's write time, the
    /// journal's sequence) as it was, so a command refused part-way changes
    /// nothing.
    pub(crate) changed: AtomicBool,
    /// Walks in inode-table order under way, for reading ahead (inode_table.rs).
    table_walks: inode_table::TableWalks,
    /// The block of each descriptor-table block's descriptors, by
    /// `group / descriptors per block`: fixed while the image is open, so
    /// writing a descriptor (every allocation) takes no superblock lock.
    desc_blocks: Box<[u64]>,
}

impl Volume {
    /// Reads and checks the group descriptors of the image whose superblock is
    /// `sb`, behind a cache of `cache_mb` MiB. As the kernel's
    /// ext4_check_descriptors, a descriptor whose only fault is its checksum
    /// refuses a writable open and lets a read-only one go on.
    ///
    /// # Errors
    /// `Corrupt` when a descriptor points outside the filesystem, or (writable
    /// opens) fails its checksum; `Io` when the device fails.
    pub fn open(
        dev: Arc<dyn BlockDevice>,
        sb: Superblock,
        geo: Geometry,
        cache_mb: usize,
        errors: Option<Errors>,
        read_only: bool,
        reason: String,
    ) -> Result<Volume> {
        let cache = Arc::new(BufferCache::new(dev, geo.block_size, cache_mb));
        let bad_checksum = first_bad_descriptor_checksum(&cache, &sb, &geo);
        let groups = read_group_descriptors(&cache, &sb, &geo).map_err(|e| match (&bad_checksum, e) {
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
        let errors = Arc::new(ErrorState::new(errors.unwrap_or(Errors::from_superblock(sb.s_errors))));
        let mut vol = Volume {
            cache,
            geo,
            sb: Arc::new(RwLock::new(sb)),
            groups,
            system_zone: Vec::new(),
            journal: OnceLock::new(),
            writeback: Mutex::new(None),
            errors,
            read_only: AtomicBool::new(read_only),
            read_only_reason: reason,
            damage_at_open: bad_checksum,
            changed: AtomicBool::new(false),
            table_walks: inode_table::TableWalks::new(),
            desc_blocks: Box::default(),
        };
        let per_block = (vol.geo.block_size / vol.geo.desc_size) as u32;
        vol.desc_blocks = (0..vol.geo.group_count.div_ceil(per_block))
            .map(|m| group_desc_location(&vol.sb.read(), m * per_block).0)
            .collect();
        let mut zone: Vec<(u64, u64)> = vol.metadata_ranges().into_iter().map(|(start, end, _)| (start, end)).collect();
        zone.sort_unstable();
        zone.dedup_by(|next, prev| {
            let joins = next.0 <= prev.1;
            if joins {
                prev.1 = prev.1.max(next.1);
            }
            joins
        });
        vol.system_zone = zone;
        vol.register_io_classes();
        Ok(vol)
    }

    /// Tells the device's I/O model (if it has one) which blocks the geometry
    /// fixes: superblock copies and descriptors, bitmaps, inode tables.
    fn register_io_classes(&self) {
        let Some(model) = self.cache.device().io_model() else { return };
        model.set_block_size(self.geo.block_size as u64);
        let itable_blocks = self.geo.inode_table_blocks();
        let mut ranges = Vec::with_capacity(self.groups.len() * 4);
        for (g, gd) in self.groups.iter().enumerate() {
            let gd = gd.read();
            let start = self.group_first_block(g as u32);
            ranges.push((start, start + self.base_meta_blocks(g as u32), IoClass::Superblock));
            ranges.push((gd.bg_block_bitmap, gd.bg_block_bitmap + 1, IoClass::Bitmap));
            ranges.push((gd.bg_inode_bitmap, gd.bg_inode_bitmap + 1, IoClass::Bitmap));
            ranges.push((gd.bg_inode_table, gd.bg_inode_table + itable_blocks, IoClass::InodeTable));
        }
        // Block 0 holds the superblock with 1 KiB blocks, the boot sector below it otherwise.
        ranges.push((0, 1, IoClass::Superblock));
        model.classes().add_fixed(ranges);
    }

    /// Tells the device's I/O model which blocks hold the journal.
    pub(crate) fn register_journal_blocks(&self, map: &[u64]) {
        let Some(model) = self.cache.device().io_model() else { return };
        let mut runs: Vec<(u64, u64, IoClass)> = Vec::new();
        for &block in map {
            match runs.last_mut() {
                Some(run) if run.1 == block => run.1 += 1,
                _ => runs.push((block, block + 1, IoClass::Journal)),
            }
        }
        model.classes().add_fixed(runs);
    }

    /// Metadata from here on goes through `journal`. Set once, by a writable open.
    pub(crate) fn set_journal(&self, journal: Arc<Journal>) {
        if self.journal.set(journal).is_err() {
            unreachable!("a volume's journal is set once, at open");
        }
    }

    /// Without a journal: dirty buffers go home through this thread.
    pub(crate) fn set_writeback(&self, writeback: Writeback) {
        *self.writeback.lock() = Some(writeback);
    }

    pub(crate) fn journal(&self) -> Option<&Arc<Journal>> {
        self.journal.get()
    }

    /// Stops the journal thread and the write-back thread where they are.
    pub(crate) fn stop_threads(&self) {
        if let Some(journal) = self.journal() {
            journal.shutdown();
        }
        self.writeback.lock().take();
    }

    /// From now on nothing is written back (a refused or abandoned open).
    pub(crate) fn make_read_only(&self) {
        self.read_only.store(true, Ordering::SeqCst);
    }

    /// Opened read-only (as opposed to made read-only by an error).
    pub fn opened_read_only(&self) -> bool {
        self.read_only.load(Ordering::SeqCst)
    }

    pub fn is_read_only(&self) -> bool {
        self.opened_read_only() || self.errors.is_read_only()
    }

    pub fn read_only_reason(&self) -> &str {
        match self.errors.reason() {
            Some(why) if self.is_read_only() && !self.opened_read_only() => why,
            _ => &self.read_only_reason,
        }
    }

    pub fn damage_at_open(&self) -> Option<&str> {
        self.damage_at_open.as_deref()
    }

    /// Starts a handle for a change touching up to `credits` metadata blocks
    /// (see journal/handle.rs).
    ///
    /// # Errors
    /// `ReadOnly` when the volume is read-only or in its error state, or the
    /// journal aborted.
    pub fn begin(&self, credits: u32) -> Result<Handle<'_>> {
        if self.is_read_only() {
            return Err(Error::ReadOnly(self.read_only_reason().to_string()));
        }
        let joined = match self.journal() {
            Some(journal) => Some(journal.join(credits)?),
            None => None,
        };
        Ok(Handle::new(self, credits, joined))
    }

    /// EIO for a durability request (fsync, sync) refused by the error state.
    pub(crate) fn error_state_eio(&self) -> Error {
        let why = self.errors.reason().unwrap_or("the filesystem is in its error state");
        Error::Io(std::io::Error::other(format!("filesystem error state: {why}")))
    }

    /// An operation failed in a way that cannot be undone (a handle ended after
    /// dirtying buffers without `finish`): abort the journal, so the half-done
    /// change never commits, and enter the error state.
    pub(crate) fn fail_operation(&self, site: ErrorSite, why: &str) {
        match self.journal() {
            Some(journal) => journal.abort(site, why),
            None => self.errors.record(&self.cache, &self.sb, site, why, false),
        }
    }

    /// A metadata block could not be read (an inode table or bitmap block: the
    /// kernel's ext4_error for "unable to read itable block", "Cannot read
    /// inode bitmap"): on a writable open the error is recorded in the
    /// superblock and errors= decides what follows (read-only by default);
    /// a read-only open records nothing. Passes `e` back for the caller.
    pub(crate) fn read_error(&self, e: Error, func: &'static str, what: &str, ino: u32, block: u64) -> Error {
        if matches!(e, Error::Io(_)) && !self.opened_read_only() {
            let site = ErrorSite { func, errno: e.errno() };
            self.errors.record_at(&self.cache, &self.sb, site, &format!("{what}: {e}"), ino, block);
        }
        e
    }

    /// Without a journal: tells the write-back thread the dirty list has grown.
    pub(crate) fn writeback_kick(&self) {
        if self.cache.dirty_pressure() {
            if let Some(w) = self.writeback.lock().as_ref() {
                w.kick();
            }
        }
    }

    pub(crate) fn group_of_block(&self, block: u64) -> u32 {
        self.geo.group_of_block(block)
    }

    pub(crate) fn group_first_block(&self, group: u32) -> u64 {
        self.geo.group_first_block(group)
    }

    pub(crate) fn blocks_in_group(&self, group: u32) -> u32 {
        self.geo.blocks_in_group(group)
    }

    /// Writes group `g`'s descriptor into the primary descriptor table.
    pub(crate) fn write_group_desc(&self, tx: &mut Handle, g: u32, gd: &GroupDesc) -> Result<()> {
        let per_block = self.geo.block_size / self.geo.desc_size;
        let Some(&block) = self.desc_blocks.get(g as usize / per_block) else {
            return Err(Error::Invalid(format!("group {g} is past the last group")));
        };
        let off = g as usize % per_block * self.geo.desc_size;
        let buf = self.cache.get(block)?;
        {
            let mut data = buf.write();
            let ds = self.geo.desc_size;
            gd.write(&mut data[off..off + ds], ds, g, self.geo.gd_csum);
        }
        tx.dirty(&buf);
        Ok(())
    }

    /// Blocks at the start of group `g` taken by its superblock backup and descriptor
    /// blocks (as the kernel's ext4_bg_num_gdb counts them).
    pub(crate) fn base_meta_blocks(&self, g: u32) -> u64 {
        let sb = self.sb.read();
        let has_super = group_has_superblock(&sb, g);
        let per_block = self.geo.block_size as u64 / self.geo.desc_size as u64;
        let gdt_blocks = (self.geo.group_count as u64).div_ceil(per_block);
        let meta_group = g as u64 / per_block;
        let meta_bg = sb.has_incompat(INCOMPAT_META_BG);
        let descriptors = if !meta_bg || meta_group < sb.s_first_meta_bg as u64 {
            let table = if meta_bg { sb.s_first_meta_bg as u64 } else { gdt_blocks };
            if has_super {
                table + sb.s_reserved_gdt_blocks as u64
            } else {
                0
            }
        } else {
            // meta_bg: one descriptor block in the first, second and last group of each meta group.
            let index = g as u64 % per_block;
            u64::from(index == 0 || index == 1 || index == per_block - 1)
        };
        u64::from(has_super) + descriptors
    }

    /// Every group's fixed metadata: (first block, end, what), unsorted.
    fn metadata_ranges(&self) -> Vec<(u64, u64, String)> {
        let itable_blocks = self.geo.inode_table_blocks();
        let mut ranges = Vec::with_capacity(self.groups.len() * 4);
        for (g, gd) in self.groups.iter().enumerate() {
            let gd = gd.read();
            let start = self.group_first_block(g as u32);
            // Bigalloc with 1 KiB blocks starts group 0 at block 0, the boot block,
            // before the superblock.
            let boot = u64::from(start == 0 && self.geo.block_size == 1024);
            let base = self.base_meta_blocks(g as u32) + boot;
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
    pub(crate) fn check_descriptors(&self) -> Result<()> {
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
}

/// Where group `group`'s descriptor lives: (block, byte offset in it).
pub fn group_desc_location(sb: &Superblock, group: u32) -> (u64, usize) {
    let bs = sb.block_size() as u64;
    let desc_size = sb.desc_size() as u64;
    let per_block = bs / desc_size;
    let first = sb.s_first_data_block as u64;
    // The block the primary superblock lies in: 1 with 1 KiB blocks (even when
    // bigalloc starts the first group at block 0), else 0.
    let sb_block = u64::from(bs == 1024);
    let index_in_block = (group as u64 % per_block) as usize * desc_size as usize;
    let meta_group = group as u64 / per_block;
    if !sb.has_incompat(INCOMPAT_META_BG) || meta_group < sb.s_first_meta_bg as u64 {
        return (sb_block + 1 + meta_group, index_in_block);
    }
    // meta_bg: each meta group's descriptor block sits in its first group,
    // after the superblock backup if that group has one (group 0's superblock
    // is at block 1 with 1 KiB blocks, as e2fsprogs' ext2fs_descriptor_block_loc2).
    let g0 = meta_group * per_block;
    let group_start = (first + g0 * sb.s_blocks_per_group as u64).max(sb_block);
    let has_super = u64::from(group_has_superblock(sb, g0 as u32));
    (group_start + has_super, index_in_block)
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

/// The first group whose descriptor fails its checksum, described; None when
/// all match (or checksums are not verified).
fn first_bad_descriptor_checksum(cache: &BufferCache, sb: &Superblock, geo: &Geometry) -> Option<String> {
    if !geo.verify_checksums {
        return None;
    }
    (0..geo.group_count).find_map(|g| {
        let (block, off) = group_desc_location(sb, g);
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
        let (block, off) = group_desc_location(sb, g);
        if block >= geo.blocks_count {
            return Err(Error::corrupt(format!("descriptor block {block} is beyond the end"), format!("group {g}")));
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
        if gd.bg_inode_table + geo.inode_table_blocks() > geo.blocks_count {
            return Err(Error::corrupt("inode table runs past the end of the filesystem", format!("group {g}")));
        }
        groups.push(RwLock::new(gd));
    }
    Ok(groups)
}
