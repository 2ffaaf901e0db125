//! Making a new ext4 filesystem, with mke2fs 1.47's defaults as the baseline.
//!
//! Layout rules (as mke2fs): 8 x block-size blocks per group; backup superblocks
//! and descriptor tables in groups 0, 1 and powers of 3, 5 and 7 (sparse_super);
//! with flex_bg, the bitmaps and inode tables of each flex group of 16 are packed
//! together near its start, skipping backup regions; a last group too small to be
//! useful is dropped. The journal is one contiguous run near the middle of the
//! disk. Inode tables are not written: the image file is created fresh (all zero,
//! sparse), so they are already zero and the groups are marked ITABLE_ZEROED; on a
//! device that is not a fresh file, they are zeroed explicitly.
//!
//! mkfs writes blocks directly to the device: nothing is mounted yet. Over an
//! existing file, the whole build first runs on a device that drops its writes,
//! so every refusal comes before the file is truncated.

use crate::dev::{BlockDevice, FileDevice};
use crate::error::{Error, Result};
use crate::format::bitmap;
use crate::format::dirent::{self, EXT4_FT_DIR};
use crate::format::extent::{self, Extent, ExtentHeader, ExtentIndex, ExtentNode, EXT4_EXT_MAGIC};
use crate::format::group_desc::*;
use crate::format::inode::*;
use crate::format::superblock::*;
use crate::fs::group_has_superblock;
use std::collections::BTreeMap;
use std::path::Path;

/// The smallest filesystem mkfs makes (8 MiB).
pub const MIN_SIZE: u64 = 8 << 20;
/// The largest filesystem mkfs makes (1 TiB).
pub const MAX_SIZE: u64 = 1 << 40;
const ROOT_INO: u32 = 2;
const JOURNAL_INO: u32 = 8;
const LOST_FOUND_INO: u32 = 11;
const FIRST_INO: u32 = 11;
const LOG_GROUPS_PER_FLEX: u8 = 4;
const JBD2_MAGIC: u32 = 0xC03B_3998;
const JBD2_SUPERBLOCK_V2: u32 = 4;

/// What to make. `Default` gives mke2fs 1.47's defaults for the size.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Bytes, from `MIN_SIZE` to `MAX_SIZE`.
    pub size: u64,
    /// 1024, 2048, 4096 (or 65536 max); None chooses as mke2fs does by size.
    pub block_size: Option<u32>,
    /// Bytes per inode: 128 or 256 (the default).
    pub inode_size: u16,
    /// Total inodes wanted; None uses the bytes-per-inode ratio.
    pub inodes: Option<u64>,
    /// Volume label, up to 16 bytes.
    pub label: String,
    /// Feature edits: "name" turns on, "^name" off (applied to the defaults).
    pub features: Vec<String>,
    /// Filesystem UUID and hash seed; random when None (tests fix them).
    pub uuid: Option<[u8; 16]>,
    /// The directory hash seed; random when None.
    pub hash_seed: Option<[u8; 16]>,
    /// Creation time (seconds); when None, now (or `clock`'s fixed time).
    pub now: Option<u64>,
    /// Where on the device to make it (`mkfs` only): a region other than the
    /// whole device is made in place, leaving the rest (a partition table, other
    /// partitions) untouched; a `size` of 0 then means the whole region.
    pub region: crate::dev::Region,
}

impl Default for MkfsOptions {
    fn default() -> MkfsOptions {
        MkfsOptions {
            size: 0,
            block_size: None,
            inode_size: 256,
            inodes: None,
            label: String::new(),
            features: Vec::new(),
            uuid: None,
            hash_seed: None,
            now: None,
            region: crate::dev::Region::Whole,
        }
    }
}

/// Feature words (compat, incompat, ro_compat) of mke2fs 1.47's ext4 default,
/// less resize_inode, which uext4 does not create.
fn default_features() -> [u32; 3] {
    [
        COMPAT_HAS_JOURNAL | COMPAT_EXT_ATTR | COMPAT_DIR_INDEX,
        INCOMPAT_FILETYPE | INCOMPAT_EXTENTS | INCOMPAT_64BIT | INCOMPAT_FLEX_BG,
        RO_COMPAT_SPARSE_SUPER
            | RO_COMPAT_LARGE_FILE
            | RO_COMPAT_HUGE_FILE
            | RO_COMPAT_DIR_NLINK
            | RO_COMPAT_EXTRA_ISIZE
            | RO_COMPAT_METADATA_CSUM,
    ]
}

/// The features mkfs can make; others are refused by name.
const MKFS_FEATURES: &[&str] = &[
    "has_journal",
    "ext_attr",
    "dir_index",
    "filetype",
    "extent",
    "extents",
    "64bit",
    "flex_bg",
    "sparse_super",
    "large_file",
    "huge_file",
    "dir_nlink",
    "extra_isize",
    "metadata_csum",
    "uninit_bg",
    "inline_data",
    "large_dir",
    "metadata_csum_seed",
];

fn apply_features(edits: &[String]) -> Result<[u32; 3]> {
    let mut words = default_features();
    for edit in edits.iter().flat_map(|e| e.split(',')).filter(|e| !e.is_empty()) {
        let (on, name) = match edit.strip_prefix('^') {
            Some(n) => (false, n),
            None => (true, edit),
        };
        let name = if name == "extents" { "extent" } else { name };
        let Some(&(w, bit, _)) = FEATURE_NAMES.iter().find(|(_, _, n)| *n == name) else {
            return Err(Error::Invalid(format!("unknown filesystem feature '{name}'")));
        };
        if !MKFS_FEATURES.contains(&name) {
            // A feature uext4 cannot make is never on: turning it off is what
            // mkfs.ext4 users write (^resize_inode, ^orphan_file) and changes nothing.
            if on {
                return Err(Error::unsupported(format!("mkfs feature '{name}'")));
            }
            continue;
        }
        // FEATURE_NAMES words are compat, incompat, ro_compat in that order.
        if on {
            words[w as usize] |= bit;
        } else {
            words[w as usize] &= !bit;
        }
    }
    if words[1] & INCOMPAT_EXTENTS == 0 && words[1] & INCOMPAT_64BIT != 0 {
        // Block maps hold 32-bit block numbers, so 64bit needs extents. 64bit is
        // only a default: drop it unless it was asked for by name.
        let asked = edits.iter().flat_map(|e| e.split(',')).any(|e| e == "64bit");
        if asked {
            return Err(Error::Invalid("64bit needs the extent feature (block maps hold 32-bit block numbers)".into()));
        }
        words[1] &= !INCOMPAT_64BIT;
    }
    if words[2] & RO_COMPAT_METADATA_CSUM != 0 {
        // metadata_csum supersedes the crc16 descriptor checksums.
        words[2] &= !RO_COMPAT_GDT_CSUM;
    }
    if words[1] & INCOMPAT_INLINE_DATA != 0 && words[0] & COMPAT_EXT_ATTR == 0 {
        return Err(Error::Invalid("inline_data needs ext_attr".into()));
    }
    Ok(words)
}

/// mke2fs's default journal size in blocks for a filesystem of `blocks` blocks.
pub fn default_journal_blocks(blocks: u64) -> u64 {
    match blocks {
        b if b < 2048 => 0,
        b if b < 32768 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16384,
        b if b < 8192 * 1024 => 32768,
        b if b < 16384 * 1024 => 65536,
        b if b < 32768 * 1024 => 131072,
        _ => 262144,
    }
}

fn random_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    // RFC 4122 version 4, variant 1.
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

/// Tracks which blocks are taken while the layout is planned.
struct BlockMap {
    used: Vec<u64>,
    blocks: u64,
    /// s_first_data_block: where a wrapped search starts.
    first: u64,
}

impl BlockMap {
    fn new(blocks: u64, first: u64) -> BlockMap {
        BlockMap { used: vec![0; blocks.div_ceil(64) as usize], blocks, first }
    }
    fn is_used(&self, b: u64) -> bool {
        self.used[(b / 64) as usize] & (1 << (b % 64)) != 0
    }
    fn mark(&mut self, start: u64, len: u64) {
        for b in start..start + len {
            self.used[(b / 64) as usize] |= 1 << (b % 64);
        }
    }
    /// First run of `len` free blocks at or after `goal`, wrapping to the first data block.
    fn alloc(&mut self, goal: u64, len: u64) -> Result<u64> {
        for (from, to) in [(goal, self.blocks), (self.first, goal.min(self.blocks))] {
            let mut start = from;
            while start + len <= to {
                match (start..start + len).rev().find(|&b| self.is_used(b)) {
                    Some(b) => start = b + 1,
                    None => {
                        self.mark(start, len);
                        return Ok(start);
                    }
                }
            }
        }
        Err(Error::NoSpace(format!("no run of {len} free blocks for filesystem metadata")))
    }
}

/// The planned geometry.
struct Layout {
    bs: u64,
    blocks: u64,
    first_data_block: u64,
    bpg: u64,
    groups: u64,
    ipg: u64,
    inode_size: u64,
    itable_blocks: u64,
    desc_size: u64,
    gdt_blocks: u64,
}

impl Layout {
    fn group_start(&self, g: u64) -> u64 {
        self.first_data_block + g * self.bpg
    }
    fn group_blocks(&self, g: u64) -> u64 {
        (self.blocks - self.group_start(g)).min(self.bpg)
    }
}

/// The sizes mkfs makes; checked before the image is touched.
fn check_size(size: u64) -> Result<()> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
        return Err(Error::Invalid(format!("size {size} is outside 8 MiB ..= 1 TiB")));
    }
    Ok(())
}

fn plan(opts: &MkfsOptions, features: &[u32; 3]) -> Result<Layout> {
    check_size(opts.size)?;
    let small = opts.size < 512 << 20;
    let bs = opts.block_size.unwrap_or(if small { 1024 } else { 4096 }) as u64;
    if !(1024..=65536).contains(&bs) || !bs.is_power_of_two() {
        return Err(Error::Invalid(format!("block size {bs} is not a power of two from 1024 to 65536")));
    }
    let isz = opts.inode_size as u64;
    if !(128..=bs).contains(&isz) || !isz.is_power_of_two() {
        return Err(Error::Invalid(format!("inode size {isz} is not a power of two from 128 to the block size")));
    }
    let inode_ratio: u64 = if small { 4096 } else { 16384 };
    let first_data_block = u64::from(bs == 1024);
    let bpg = 8 * bs;
    let desc_size = if features[1] & INCOMPAT_64BIT != 0 { 64 } else { 32 };
    let flex = features[1] & INCOMPAT_FLEX_BG != 0;
    let mut blocks = opts.size / bs;
    if features[1] & INCOMPAT_64BIT == 0 && blocks > u32::MAX as u64 {
        return Err(Error::Invalid("more than 2^32 blocks needs the 64bit feature".into()));
    }
    loop {
        let groups = (blocks - first_data_block).div_ceil(bpg);
        let total_inodes = opts.inodes.unwrap_or(blocks * bs / inode_ratio).max(FIRST_INO as u64 + 1);
        // Inodes per group: enough for the total, filling whole table blocks, at most 8 x bs.
        let per_block = bs / isz;
        let mut ipg = total_inodes.div_ceil(groups);
        ipg = ipg.div_ceil(per_block) * per_block;
        ipg = ipg.div_ceil(8) * 8;
        ipg = ipg.min(8 * bs).min(u32::MAX as u64 / groups);
        let itable_blocks = (ipg * isz).div_ceil(bs);
        let gdt_blocks = (groups * desc_size).div_ceil(bs);
        let layout = Layout {
            bs,
            blocks,
            first_data_block,
            bpg,
            groups,
            ipg,
            inode_size: isz,
            itable_blocks,
            desc_size,
            gdt_blocks,
        };
        let last = groups - 1;
        let rem = layout.group_blocks(last);
        let sb_overhead = if group_has_superblock_plain(features, last as u32) { 1 + gdt_blocks } else { 0 };
        let overhead = sb_overhead + if flex { 0 } else { 2 + itable_blocks };
        if groups > 1 && rem < overhead + 50 {
            blocks -= rem;
            continue;
        }
        if groups == 1 && rem < 1 + gdt_blocks + 2 + itable_blocks + 64 {
            return Err(Error::Invalid(format!("{} bytes is too small for an ext4 filesystem", opts.size)));
        }
        return Ok(layout);
    }
}

/// group_has_superblock for a filesystem not yet described by a superblock.
fn group_has_superblock_plain(features: &[u32; 3], group: u32) -> bool {
    let mut sb = Superblock::zeroed();
    sb.s_feature_ro_compat = features[2];
    group_has_superblock(&sb, group)
}

/// Blocks to write, keyed by block number.
type Writes = BTreeMap<u64, Vec<u8>>;

/// Writes an extent tree mapping [0, len) onto `start..` for `ino`; returns the
/// i_block area and the extra tree blocks used (0 or 1 leaf).
fn extent_tree_for_run(
    start: u64,
    len: u64,
    ino: u32,
    inode_seed: Option<u32>,
    bs: usize,
    map: &mut BlockMap,
    writes: &mut Writes,
) -> Result<([u8; 60], u64)> {
    let max = extent::EXT_INIT_MAX_LEN as u64;
    let extents: Vec<Extent> = (0..len.div_ceil(max))
        .map(|i| Extent {
            ee_block: (i * max) as u32,
            len: (len - i * max).min(max) as u32,
            unwritten: false,
            start: start + i * max,
        })
        .collect();
    let mut root = [0u8; 60];
    let root_header = |entries: usize, depth: u16| ExtentHeader {
        eh_magic: EXT4_EXT_MAGIC,
        eh_entries: entries as u16,
        eh_max: 4,
        eh_depth: depth,
        eh_generation: 0,
    };
    if extents.len() <= 4 {
        ExtentNode::Leaf(root_header(extents.len(), 0), extents).write(&mut root);
        return Ok((root, 0));
    }
    let per_block = extent::max_entries_in_block(bs);
    if extents.len() > per_block as usize {
        return Err(Error::unsupported(format!("a {len}-block journal needs a deeper extent tree (inode {ino})")));
    }
    let leaf_blk = map.alloc(start + len, 1)?;
    let mut leaf = vec![0u8; bs];
    let h = ExtentHeader {
        eh_magic: EXT4_EXT_MAGIC,
        eh_entries: extents.len() as u16,
        eh_max: per_block,
        eh_depth: 0,
        eh_generation: 0,
    };
    ExtentNode::Leaf(h, extents).write(&mut leaf);
    if let Some(seed) = inode_seed {
        extent::set_block_checksum(&mut leaf, seed);
    }
    writes.insert(leaf_blk, leaf);
    ExtentNode::Index(root_header(1, 1), vec![ExtentIndex { ei_block: 0, leaf: leaf_blk }]).write(&mut root);
    Ok((root, 1))
}

/// A block map (no extents) for [0, len) onto `start..`: direct, then single and
/// double indirect blocks. Returns i_block and the indirect blocks used.
fn block_map_for_run(
    start: u64,
    len: u64,
    bs: usize,
    map: &mut BlockMap,
    writes: &mut Writes,
) -> Result<([u8; 60], u64)> {
    let per = (bs / 4) as u64;
    if len > 12 + per + per * per {
        return Err(Error::unsupported("block-mapped run beyond double indirect".to_string()));
    }
    let mut ib = [0u8; 60];
    let mut extra = 0;
    let put = |b: &mut [u8], i: usize, v: u64| b[i * 4..i * 4 + 4].copy_from_slice(&(v as u32).to_le_bytes());
    for i in 0..len.min(12) {
        put(&mut ib, i as usize, start + i);
    }
    let mut next = 12;
    if len > next {
        put(&mut ib, 12, indirect_block(map, writes, start + len, start + next, (len - next).min(per), bs)?);
        extra += 1;
        next += per;
    }
    if len > next {
        let dind = map.alloc(start + len, 1)?;
        extra += 1;
        let mut d = vec![0u8; bs];
        let mut k = 0;
        while len > next {
            put(&mut d, k, indirect_block(map, writes, start + len, start + next, (len - next).min(per), bs)?);
            extra += 1;
            k += 1;
            next += per;
        }
        writes.insert(dind, d);
        put(&mut ib, 13, dind);
    }
    Ok((ib, extra))
}

/// Allocates (near `goal`) one indirect block mapping `count` consecutive blocks from `first`.
fn indirect_block(
    map: &mut BlockMap,
    writes: &mut Writes,
    goal: u64,
    first: u64,
    count: u64,
    bs: usize,
) -> Result<u64> {
    let pblk = map.alloc(goal, 1)?;
    let mut block = vec![0u8; bs];
    for (i, slot) in block.chunks_exact_mut(4).take(count as usize).enumerate() {
        slot.copy_from_slice(&((first + i as u64) as u32).to_le_bytes());
    }
    writes.insert(pblk, block);
    Ok(pblk)
}

/// Creates (or overwrites) the image at `path` and makes a filesystem on it
/// (with `opts.region` set, in place inside the existing image).
///
/// # Errors
/// `Invalid` for a size, block size, inode size or label out of range;
/// `Unsupported` for a feature mkfs cannot make (named); `Busy` while the image
/// is in use; `Io` when it cannot be created or written.
///
/// # Examples
/// ```
/// let image = std::env::temp_dir().join(format!("uext4-mkfs-doc-{}", std::process::id()));
/// let opts = uext4::mkfs::MkfsOptions { size: 32 << 20, label: "data".into(), ..Default::default() };
/// let sb = uext4::mkfs::mkfs(&image, &opts)?;
/// assert_eq!(sb.s_blocks_count * sb.block_size() as u64, 32 << 20);
/// std::fs::remove_file(&image)?;
/// # Ok::<(), uext4::Error>(())
/// ```
pub fn mkfs(path: &Path, opts: &MkfsOptions) -> Result<Superblock> {
    if opts.region != crate::dev::Region::Whole {
        return mkfs_in_region(path, opts);
    }
    let meta = std::fs::metadata(path);
    let is_block_device = meta.as_ref().map(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_block_device()
    });
    let fresh = !matches!(is_block_device, Ok(true));
    // A refused request (size, features, block size, layout) must leave an
    // existing file as it was, so everything that can refuse without the
    // device runs before the file is opened, let alone truncated.
    if fresh {
        check_size(opts.size)?;
        // The whole build, its writes dropped: every refusal `make` can give
        // (a label too long, no room for the journal, a layout that does not
        // fit) comes out here.
        make(&DiscardDevice { size: opts.size }, opts, true)?;
    }
    if fresh {
        // Made if missing, never truncated here: the lock comes first.
        std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display()))))?;
    }
    // The image's lock before anything is destroyed: a file a mount or another
    // uext4 process is using is refused here as it was.
    let mut dev = FileDevice::open(path, true)?;
    if fresh {
        dev.zero_fill(opts.size)?;
    }
    if dev.size() < opts.size {
        return Err(Error::Invalid(format!("{} holds only {} bytes", path.display(), dev.size())));
    }
    make(&dev, opts, fresh)
}

/// A device of `size` zero bytes that drops what is written to it: a dry run
/// of `make`.
struct DiscardDevice {
    size: u64,
}

impl BlockDevice for DiscardDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > self.size) {
            return Err(Error::corrupt("a read past the end of the planned filesystem", format!("offset {offset}")));
        }
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > self.size) {
            return Err(Error::corrupt("a write past the end of the planned filesystem", format!("offset {offset}")));
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn stats(&self) -> crate::dev::IoStats {
        crate::dev::IoStats::default()
    }
}

/// A filesystem in a region of an existing image or device, written in place
/// (nothing truncated, nothing outside the region touched).
fn mkfs_in_region(path: &Path, opts: &MkfsOptions) -> Result<Superblock> {
    let file = FileDevice::open_for_mkfs(path, opts.region, opts.size)?;
    let dev = crate::dev::BoundedDevice::open(std::sync::Arc::new(file), opts.region)?;
    let mut opts = opts.clone();
    if opts.size == 0 {
        opts.size = dev.size();
    }
    if dev.size() < opts.size {
        return Err(Error::Invalid(format!(
            "the region of {} holds only {} bytes, less than the {} asked for",
            path.display(),
            dev.size(),
            opts.size
        )));
    }
    make(dev.as_ref(), &opts, false)
}

/// Makes a filesystem on `dev`; `zeroed` says the device reads as zeros already
/// (a fresh file or a new `MemDevice`), so the inode tables need no writing.
///
/// # Errors
/// As [`mkfs`]; `Corrupt` when `dev` is smaller than `opts.size` (a write past
/// its end).
pub fn make(dev: &dyn BlockDevice, opts: &MkfsOptions, zeroed: bool) -> Result<Superblock> {
    let features = apply_features(&opts.features)?;
    let l = plan(opts, &features)?;
    let bs = l.bs as usize;
    let now = opts.now.unwrap_or_else(crate::clock::coarse_seconds);
    let metadata_csum = features[2] & RO_COMPAT_METADATA_CSUM != 0;
    let uninit = metadata_csum || features[2] & RO_COMPAT_GDT_CSUM != 0;
    let flex = features[1] & INCOMPAT_FLEX_BG != 0;
    let extents = features[1] & INCOMPAT_EXTENTS != 0;
    // Without `filetype` the byte after name_len is the high byte of a 16-bit
    // name_len, so the entries of the root and lost+found carry 0 there.
    let dir_type = if features[1] & INCOMPAT_FILETYPE != 0 { EXT4_FT_DIR } else { 0 };
    let has_journal = features[0] & COMPAT_HAS_JOURNAL != 0;

    // The superblock first: other structures' checksums depend on its seed.
    let mut sb = Superblock::zeroed();
    sb.s_inodes_count = (l.ipg * l.groups) as u32;
    sb.s_blocks_count = l.blocks;
    sb.s_r_blocks_count = l.blocks * 5 / 100;
    sb.s_first_data_block = l.first_data_block as u32;
    sb.s_log_block_size = (bs.trailing_zeros() - 10) as u32;
    sb.s_log_cluster_size = sb.s_log_block_size;
    sb.s_blocks_per_group = l.bpg as u32;
    sb.s_clusters_per_group = l.bpg as u32;
    sb.s_inodes_per_group = l.ipg as u32;
    sb.s_wtime = now;
    sb.s_max_mnt_count = -1;
    sb.s_state = EXT4_VALID_FS;
    sb.s_errors = 1; // continue
    sb.s_lastcheck = now;
    sb.s_rev_level = 1;
    sb.s_first_ino = FIRST_INO;
    sb.s_inode_size = l.inode_size as u16;
    sb.s_feature_compat = features[0];
    sb.s_feature_incompat = features[1];
    sb.s_feature_ro_compat = features[2];
    sb.s_uuid = opts.uuid.unwrap_or_else(random_bytes);
    let label = opts.label.as_bytes();
    if label.len() > 16 {
        return Err(Error::Invalid(format!("label '{}' is longer than 16 bytes", opts.label)));
    }
    sb.s_volume_name[..label.len()].copy_from_slice(label);
    let seed_bytes = opts.hash_seed.unwrap_or_else(random_bytes);
    for i in 0..4 {
        sb.s_hash_seed[i] = u32::from_le_bytes(seed_bytes[i * 4..i * 4 + 4].try_into().unwrap());
    }
    sb.s_def_hash_version = 1; // half_md4
    sb.s_desc_size = if features[1] & INCOMPAT_64BIT != 0 { l.desc_size as u16 } else { 0 };
    sb.s_default_mount_opts = 0x0004 | 0x0008; // user_xattr, acl
    sb.s_mkfs_time = now;
    if l.inode_size > 128 {
        sb.s_min_extra_isize = 32;
        sb.s_want_extra_isize = 32;
    }
    // x86's char is signed, and mke2fs records the hash flavour of the host.
    sb.s_flags = EXT2_FLAGS_SIGNED_HASH;
    if flex {
        sb.s_log_groups_per_flex = LOG_GROUPS_PER_FLEX;
    }
    if metadata_csum {
        sb.s_checksum_type = 1;
        if features[1] & INCOMPAT_CSUM_SEED != 0 {
            sb.s_checksum_seed = crate::format::csum::crc32c(!0, &sb.s_uuid);
        }
    }
    let csum_seed = sb.csum_seed();
    let fs_seed = if metadata_csum { Some(csum_seed) } else { None };
    let gd_csum = if metadata_csum {
        GdCsum::Crc32c { seed: csum_seed }
    } else if uninit {
        GdCsum::Crc16 { uuid: sb.s_uuid }
    } else {
        GdCsum::None
    };

    // Reserve superblock and descriptor copies, then place group metadata.
    let mut map = BlockMap::new(l.blocks, l.first_data_block);
    map.mark(0, l.first_data_block);
    for g in 0..l.groups {
        if group_has_superblock(&sb, g as u32) {
            map.mark(l.group_start(g), 1 + l.gdt_blocks);
        }
    }
    let mut gds: Vec<GroupDesc> = vec![GroupDesc::default(); l.groups as usize];
    let flex_size = if flex { 1u64 << LOG_GROUPS_PER_FLEX } else { 1 };
    for fg in (0..l.groups).step_by(flex_size as usize) {
        let members = fg..(fg + flex_size).min(l.groups);
        let goal = l.group_start(fg);
        for g in members.clone() {
            let goal = if flex { goal } else { l.group_start(g) };
            gds[g as usize].bg_block_bitmap = map.alloc(goal, 1)?;
        }
        for g in members.clone() {
            let goal = if flex { goal } else { l.group_start(g) };
            gds[g as usize].bg_inode_bitmap = map.alloc(goal, 1)?;
        }
        for g in members {
            let goal = if flex { goal } else { l.group_start(g) };
            gds[g as usize].bg_inode_table = map.alloc(goal, l.itable_blocks)?;
        }
    }

    let mut writes: Writes = BTreeMap::new();
    let mut inodes: BTreeMap<u32, Inode> = BTreeMap::new();
    let new_inode = |mode: u16, links: u16| {
        let mut i = Inode::new(l.inode_size as usize, if l.inode_size > 128 { 32 } else { 0 });
        i.i_mode = mode;
        i.i_links_count = links;
        let t = Timestamp { sec: now as i64, nsec: 0 };
        i.i_atime = t;
        i.i_ctime = t;
        i.i_mtime = t;
        if l.inode_size > 128 {
            i.i_crtime = Some(t);
        }
        i
    };
    let sectors = (bs / 512) as u64;

    // Places a file's data run and its mapping; returns i_block, flags and blocks used.
    let map_run = |ino: u32, start: u64, len: u64, inode: &Inode, map: &mut BlockMap, writes: &mut Writes| {
        if extents {
            let seed = fs_seed.map(|s| inode_csum_seed(s, ino, inode.i_generation));
            extent_tree_for_run(start, len, ino, seed, bs, map, writes).map(|(ib, extra)| (ib, EXT4_EXTENTS_FL, extra))
        } else {
            block_map_for_run(start, len, bs, map, writes).map(|(ib, extra)| (ib, 0, extra))
        }
    };

    // Root directory: ".", "..", "lost+found".
    let root_blk = map.alloc(gds[0].bg_inode_table + l.itable_blocks, 1)?;
    let mut root = new_inode(S_IFDIR | 0o755, 3);
    let (ib, flags, extra) = map_run(ROOT_INO, root_blk, 1, &root, &mut map, &mut writes)?;
    root.i_block = ib;
    root.i_flags = flags;
    root.i_size = l.bs;
    root.i_blocks = (1 + extra) * sectors;
    let tail = if metadata_csum { dirent::DIRENT_TAIL_LEN } else { 0 };
    let mut blk = vec![0u8; bs];
    dirent::write_entry(&mut blk, 0, ROOT_INO, 12, dir_type, b".", bs);
    dirent::write_entry(&mut blk, 12, ROOT_INO, 12, dir_type, b"..", bs);
    dirent::write_entry(&mut blk, 24, LOST_FOUND_INO, bs - 24 - tail, dir_type, b"lost+found", bs);
    if let Some(s) = fs_seed {
        dirent::set_tail(&mut blk, inode_csum_seed(s, ROOT_INO, 0));
    }
    writes.insert(root_blk, blk);
    inodes.insert(ROOT_INO, root);

    // lost+found: 16 KiB (at least one block), so e2fsck can reconnect without allocating.
    let lpf_len = (16384 / l.bs).max(1);
    let lpf_start = map.alloc(root_blk + 1, lpf_len)?;
    let mut lpf = new_inode(S_IFDIR | 0o700, 2);
    let (ib, flags, extra) = map_run(LOST_FOUND_INO, lpf_start, lpf_len, &lpf, &mut map, &mut writes)?;
    lpf.i_block = ib;
    lpf.i_flags = flags;
    lpf.i_size = lpf_len * l.bs;
    lpf.i_blocks = (lpf_len + extra) * sectors;
    for i in 0..lpf_len {
        let mut blk = vec![0u8; bs];
        if i == 0 {
            dirent::write_entry(&mut blk, 0, LOST_FOUND_INO, 12, dir_type, b".", bs);
            dirent::write_entry(&mut blk, 12, ROOT_INO, bs - 12 - tail, dir_type, b"..", bs);
        } else {
            dirent::write_entry(&mut blk, 0, 0, bs - tail, 0, b"", bs);
        }
        if let Some(s) = fs_seed {
            dirent::set_tail(&mut blk, inode_csum_seed(s, LOST_FOUND_INO, 0));
        }
        writes.insert(lpf_start + i, blk);
    }
    inodes.insert(LOST_FOUND_INO, lpf);

    // The journal: one contiguous run near the middle, starting at a group boundary.
    if has_journal {
        let jblocks = default_journal_blocks(l.blocks);
        if jblocks == 0 {
            return Err(Error::Invalid("filesystem too small for a journal; use -O ^has_journal".into()));
        }
        let mid_group = (l.groups / 2) / flex_size * flex_size;
        let jstart = map.alloc(l.group_start(mid_group), jblocks)?;
        let mut j = new_inode(S_IFREG | 0o600, 1);
        let (ib, flags, extra) = map_run(JOURNAL_INO, jstart, jblocks, &j, &mut map, &mut writes)?;
        j.i_block = ib;
        j.i_flags = flags;
        j.i_size = jblocks * l.bs;
        j.i_blocks = (jblocks + extra) * sectors;
        let mut jsb = vec![0u8; bs];
        let be = |b: &mut [u8], off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_be_bytes());
        be(&mut jsb, 0x0, JBD2_MAGIC);
        be(&mut jsb, 0x4, JBD2_SUPERBLOCK_V2);
        be(&mut jsb, 0xC, bs as u32); // s_blocksize
        be(&mut jsb, 0x10, jblocks as u32); // s_maxlen
        be(&mut jsb, 0x14, 1); // s_first
        be(&mut jsb, 0x18, 1); // s_sequence
        jsb[0x30..0x40].copy_from_slice(&sb.s_uuid);
        be(&mut jsb, 0x40, 1); // s_nr_users
        writes.insert(jstart, jsb);
        if !zeroed {
            // Stale journal blocks are never replayed (s_start is 0), but zero them
            // anyway so nothing old is mistaken for a transaction.
            for b in 1..jblocks {
                writes.insert(jstart + b, vec![0u8; bs]);
            }
        }
        sb.s_journal_inum = JOURNAL_INO;
        for (k, w) in sb.s_jnl_blocks.iter_mut().take(15).enumerate() {
            *w = u32::from_le_bytes(j.i_block[k * 4..k * 4 + 4].try_into().unwrap());
        }
        sb.s_jnl_blocks[15] = (j.i_size >> 32) as u32;
        sb.s_jnl_blocks[16] = j.i_size as u32;
        sb.s_jnl_backup_type = 1; // EXT3_JNL_BACKUP_BLOCKS
        inodes.insert(JOURNAL_INO, j);
    }

    // Bitmaps, counts and flags per group.
    let mut free_blocks_total = 0;
    for g in 0..l.groups {
        let gstart = l.group_start(g);
        let gblocks = l.group_blocks(g);
        let mut bb = vec![0u8; bs];
        let mut used = 0;
        for i in 0..gblocks {
            if map.is_used(gstart + i) {
                bitmap::set_bit(&mut bb, i as usize);
                used += 1;
            }
        }
        // Bits past the end of a short last group are set, as the kernel expects.
        for i in gblocks..(8 * l.bs) {
            bitmap::set_bit(&mut bb, i as usize);
        }
        let mut ib = vec![0u8; bs];
        let used_inodes = if g == 0 { FIRST_INO as u64 } else { 0 };
        for i in 0..used_inodes {
            bitmap::set_bit(&mut ib, i as usize);
        }
        for i in l.ipg..(8 * l.bs) {
            bitmap::set_bit(&mut ib, i as usize);
        }
        let gd = &mut gds[g as usize];
        gd.bg_free_blocks_count = (gblocks - used) as u32;
        gd.bg_free_inodes_count = (l.ipg - used_inodes) as u32;
        gd.bg_used_dirs_count = if g == 0 { 2 } else { 0 };
        if uninit {
            gd.bg_itable_unused = (l.ipg - used_inodes) as u32;
            if g != 0 {
                gd.bg_flags |= EXT4_BG_INODE_UNINIT;
            }
            if zeroed {
                gd.bg_flags |= EXT4_BG_INODE_ZEROED;
            }
        }
        if metadata_csum {
            gd.bg_block_bitmap_csum = bitmap::checksum(&bb, l.bpg as u32, csum_seed);
            gd.bg_inode_bitmap_csum = bitmap::checksum(&ib, l.ipg as u32, csum_seed);
        }
        free_blocks_total += gblocks - used;
        writes.insert(gd.bg_block_bitmap, bb);
        writes.insert(gd.bg_inode_bitmap, ib);
        if !zeroed || !uninit {
            for b in 0..l.itable_blocks {
                writes.entry(gd.bg_inode_table + b).or_insert_with(|| vec![0u8; bs]);
            }
        }
    }
    sb.s_free_blocks_count = free_blocks_total;
    sb.s_free_inodes_count = sb.s_inodes_count - FIRST_INO;

    // Inodes 1..=11: the reserved ones are zero apart from their checksum, as mke2fs
    // writes them; the bad-blocks inode gets times.
    let itable0 = gds[0].bg_inode_table;
    for ino in 1..=FIRST_INO {
        let inode = match inodes.remove(&ino) {
            Some(i) => i,
            None => {
                let mut i = Inode::new(l.inode_size as usize, 0);
                if ino == 1 {
                    let t = Timestamp { sec: now as i64, nsec: 0 };
                    (i.i_atime, i.i_ctime, i.i_mtime) = (t, t, t);
                }
                i
            }
        };
        let raw = inode.to_bytes(ino, fs_seed);
        let byte = (ino as u64 - 1) * l.inode_size;
        let blk = writes.entry(itable0 + byte / l.bs).or_insert_with(|| vec![0u8; bs]);
        let off = (byte % l.bs) as usize;
        blk[off..off + raw.len()].copy_from_slice(&raw);
    }

    // Descriptor table, then the superblock and its backups.
    let mut gdt = vec![0u8; (l.gdt_blocks * l.bs) as usize];
    for (g, gd) in gds.iter().enumerate() {
        let off = g * l.desc_size as usize;
        gd.write(&mut gdt[off..off + l.desc_size as usize], l.desc_size as usize, g as u32, gd_csum);
    }
    for g in 0..l.groups {
        if !group_has_superblock(&sb, g as u32) {
            continue;
        }
        let start = l.group_start(g);
        sb.s_block_group_nr = g as u16;
        let sb_bytes = sb.to_bytes();
        if g == 0 {
            // Byte 1024 of the device: in block 1 with 1 KiB blocks, else inside block 0.
            let (blk, off) = if bs == 1024 { (1, 0) } else { (0, 1024) };
            let b = writes.entry(blk).or_insert_with(|| vec![0u8; bs]);
            b[off..off + SUPERBLOCK_SIZE].copy_from_slice(&sb_bytes);
        } else {
            let mut b = vec![0u8; bs];
            b[..SUPERBLOCK_SIZE].copy_from_slice(&sb_bytes);
            writes.insert(start, b);
        }
        for i in 0..l.gdt_blocks {
            let s = (i * l.bs) as usize;
            writes.insert(start + 1 + i, gdt[s..s + bs].to_vec());
        }
    }
    sb.s_block_group_nr = 0;

    for (blk, data) in &writes {
        dev.write_at(blk * l.bs, data)?;
    }
    dev.flush()?;
    Ok(sb)
}
