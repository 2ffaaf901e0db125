//! Open files and the orphan records.
//!
//! A file unlinked while open keeps its blocks until the last close. Meanwhile it
//! is recorded as an orphan on disk, so that if uext4 stops before the close, the
//! next writable open (or the kernel, or e2fsck) frees it. The record is made in
//! the same handle as the change that dropped the last link, and removed in the
//! same handle as the change that frees the inode: no commit can separate them.
//!
//! Two places hold orphans, as in the kernel:
//! - the orphan file (compat `orphan_file`): blocks of 32-bit inode numbers, 0 for
//!   a free slot, each block ending in a magic and a checksum. When the image has
//!   one, it is used first, and ro_compat `orphan_present` is set on disk in the
//!   same transaction as the first entry (`sync` clears it once the file is empty);
//! - the chain: the superblock's `s_last_orphan` names the newest orphan, each
//!   orphan's `i_dtime` the next. Used when there is no orphan file or it is full.
//!
//! Invariants, kept under the `orphans` lock (the kernel's s_orphan_lock), taken
//! inside a handle and before the superblock lock and any buffer lock:
//! - `Orphans::chain` mirrors the on-disk chain exactly: its head is the in-memory
//!   superblock's `s_last_orphan`, and each member's on-disk `i_dtime` is its
//!   `next`. Whoever writes an inode with no links goes through `write_inode`,
//!   which stamps the chain's `next` into `i_dtime` under this lock, so a caller
//!   holding an older copy of the inode cannot break the chain.
//! - `Orphans::slots` names every inode this session recorded in the orphan file,
//!   and the cached orphan file blocks hold exactly those entries.
//! - Writable opens process every orphan a previous session left (chain and file)
//!   before anything else runs, one handle per orphan, so the records left on disk
//!   are always the ones still to process.

use crate::error::{Error, Result};
use crate::format::bitmap;
use crate::format::group_desc::{GdCsum, EXT4_BG_INODE_UNINIT};
use crate::format::inode::*;
use crate::format::superblock::*;
use crate::fs::Filesystem;
use crate::journal::handle::Handle;
use std::collections::HashMap;

/// The magic in the tail of every orphan file block.
pub const EXT4_ORPHAN_BLOCK_MAGIC: u32 = 0x0b10_ca04;
/// The tail: magic, then checksum, both le32.
const ORPHAN_TAIL_LEN: usize = 8;

/// Where an inode on the chain sits: the orphans before (0: the superblock) and after it.
#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
}

/// The orphan file as loaded at a writable open.
struct OrphanFile {
    /// Physical block of each orphan file block, in file order.
    blocks: Vec<u64>,
    /// Free slots in each block.
    free: Vec<u32>,
    /// The orphan file inode's checksum seed (the block checksums start from it).
    seed: u32,
}

/// Orphans a previous session left, in the order they are processed.
pub(crate) struct PendingOrphans {
    chain: Vec<u32>,
    in_file: Vec<(usize, u32)>,
}

impl PendingOrphans {
    pub(crate) fn is_empty(&self) -> bool {
        self.chain.is_empty() && self.in_file.is_empty()
    }
}

/// In-memory view of the orphan records (see the module comment).
#[derive(Default)]
pub(crate) struct Orphans {
    chain: HashMap<u32, Link>,
    file: Option<OrphanFile>,
    /// Slot (block * entries per block + index) of each inode in the orphan file.
    slots: HashMap<u32, usize>,
}

impl Orphans {
    /// The chain's `next` of `ino`, if `ino` is on the chain.
    pub(crate) fn chain_next(&self, ino: u32) -> Option<u32> {
        self.chain.get(&ino).map(|l| l.next)
    }
}

fn slots_per_block(block_size: usize) -> usize {
    (block_size - ORPHAN_TAIL_LEN) / 4
}

fn le32_at(data: &[u8], at: usize) -> u32 {
    data.get(at..at + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

impl Filesystem {
    /// Records an open handle on `ino` (FUSE open / opendir).
    ///
    /// Under the inode lock, as unlink decides under it whether the inode is open:
    /// an inode whose last name went before this open (and that nobody holds open)
    /// is gone, whatever a caller's stale number says.
    pub fn open_inode(&self, ino: u32) -> Result<()> {
        let _lock = self.inode_locks.write(ino as u64);
        let inode = self.inode(ino)?;
        let mut open = self.open_files.shard(ino);
        if inode.i_links_count == 0 && !open.contains_key(&ino) {
            return Err(Error::NotFound(format!("inode {ino} was unlinked")));
        }
        *open.entry(ino).or_insert(0) += 1;
        Ok(())
    }

    /// Refuses a change to `ino` unless names can reach it: the root or an
    /// inode past the reserved ones (the journal, resize and bad-block inodes
    /// are the filesystem's own: EPERM), linked or held open after its last
    /// unlink. A freed inode's number is stale (the kernel answers ESTALE to a
    /// handle naming one): a write through it would give blocks to a free
    /// inode. The caller holds the inode's lock, so no unlink frees it meanwhile.
    pub(crate) fn require_changeable(&self, ino: u32, inode: &Inode) -> Result<()> {
        if ino != crate::ns::ROOT_INO && ino < self.vol.geo.first_ino {
            return Err(Error::NotPermitted(format!("inode {ino} is reserved for the filesystem's own use")));
        }
        if inode.i_links_count == 0 && !self.is_open(ino) {
            return Err(Error::NotFound(format!("inode {ino} is not in use (unlinked, and not open)")));
        }
        Ok(())
    }

    /// Drops an open handle; the last close of an unlinked inode frees it.
    ///
    /// The count drops under the inode lock, so an unlink (which decides under that
    /// lock whether to free the inode or record it as an orphan) sees either the
    /// open or the close whole: the inode is released exactly once.
    pub fn close_inode(&self, ino: u32) -> Result<()> {
        let _lock = self.inode_locks.write(ino as u64);
        {
            let mut open = self.open_files.shard(ino);
            let Some(n) = open.get_mut(&ino) else {
                return Err(Error::Invalid(format!("inode {ino} is not open")));
            };
            *n -= 1;
            if *n > 0 {
                return Ok(());
            }
            open.remove(&ino);
        }
        let mut inode = (*self.inode(ino)?).clone();
        if inode.i_links_count != 0 {
            return Ok(());
        }
        // Only a nameless file can be linkable (a link clears it).
        self.linkable.lock().remove(&ino);
        let mut tx = self.begin(8)?;
        self.orphan_remove(&mut tx, ino, &mut inode)?;
        // release_inode writes the slot itself.
        self.release_inode(&mut tx, ino, &mut inode)?;
        tx.finish()
    }

    /// Closes every handle still open, as the kernel's last iput of each file
    /// before an unmount does: an inode whose last name is gone is released,
    /// so a clean close leaves nothing on the orphan list. Called when the
    /// filesystem closes.
    pub(crate) fn close_all_inodes(&self) -> Result<()> {
        let mut held: Vec<(u32, u32)> = Vec::new();
        self.open_files.for_each_shard(|open| held.extend(open.iter().map(|(&ino, &n)| (ino, n))));
        for (ino, n) in held {
            for _ in 0..n {
                self.close_inode(ino)?;
            }
        }
        Ok(())
    }

    pub(crate) fn is_open(&self, ino: u32) -> bool {
        self.open_files.shard(ino).contains_key(&ino)
    }

    /// Copies the in-memory superblock `sb` into its cached block under `tx`, so the
    /// change commits with the handle's other changes. The caller holds the
    /// superblock lock (whose guard `sb` is), which keeps the two in step.
    ///
    /// With a journal the staged copy says needs_recovery: it reaches the disk only
    /// through the log, by replay or by a checkpoint, both while the log is live —
    /// a checkpoint writing it home before the log is emptied must not clear the
    /// flag under a live log (a sync or close clears it once the log is empty).
    pub(crate) fn stage_superblock(&self, tx: &mut Handle, sb: &Superblock) -> Result<()> {
        let bytes = if self.vol.journal().is_some() && !sb.has_incompat(INCOMPAT_RECOVER) {
            let mut logged = sb.clone();
            logged.s_feature_incompat |= INCOMPAT_RECOVER;
            logged.to_bytes()
        } else {
            sb.to_bytes()
        };
        let bs = self.vol.geo.block_size as u64;
        let (block, off) = (SUPERBLOCK_OFFSET / bs, (SUPERBLOCK_OFFSET % bs) as usize);
        let buf = self.vol.cache.get(block)?;
        buf.write()[off..off + SUPERBLOCK_SIZE].copy_from_slice(&bytes);
        tx.dirty(&buf);
        Ok(())
    }

    /// Records `ino`, whose last link this handle drops while it stays open, as an
    /// orphan. The caller writes `inode` under the same handle afterwards.
    pub(crate) fn orphan_add(&self, tx: &mut Handle, ino: u32, inode: &mut Inode) -> Result<()> {
        let mut orphans = self.orphans.lock();
        if orphans.chain.contains_key(&ino) || orphans.slots.contains_key(&ino) {
            return Ok(());
        }
        if let Some(slot) = self.orphan_file_take_slot(tx, &mut orphans, ino)? {
            orphans.slots.insert(ino, slot);
            let mut sb = self.vol.sb.write();
            if !sb.has_ro_compat(RO_COMPAT_ORPHAN_PRESENT) {
                sb.s_feature_ro_compat |= RO_COMPAT_ORPHAN_PRESENT;
                self.stage_superblock(tx, &sb)?;
            }
            return Ok(());
        }
        // The chain: this inode becomes its head.
        let mut sb = self.vol.sb.write();
        let old_head = sb.s_last_orphan;
        if let Some(l) = orphans.chain.get_mut(&old_head) {
            l.prev = ino;
        }
        orphans.chain.insert(ino, Link { prev: 0, next: old_head });
        inode.i_dtime = old_head;
        sb.s_last_orphan = ino;
        self.stage_superblock(tx, &sb)
    }

    /// Takes `ino` off the orphan records (caller writes `inode` afterwards).
    /// An inode on neither is left alone.
    pub(crate) fn orphan_remove(&self, tx: &mut Handle, ino: u32, inode: &mut Inode) -> Result<()> {
        let mut orphans = self.orphans.lock();
        if let Some(slot) = orphans.slots.remove(&ino) {
            return self.orphan_file_clear_slot(tx, &mut orphans, slot);
        }
        let Some(link) = orphans.chain.remove(&ino) else { return Ok(()) };
        inode.i_dtime = 0;
        if let Some(l) = orphans.chain.get_mut(&link.next) {
            l.prev = link.prev;
        }
        if link.prev == 0 {
            let mut sb = self.vol.sb.write();
            sb.s_last_orphan = link.next;
            return self.stage_superblock(tx, &sb);
        }
        let prev = orphans
            .chain
            .get_mut(&link.prev)
            .ok_or_else(|| Error::corrupt("orphan chain lost a member", format!("inode {}", link.prev)))?;
        prev.next = link.next;
        let mut prev_inode = (*self.inode(link.prev)?).clone();
        prev_inode.i_dtime = link.next;
        // Under the orphans lock already: the plain write, not write_inode's.
        self.write_inode_slot(tx, link.prev, &prev_inode)
    }

    /// Finds a free orphan file slot and puts `ino` in it; None without an orphan
    /// file or when it is full (the kernel then falls back to the chain too).
    fn orphan_file_take_slot(&self, tx: &mut Handle, orphans: &mut Orphans, ino: u32) -> Result<Option<usize>> {
        let Some(file) = orphans.file.as_mut() else { return Ok(None) };
        let Some(b) = file.free.iter().position(|&n| n > 0) else { return Ok(None) };
        let per = slots_per_block(self.vol.geo.block_size);
        let buf = self.vol.cache.get(file.blocks[b])?;
        let index = {
            let mut data = buf.write();
            let Some(i) = (0..per).find(|&i| le32_at(&data, i * 4) == 0) else {
                return Err(Error::corrupt(
                    "orphan file block counted a free slot it does not have",
                    format!("orphan file block {b}"),
                ));
            };
            data[i * 4..i * 4 + 4].copy_from_slice(&ino.to_le_bytes());
            self.orphan_block_seal(&mut data, file.blocks[b], file.seed);
            i
        };
        tx.dirty(&buf);
        file.free[b] -= 1;
        Ok(Some(b * per + index))
    }

    fn orphan_file_clear_slot(&self, tx: &mut Handle, orphans: &mut Orphans, slot: usize) -> Result<()> {
        let file = orphans.file.as_mut().expect("a slot implies an orphan file");
        let per = slots_per_block(self.vol.geo.block_size);
        let (b, i) = (slot / per, slot % per);
        let buf = self.vol.cache.get(file.blocks[b])?;
        {
            let mut data = buf.write();
            data[i * 4..i * 4 + 4].fill(0);
            self.orphan_block_seal(&mut data, file.blocks[b], file.seed);
        }
        tx.dirty(&buf);
        file.free[b] += 1;
        Ok(())
    }

    /// The checksum of an orphan file block: crc32c from the orphan file inode's
    /// seed over the block's physical number (le64), then over its slots.
    fn orphan_block_checksum(&self, data: &[u8], pblk: u64, seed: u32) -> u32 {
        let per = slots_per_block(self.vol.geo.block_size);
        let c = crate::format::csum::crc32c(seed, &pblk.to_le_bytes());
        crate::format::csum::crc32c(c, &data[..per * 4])
    }

    fn orphan_block_seal(&self, data: &mut [u8], pblk: u64, seed: u32) {
        if self.vol.geo.metadata_csum {
            let c = self.orphan_block_checksum(data, pblk, seed);
            let at = self.vol.geo.block_size - 4;
            data[at..].copy_from_slice(&c.to_le_bytes());
        }
    }

    /// Whether this session's orphan file holds any entry (None: no orphan file).
    /// Caller holds the `orphans` lock.
    pub(crate) fn orphan_file_in_use(orphans: &Orphans) -> Option<bool> {
        orphans.file.as_ref().map(|_| !orphans.slots.is_empty())
    }

    /// Reads and checks the orphan file of an image that has one (writable opens):
    /// every block ends in the magic and, with metadata_csum, a matching checksum,
    /// as the kernel requires before it mounts. Returns the inodes recorded there.
    pub(crate) fn load_orphan_file(&self) -> Result<Vec<(usize, u32)>> {
        let sb = self.superblock();
        if !sb.has_compat(COMPAT_ORPHAN_FILE) {
            return Ok(Vec::new());
        }
        let oino = sb.s_orphan_file_inum;
        let where_ = || format!("orphan file inode {oino}");
        if oino == 0 || oino > self.vol.geo.inodes_count {
            return Err(Error::corrupt(format!("orphan file inode number {oino} is out of range"), "superblock"));
        }
        let inode = self.inode(oino)?;
        let bs = self.vol.geo.block_size as u64;
        let count = inode.i_size / bs;
        if count > self.vol.geo.blocks_count {
            return Err(Error::corrupt(format!("orphan file of {} bytes", inode.i_size), where_()));
        }
        let seed = self.inode_seed(oino, &inode);
        let per = slots_per_block(self.vol.geo.block_size);
        let mut file = OrphanFile { blocks: Vec::new(), free: Vec::new(), seed };
        let mut found = Vec::new();
        for lblk in 0..count {
            let crate::extent::MapKind::Mapped(pblk) = self.map_blocks(oino, &inode, lblk, 1)?.kind else {
                return Err(Error::corrupt(format!("orphan file has no block at {lblk}"), where_()));
            };
            self.vol.check_block(pblk, &where_)?;
            self.vol.cache.classify(pblk, crate::dev::IoClass::Other);
            let buf = self.vol.cache.get(pblk)?;
            let data = buf.read();
            if le32_at(&data, self.vol.geo.block_size - 8) != EXT4_ORPHAN_BLOCK_MAGIC {
                return Err(Error::corrupt(format!("orphan file block {lblk} has a bad magic"), where_()));
            }
            if self.vol.geo.metadata_csum
                && self.vol.geo.verify_checksums
                && le32_at(&data, self.vol.geo.block_size - 4) != self.orphan_block_checksum(&data, pblk, seed)
            {
                return Err(Error::corrupt(format!("orphan file block {lblk} has a bad checksum"), where_()));
            }
            let mut free = 0;
            for i in 0..per {
                match le32_at(&data, i * 4) {
                    0 => free += 1,
                    ino => found.push((lblk as usize * per + i, ino)),
                }
            }
            file.blocks.push(pblk);
            file.free.push(free);
        }
        self.orphans.lock().file = Some(file);
        Ok(found)
    }

    /// Whether `ino`'s bit is set in its group's inode bitmap.
    fn inode_allocated(&self, ino: u32) -> Result<bool> {
        let g = (ino - 1) / self.vol.geo.inodes_per_group;
        let index = ((ino - 1) % self.vol.geo.inodes_per_group) as usize;
        let gd = self.vol.groups[g as usize].read().clone();
        if gd.bg_flags & EXT4_BG_INODE_UNINIT != 0 && self.vol.geo.gd_csum != GdCsum::None {
            return Ok(false);
        }
        let buf = self.vol.cache.get(gd.bg_inode_bitmap)?;
        let set = bitmap::test_bit(&buf.read(), index);
        Ok(set)
    }

    /// An orphan a previous session left must be an inode in use, as the kernel's
    /// ext4_orphan_get checks; anything else refuses the writable open before any
    /// change (e2fsck repairs such lists).
    fn check_orphan(&self, ino: u32, record: &str) -> Result<()> {
        let bad = |why: &str| Error::corrupt(format!("{record} names inode {ino}, {why}"), "orphan records");
        if ino < self.vol.geo.first_ino || ino > self.vol.geo.inodes_count {
            return Err(bad("which cannot be an orphan"));
        }
        if !self.inode_allocated(ino)? {
            return Err(bad("which is not in use"));
        }
        // What release_inode would find damaged must refuse now, not half-way through.
        let inode = self.inode(ino)?;
        if inode.i_links_count == 0 {
            self.check_releasable(ino, &inode)?;
        }
        Ok(())
    }

    /// Frees (or, if it still has links, truncates to its size) one orphan a
    /// previous session left, as the kernel's ext4_process_orphan does.
    fn process_one_orphan(&self, tx: &mut Handle, ino: u32) -> Result<bool> {
        let mut inode = (*self.inode(ino)?).clone();
        if inode.i_links_count == 0 {
            self.release_inode(tx, ino, &mut inode)?;
            return Ok(true);
        }
        // A truncate that did not finish: blocks past i_size go.
        if inode.is_reg() && (inode.has_flag(EXT4_EXTENTS_FL) || self.has_block_map(&inode)) {
            let bs = self.vol.geo.block_size as u64;
            let keep = inode.i_size.div_ceil(bs);
            self.extent_truncate(tx, ino, &mut inode, keep)?;
        }
        inode.i_dtime = 0;
        self.write_inode(tx, ino, &inode)?;
        Ok(false)
    }

    /// What a previous session left as orphans, checked before anything is
    /// written at a writable open (the orphan file loaded here): the chain from
    /// `s_last_orphan`, then the orphan file's entries as (slot, inode).
    pub(crate) fn pending_orphans(&self) -> Result<PendingOrphans> {
        let in_file = self.load_orphan_file()?;
        let mut chain = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut at = self.vol.sb.read().s_last_orphan;
        while at != 0 {
            if !seen.insert(at) {
                return Err(Error::corrupt("the orphan chain runs in a loop", "superblock s_last_orphan"));
            }
            self.check_orphan(at, "the orphan chain")?;
            chain.push(at);
            at = self.inode(at)?.i_dtime;
        }
        for &(_, ino) in &in_file {
            self.check_orphan(ino, "the orphan file")?;
            if !seen.insert(ino) {
                return Err(Error::corrupt(format!("inode {ino} is recorded twice"), "orphan records"));
            }
        }
        Ok(PendingOrphans { chain, in_file })
    }

    /// Frees (or truncates) the orphans `pending_orphans` found, each in a handle
    /// of its own that also drops its record, so a crash part-way leaves the rest
    /// recorded. Returns how many inodes were freed.
    pub(crate) fn process_orphans(&self, pending: &PendingOrphans) -> Result<usize> {
        let PendingOrphans { chain, in_file } = pending;
        let mut freed = 0;
        for (n, &ino) in chain.iter().enumerate() {
            let mut tx = self.begin(16)?;
            {
                let mut sb = self.vol.sb.write();
                sb.s_last_orphan = chain.get(n + 1).copied().unwrap_or(0);
                self.stage_superblock(&mut tx, &sb)?;
            }
            freed += usize::from(self.process_one_orphan(&mut tx, ino)?);
            tx.finish()?;
        }
        for &(slot, ino) in in_file.iter() {
            let mut tx = self.begin(16)?;
            {
                let mut orphans = self.orphans.lock();
                self.orphan_file_clear_slot(&mut tx, &mut orphans, slot)?;
            }
            freed += usize::from(self.process_one_orphan(&mut tx, ino)?);
            tx.finish()?;
        }
        Ok(freed)
    }
}
