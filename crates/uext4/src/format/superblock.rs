//! The ext4 superblock: 1024 bytes at byte offset 1024 of the device.
//!
//! `Superblock` keeps the raw bytes it was parsed from, so `to_bytes` writes back every
//! field this code does not model (error records, mount options, quota inodes...)
//! unchanged: a parse/serialize round trip is byte-exact. The checksum (metadata_csum)
//! is crc32c(~0, bytes[..0x3FC]) with no per-filesystem seed.

use super::bytes::*;
use super::csum::crc32c;
use crate::error::{Error, Result};

pub const SUPERBLOCK_OFFSET: u64 = 1024;
pub const SUPERBLOCK_SIZE: usize = 1024;
pub const EXT4_SUPER_MAGIC: u16 = 0xEF53;

// s_feature_compat
pub const COMPAT_DIR_PREALLOC: u32 = 0x1;
pub const COMPAT_IMAGIC_INODES: u32 = 0x2;
pub const COMPAT_HAS_JOURNAL: u32 = 0x4;
pub const COMPAT_EXT_ATTR: u32 = 0x8;
pub const COMPAT_RESIZE_INODE: u32 = 0x10;
pub const COMPAT_DIR_INDEX: u32 = 0x20;
pub const COMPAT_SPARSE_SUPER2: u32 = 0x200;
pub const COMPAT_FAST_COMMIT: u32 = 0x400;
pub const COMPAT_STABLE_INODES: u32 = 0x800;
pub const COMPAT_ORPHAN_FILE: u32 = 0x1000;

// s_feature_ro_compat
pub const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
pub const RO_COMPAT_LARGE_FILE: u32 = 0x2;
pub const RO_COMPAT_HUGE_FILE: u32 = 0x8;
pub const RO_COMPAT_GDT_CSUM: u32 = 0x10;
pub const RO_COMPAT_DIR_NLINK: u32 = 0x20;
pub const RO_COMPAT_EXTRA_ISIZE: u32 = 0x40;
pub const RO_COMPAT_QUOTA: u32 = 0x100;
pub const RO_COMPAT_BIGALLOC: u32 = 0x200;
pub const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
pub const RO_COMPAT_READONLY: u32 = 0x1000;
pub const RO_COMPAT_PROJECT: u32 = 0x2000;
pub const RO_COMPAT_VERITY: u32 = 0x8000;
pub const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;

// s_feature_incompat
pub const INCOMPAT_COMPRESSION: u32 = 0x1;
pub const INCOMPAT_FILETYPE: u32 = 0x2;
pub const INCOMPAT_RECOVER: u32 = 0x4;
pub const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
pub const INCOMPAT_META_BG: u32 = 0x10;
pub const INCOMPAT_EXTENTS: u32 = 0x40;
pub const INCOMPAT_64BIT: u32 = 0x80;
pub const INCOMPAT_MMP: u32 = 0x100;
pub const INCOMPAT_FLEX_BG: u32 = 0x200;
pub const INCOMPAT_EA_INODE: u32 = 0x400;
pub const INCOMPAT_DIRDATA: u32 = 0x1000;
pub const INCOMPAT_CSUM_SEED: u32 = 0x2000;
pub const INCOMPAT_LARGEDIR: u32 = 0x4000;
pub const INCOMPAT_INLINE_DATA: u32 = 0x8000;
pub const INCOMPAT_ENCRYPT: u32 = 0x10000;
pub const INCOMPAT_CASEFOLD: u32 = 0x20000;

// s_flags
pub const EXT2_FLAGS_SIGNED_HASH: u32 = 0x1;
pub const EXT2_FLAGS_UNSIGNED_HASH: u32 = 0x2;

// s_state
pub const EXT4_VALID_FS: u16 = 0x1;
pub const EXT4_ERROR_FS: u16 = 0x2;
pub const EXT4_ORPHAN_FS: u16 = 0x4;

/// Names of the feature bits, as dumpe2fs prints them, in (word, bit, name) triples.
/// word: 0 = compat, 1 = incompat, 2 = ro_compat.
pub const FEATURE_NAMES: &[(u8, u32, &str)] = &[
    (0, COMPAT_HAS_JOURNAL, "has_journal"),
    (0, COMPAT_EXT_ATTR, "ext_attr"),
    (0, COMPAT_RESIZE_INODE, "resize_inode"),
    (0, COMPAT_DIR_INDEX, "dir_index"),
    (0, COMPAT_DIR_PREALLOC, "dir_prealloc"),
    (0, COMPAT_IMAGIC_INODES, "imagic_inodes"),
    (0, COMPAT_SPARSE_SUPER2, "sparse_super2"),
    (0, COMPAT_FAST_COMMIT, "fast_commit"),
    (0, COMPAT_STABLE_INODES, "stable_inodes"),
    (0, COMPAT_ORPHAN_FILE, "orphan_file"),
    (1, INCOMPAT_COMPRESSION, "compression"),
    (1, INCOMPAT_FILETYPE, "filetype"),
    (1, INCOMPAT_RECOVER, "needs_recovery"),
    (1, INCOMPAT_JOURNAL_DEV, "journal_dev"),
    (1, INCOMPAT_EXTENTS, "extent"),
    (1, INCOMPAT_64BIT, "64bit"),
    (1, INCOMPAT_FLEX_BG, "flex_bg"),
    (1, INCOMPAT_META_BG, "meta_bg"),
    (1, INCOMPAT_MMP, "mmp"),
    (1, INCOMPAT_EA_INODE, "ea_inode"),
    (1, INCOMPAT_DIRDATA, "dirdata"),
    (1, INCOMPAT_CSUM_SEED, "metadata_csum_seed"),
    (1, INCOMPAT_LARGEDIR, "large_dir"),
    (1, INCOMPAT_INLINE_DATA, "inline_data"),
    (1, INCOMPAT_ENCRYPT, "encrypt"),
    (1, INCOMPAT_CASEFOLD, "casefold"),
    (2, RO_COMPAT_SPARSE_SUPER, "sparse_super"),
    (2, RO_COMPAT_LARGE_FILE, "large_file"),
    (2, RO_COMPAT_HUGE_FILE, "huge_file"),
    (2, RO_COMPAT_GDT_CSUM, "uninit_bg"),
    (2, RO_COMPAT_DIR_NLINK, "dir_nlink"),
    (2, RO_COMPAT_EXTRA_ISIZE, "extra_isize"),
    (2, RO_COMPAT_QUOTA, "quota"),
    (2, RO_COMPAT_BIGALLOC, "bigalloc"),
    (2, RO_COMPAT_METADATA_CSUM, "metadata_csum"),
    (2, RO_COMPAT_READONLY, "read-only"),
    (2, RO_COMPAT_PROJECT, "project"),
    (2, RO_COMPAT_VERITY, "verity"),
    (2, RO_COMPAT_ORPHAN_PRESENT, "orphan_present"),
];

/// The superblock fields uext4 uses, named as in the kernel's `struct ext4_super_block`.
#[derive(Clone, Debug)]
pub struct Superblock {
    pub s_inodes_count: u32,
    pub s_blocks_count: u64,
    pub s_r_blocks_count: u64,
    pub s_free_blocks_count: u64,
    pub s_free_inodes_count: u32,
    pub s_first_data_block: u32,
    pub s_log_block_size: u32,
    pub s_log_cluster_size: u32,
    pub s_blocks_per_group: u32,
    pub s_clusters_per_group: u32,
    pub s_inodes_per_group: u32,
    pub s_mtime: u64,
    pub s_wtime: u64,
    pub s_mnt_count: u16,
    pub s_max_mnt_count: i16,
    pub s_magic: u16,
    pub s_state: u16,
    pub s_errors: u16,
    pub s_minor_rev_level: u16,
    pub s_lastcheck: u64,
    pub s_checkinterval: u32,
    pub s_creator_os: u32,
    pub s_rev_level: u32,
    pub s_def_resuid: u16,
    pub s_def_resgid: u16,
    pub s_first_ino: u32,
    pub s_inode_size: u16,
    pub s_block_group_nr: u16,
    pub s_feature_compat: u32,
    pub s_feature_incompat: u32,
    pub s_feature_ro_compat: u32,
    pub s_uuid: [u8; 16],
    pub s_volume_name: [u8; 16],
    pub s_last_mounted: [u8; 64],
    pub s_reserved_gdt_blocks: u16,
    pub s_journal_uuid: [u8; 16],
    pub s_journal_inum: u32,
    pub s_journal_dev: u32,
    pub s_last_orphan: u32,
    pub s_hash_seed: [u32; 4],
    pub s_def_hash_version: u8,
    pub s_jnl_backup_type: u8,
    pub s_desc_size: u16,
    pub s_default_mount_opts: u32,
    pub s_first_meta_bg: u32,
    pub s_mkfs_time: u64,
    pub s_jnl_blocks: [u32; 17],
    pub s_min_extra_isize: u16,
    pub s_want_extra_isize: u16,
    pub s_flags: u32,
    pub s_raid_stride: u16,
    pub s_mmp_interval: u16,
    pub s_mmp_block: u64,
    pub s_raid_stripe_width: u32,
    pub s_log_groups_per_flex: u8,
    pub s_checksum_type: u8,
    pub s_kbytes_written: u64,
    pub s_overhead_clusters: u32,
    pub s_backup_bgs: [u32; 2],
    pub s_lpf_ino: u32,
    pub s_checksum_seed: u32,
    pub s_encoding: u16,
    pub s_orphan_file_inum: u32,
    pub s_checksum: u32,
    raw: Box<[u8; SUPERBLOCK_SIZE]>,
}

/// A 32-bit time with its separate high byte (s_*_time_hi) joined, as the kernel does.
fn time_with_hi(lo: u32, hi: u8) -> u64 {
    (lo as u64) | ((hi as u64) << 32)
}

impl Superblock {
    /// Parses and sanity-checks a superblock. The checksum is verified unless
    /// `verify_checksum` is false (the `ignore_checksums` open option).
    pub fn parse(b: &[u8], verify_checksum: bool) -> Result<Superblock> {
        if b.len() < SUPERBLOCK_SIZE {
            return Err(Error::corrupt("superblock is truncated", "superblock at byte 1024"));
        }
        let sb = Self::from_bytes(b[..SUPERBLOCK_SIZE].try_into().unwrap());
        sb.validate(verify_checksum)?;
        Ok(sb)
    }

    /// Extracts the fields without judging them (mkfs starts from this).
    pub fn from_bytes(b: &[u8; SUPERBLOCK_SIZE]) -> Superblock {
        let mut raw = Box::new([0u8; SUPERBLOCK_SIZE]);
        raw.copy_from_slice(b);
        let mut hash_seed = [0u32; 4];
        for (i, s) in hash_seed.iter_mut().enumerate() {
            *s = le32(b, 0xEC + 4 * i);
        }
        let mut jnl_blocks = [0u32; 17];
        for (i, s) in jnl_blocks.iter_mut().enumerate() {
            *s = le32(b, 0x10C + 4 * i);
        }
        let incompat = le32(b, 0x60);
        let is_64bit = incompat & INCOMPAT_64BIT != 0;
        let hi = |off: usize| if is_64bit { le32(b, off) } else { 0 };
        Superblock {
            s_inodes_count: le32(b, 0x0),
            s_blocks_count: lo_hi(le32(b, 0x4), hi(0x150)),
            s_r_blocks_count: lo_hi(le32(b, 0x8), hi(0x154)),
            s_free_blocks_count: lo_hi(le32(b, 0xC), hi(0x158)),
            s_free_inodes_count: le32(b, 0x10),
            s_first_data_block: le32(b, 0x14),
            s_log_block_size: le32(b, 0x18),
            s_log_cluster_size: le32(b, 0x1C),
            s_blocks_per_group: le32(b, 0x20),
            s_clusters_per_group: le32(b, 0x24),
            s_inodes_per_group: le32(b, 0x28),
            s_mtime: time_with_hi(le32(b, 0x2C), b[0x275]),
            s_wtime: time_with_hi(le32(b, 0x30), b[0x274]),
            s_mnt_count: le16(b, 0x34),
            s_max_mnt_count: le16(b, 0x36) as i16,
            s_magic: le16(b, 0x38),
            s_state: le16(b, 0x3A),
            s_errors: le16(b, 0x3C),
            s_minor_rev_level: le16(b, 0x3E),
            s_lastcheck: time_with_hi(le32(b, 0x40), b[0x277]),
            s_checkinterval: le32(b, 0x44),
            s_creator_os: le32(b, 0x48),
            s_rev_level: le32(b, 0x4C),
            s_def_resuid: le16(b, 0x50),
            s_def_resgid: le16(b, 0x52),
            s_first_ino: le32(b, 0x54),
            s_inode_size: le16(b, 0x58),
            s_block_group_nr: le16(b, 0x5A),
            s_feature_compat: le32(b, 0x5C),
            s_feature_incompat: incompat,
            s_feature_ro_compat: le32(b, 0x64),
            s_uuid: b[0x68..0x78].try_into().unwrap(),
            s_volume_name: b[0x78..0x88].try_into().unwrap(),
            s_last_mounted: b[0x88..0xC8].try_into().unwrap(),
            s_reserved_gdt_blocks: le16(b, 0xCE),
            s_journal_uuid: b[0xD0..0xE0].try_into().unwrap(),
            s_journal_inum: le32(b, 0xE0),
            s_journal_dev: le32(b, 0xE4),
            s_last_orphan: le32(b, 0xE8),
            s_hash_seed: hash_seed,
            s_def_hash_version: b[0xFC],
            s_jnl_backup_type: b[0xFD],
            s_desc_size: le16(b, 0xFE),
            s_default_mount_opts: le32(b, 0x100),
            s_first_meta_bg: le32(b, 0x104),
            s_mkfs_time: time_with_hi(le32(b, 0x108), b[0x276]),
            s_jnl_blocks: jnl_blocks,
            s_min_extra_isize: le16(b, 0x15C),
            s_want_extra_isize: le16(b, 0x15E),
            s_flags: le32(b, 0x160),
            s_raid_stride: le16(b, 0x164),
            s_mmp_interval: le16(b, 0x166),
            s_mmp_block: le64(b, 0x168),
            s_raid_stripe_width: le32(b, 0x170),
            s_log_groups_per_flex: b[0x174],
            s_checksum_type: b[0x175],
            s_kbytes_written: le64(b, 0x178),
            s_overhead_clusters: le32(b, 0x248),
            s_backup_bgs: [le32(b, 0x24C), le32(b, 0x250)],
            s_lpf_ino: le32(b, 0x268),
            s_checksum_seed: le32(b, 0x270),
            s_encoding: le16(b, 0x27C),
            s_orphan_file_inum: le32(b, 0x280),
            s_checksum: le32(b, 0x3FC),
            raw,
        }
    }

    fn validate(&self, verify_checksum: bool) -> Result<()> {
        let here = "superblock at byte 1024";
        let bad = |what: String| Err(Error::corrupt(what, here));
        if self.s_magic != EXT4_SUPER_MAGIC {
            return bad(format!("bad magic {:#06x}, not an ext2/3/4 filesystem", self.s_magic));
        }
        // mkfs.ext4 -O journal_dev writes an ext4 superblock on an external journal
        // (no groups, no inodes): it is not a filesystem, and is no corrupt one.
        if self.s_feature_incompat & INCOMPAT_JOURNAL_DEV != 0 {
            return Err(Error::unsupported(
                "this is an external journal device (journal_dev), not a filesystem; open the filesystem that uses it",
            ));
        }
        if self.has_ro_compat(RO_COMPAT_METADATA_CSUM) && verify_checksum {
            if self.s_checksum_type != 1 {
                return bad(format!("unknown checksum type {}", self.s_checksum_type));
            }
            let want = self.compute_checksum();
            if want != self.s_checksum {
                return bad(format!(
                    "superblock checksum {:#010x} does not match contents ({want:#010x})",
                    self.s_checksum
                ));
            }
        }
        if self.s_log_block_size > 6 {
            return bad(format!("block size 2^(10+{}) is out of range", self.s_log_block_size));
        }
        if self.s_log_cluster_size != self.s_log_block_size && !self.has_ro_compat(RO_COMPAT_BIGALLOC) {
            return bad("cluster size differs from block size without bigalloc".into());
        }
        let bs = self.block_size() as u64;
        // Block bitmaps count clusters: with bigalloc a group spans more blocks than bits.
        if self.s_log_cluster_size < self.s_log_block_size || self.s_log_cluster_size > self.s_log_block_size + 16 {
            return bad(format!("cluster size 2^(10+{}) is out of range", self.s_log_cluster_size));
        }
        let blocks_per_cluster = 1u64 << (self.s_log_cluster_size - self.s_log_block_size);
        if self.s_clusters_per_group == 0
            || self.s_clusters_per_group as u64 > 8 * bs
            || self.s_blocks_per_group as u64 != self.s_clusters_per_group as u64 * blocks_per_cluster
        {
            return bad(format!(
                "{} blocks / {} clusters per group do not fit one bitmap block",
                self.s_blocks_per_group, self.s_clusters_per_group
            ));
        }
        if self.s_inodes_per_group == 0 || self.s_inodes_per_group as u64 > 8 * bs {
            return bad(format!("{} inodes per group does not fit one bitmap block", self.s_inodes_per_group));
        }
        let isz = self.inode_size();
        if isz < 128 || !isz.is_power_of_two() || isz as u64 > bs {
            return bad(format!("inode size {isz} is not a power of two between 128 and the block size"));
        }
        if self.s_blocks_count <= self.s_first_data_block as u64 {
            return bad(format!("block count {} leaves no blocks", self.s_blocks_count));
        }
        // 1 KiB blocks start at block 1, after the boot block and superblock; with
        // bigalloc clusters of 1 KiB blocks start at 0 (mke2fs), which the kernel
        // refuses only when clusters are single blocks.
        let first_ok = match (bs, blocks_per_cluster) {
            (1024, 1) => self.s_first_data_block == 1,
            (1024, _) => self.s_first_data_block <= 1,
            _ => self.s_first_data_block == 0,
        };
        if !first_ok {
            return bad(format!(
                "first data block {} is wrong for {bs}-byte blocks in {blocks_per_cluster}-block clusters",
                self.s_first_data_block
            ));
        }
        let groups = self.group_count();
        // checked: a hostile block count makes the group count large enough to overflow.
        if (self.s_inodes_per_group as u64).checked_mul(groups) != Some(self.s_inodes_count as u64) {
            return bad(format!(
                "inode count {} is not {} groups x {} inodes",
                self.s_inodes_count, groups, self.s_inodes_per_group
            ));
        }
        if self.is_64bit() {
            let ds = self.s_desc_size;
            if !(32..=1024).contains(&ds) || !ds.is_power_of_two() {
                return bad(format!("group descriptor size {ds} is invalid"));
            }
        }
        if self.s_rev_level >= 1 && (self.s_first_ino < 11 || self.s_first_ino >= self.s_inodes_count) {
            return bad(format!("first non-reserved inode {} is out of range", self.s_first_ino));
        }
        if self.s_log_groups_per_flex > 31 {
            return bad(format!("log groups per flex {} is out of range", self.s_log_groups_per_flex));
        }
        Ok(())
    }

    pub fn compute_checksum(&self) -> u32 {
        crc32c(!0, &self.raw[..0x3FC])
    }

    pub fn block_size(&self) -> u32 {
        1024 << self.s_log_block_size
    }

    pub fn inode_size(&self) -> u32 {
        if self.s_rev_level == 0 {
            128
        } else {
            self.s_inode_size as u32
        }
    }

    pub fn first_ino(&self) -> u32 {
        if self.s_rev_level == 0 {
            11
        } else {
            self.s_first_ino
        }
    }

    pub fn group_count(&self) -> u64 {
        (self.s_blocks_count - self.s_first_data_block as u64).div_ceil(self.s_blocks_per_group as u64)
    }

    pub fn is_64bit(&self) -> bool {
        self.has_incompat(INCOMPAT_64BIT)
    }

    /// On-disk group descriptor size: s_desc_size with 64bit, 32 otherwise.
    pub fn desc_size(&self) -> usize {
        if self.is_64bit() {
            self.s_desc_size as usize
        } else {
            32
        }
    }

    pub fn has_compat(&self, f: u32) -> bool {
        self.s_feature_compat & f != 0
    }
    pub fn has_incompat(&self, f: u32) -> bool {
        self.s_feature_incompat & f != 0
    }
    pub fn has_ro_compat(&self, f: u32) -> bool {
        self.s_feature_ro_compat & f != 0
    }

    pub fn has_metadata_csum(&self) -> bool {
        self.has_ro_compat(RO_COMPAT_METADATA_CSUM)
    }

    /// The seed every metadata checksum starts from: s_checksum_seed with the
    /// csum_seed feature (so the UUID can change), else crc32c(~0, s_uuid).
    pub fn csum_seed(&self) -> u32 {
        if self.has_incompat(INCOMPAT_CSUM_SEED) {
            self.s_checksum_seed
        } else {
            crc32c(!0, &self.s_uuid)
        }
    }

    pub fn volume_name(&self) -> String {
        let end = self.s_volume_name.iter().position(|&c| c == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.s_volume_name[..end]).into_owned()
    }

    /// Feature names set in the superblock, in dumpe2fs order, then unknown bits.
    pub fn feature_names(&self) -> Vec<String> {
        let words = [self.s_feature_compat, self.s_feature_incompat, self.s_feature_ro_compat];
        let mut names = Vec::new();
        let mut known = [0u32; 3];
        for &(w, bit, name) in FEATURE_NAMES {
            known[w as usize] |= bit;
            if words[w as usize] & bit != 0 {
                names.push(name.to_string());
            }
        }
        for (w, prefix) in [(0, "FEATURE_C"), (1, "FEATURE_I"), (2, "FEATURE_R")] {
            let unknown = words[w] & !known[w];
            for bit in 0..32 {
                if unknown & (1 << bit) != 0 {
                    names.push(format!("{prefix}{bit}"));
                }
            }
        }
        names
    }

    /// Serializes, writing every modelled field over the original bytes and
    /// recomputing the checksum when metadata_csum is on.
    pub fn to_bytes(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut b = *self.raw;
        let is_64bit = self.is_64bit();
        put_le32(&mut b, 0x0, self.s_inodes_count);
        put_le32(&mut b, 0x4, self.s_blocks_count as u32);
        put_le32(&mut b, 0x8, self.s_r_blocks_count as u32);
        put_le32(&mut b, 0xC, self.s_free_blocks_count as u32);
        if is_64bit {
            put_le32(&mut b, 0x150, (self.s_blocks_count >> 32) as u32);
            put_le32(&mut b, 0x154, (self.s_r_blocks_count >> 32) as u32);
            put_le32(&mut b, 0x158, (self.s_free_blocks_count >> 32) as u32);
        }
        put_le32(&mut b, 0x10, self.s_free_inodes_count);
        put_le32(&mut b, 0x14, self.s_first_data_block);
        put_le32(&mut b, 0x18, self.s_log_block_size);
        put_le32(&mut b, 0x1C, self.s_log_cluster_size);
        put_le32(&mut b, 0x20, self.s_blocks_per_group);
        put_le32(&mut b, 0x24, self.s_clusters_per_group);
        put_le32(&mut b, 0x28, self.s_inodes_per_group);
        put_le32(&mut b, 0x2C, self.s_mtime as u32);
        b[0x275] = (self.s_mtime >> 32) as u8;
        put_le32(&mut b, 0x30, self.s_wtime as u32);
        b[0x274] = (self.s_wtime >> 32) as u8;
        put_le16(&mut b, 0x34, self.s_mnt_count);
        put_le16(&mut b, 0x36, self.s_max_mnt_count as u16);
        put_le16(&mut b, 0x38, self.s_magic);
        put_le16(&mut b, 0x3A, self.s_state);
        put_le16(&mut b, 0x3C, self.s_errors);
        put_le16(&mut b, 0x3E, self.s_minor_rev_level);
        put_le32(&mut b, 0x40, self.s_lastcheck as u32);
        b[0x277] = (self.s_lastcheck >> 32) as u8;
        put_le32(&mut b, 0x44, self.s_checkinterval);
        put_le32(&mut b, 0x48, self.s_creator_os);
        put_le32(&mut b, 0x4C, self.s_rev_level);
        put_le16(&mut b, 0x50, self.s_def_resuid);
        put_le16(&mut b, 0x52, self.s_def_resgid);
        put_le32(&mut b, 0x54, self.s_first_ino);
        put_le16(&mut b, 0x58, self.s_inode_size);
        put_le16(&mut b, 0x5A, self.s_block_group_nr);
        put_le32(&mut b, 0x5C, self.s_feature_compat);
        put_le32(&mut b, 0x60, self.s_feature_incompat);
        put_le32(&mut b, 0x64, self.s_feature_ro_compat);
        b[0x68..0x78].copy_from_slice(&self.s_uuid);
        b[0x78..0x88].copy_from_slice(&self.s_volume_name);
        b[0x88..0xC8].copy_from_slice(&self.s_last_mounted);
        put_le16(&mut b, 0xCE, self.s_reserved_gdt_blocks);
        b[0xD0..0xE0].copy_from_slice(&self.s_journal_uuid);
        put_le32(&mut b, 0xE0, self.s_journal_inum);
        put_le32(&mut b, 0xE4, self.s_journal_dev);
        put_le32(&mut b, 0xE8, self.s_last_orphan);
        for (i, s) in self.s_hash_seed.iter().enumerate() {
            put_le32(&mut b, 0xEC + 4 * i, *s);
        }
        b[0xFC] = self.s_def_hash_version;
        b[0xFD] = self.s_jnl_backup_type;
        put_le16(&mut b, 0xFE, self.s_desc_size);
        put_le32(&mut b, 0x100, self.s_default_mount_opts);
        put_le32(&mut b, 0x104, self.s_first_meta_bg);
        put_le32(&mut b, 0x108, self.s_mkfs_time as u32);
        b[0x276] = (self.s_mkfs_time >> 32) as u8;
        for (i, s) in self.s_jnl_blocks.iter().enumerate() {
            put_le32(&mut b, 0x10C + 4 * i, *s);
        }
        put_le16(&mut b, 0x15C, self.s_min_extra_isize);
        put_le16(&mut b, 0x15E, self.s_want_extra_isize);
        put_le32(&mut b, 0x160, self.s_flags);
        put_le16(&mut b, 0x164, self.s_raid_stride);
        put_le16(&mut b, 0x166, self.s_mmp_interval);
        put_le64(&mut b, 0x168, self.s_mmp_block);
        put_le32(&mut b, 0x170, self.s_raid_stripe_width);
        b[0x174] = self.s_log_groups_per_flex;
        b[0x175] = self.s_checksum_type;
        put_le64(&mut b, 0x178, self.s_kbytes_written);
        put_le32(&mut b, 0x248, self.s_overhead_clusters);
        put_le32(&mut b, 0x24C, self.s_backup_bgs[0]);
        put_le32(&mut b, 0x250, self.s_backup_bgs[1]);
        put_le32(&mut b, 0x268, self.s_lpf_ino);
        put_le32(&mut b, 0x270, self.s_checksum_seed);
        put_le16(&mut b, 0x27C, self.s_encoding);
        put_le32(&mut b, 0x280, self.s_orphan_file_inum);
        let csum = if self.has_metadata_csum() { crc32c(!0, &b[..0x3FC]) } else { self.s_checksum };
        put_le32(&mut b, 0x3FC, csum);
        b
    }

    /// A blank superblock for mkfs to fill in; every field zero except the magic.
    pub fn zeroed() -> Superblock {
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        put_le16(&mut raw, 0x38, EXT4_SUPER_MAGIC);
        Self::from_bytes(&raw)
    }
}

// s_errors: what the kernel does when it detects an error.
pub const EXT4_ERRORS_CONTINUE: u16 = 1;
pub const EXT4_ERRORS_RO: u16 = 2;
pub const EXT4_ERRORS_PANIC: u16 = 3;

/// ext4's error codes for s_first_error_errcode/s_last_error_errcode: errnos
/// differ between architectures, so the superblock keeps these instead.
pub const EXT4_ERR_UNKNOWN: u8 = 1;
pub const EXT4_ERR_EIO: u8 = 2;
pub const EXT4_ERR_ENOMEM: u8 = 3;
pub const EXT4_ERR_EFSBADCRC: u8 = 4;
pub const EXT4_ERR_EFSCORRUPTED: u8 = 5;
pub const EXT4_ERR_ENOSPC: u8 = 6;
pub const EXT4_ERR_ENOKEY: u8 = 7;
pub const EXT4_ERR_EROFS: u8 = 8;
pub const EXT4_ERR_EFBIG: u8 = 9;
pub const EXT4_ERR_EEXIST: u8 = 10;
pub const EXT4_ERR_ERANGE: u8 = 11;
pub const EXT4_ERR_EOVERFLOW: u8 = 12;
pub const EXT4_ERR_EBUSY: u8 = 13;
pub const EXT4_ERR_ENOTDIR: u8 = 14;
pub const EXT4_ERR_ENOTEMPTY: u8 = 15;
pub const EXT4_ERR_ESHUTDOWN: u8 = 16;
pub const EXT4_ERR_EFAULT: u8 = 17;

/// The superblock's code for a Linux errno (the kernel's ext4_errno_to_code);
/// EXT4_ERR_UNKNOWN for one it has no code for, and for 0 (not known).
pub fn error_code_of_errno(errno: i32) -> u8 {
    match errno {
        5 => EXT4_ERR_EIO,
        12 => EXT4_ERR_ENOMEM,
        74 => EXT4_ERR_EFSBADCRC,     // EBADMSG, the kernel's EFSBADCRC
        117 => EXT4_ERR_EFSCORRUPTED, // EUCLEAN, the kernel's EFSCORRUPTED
        28 => EXT4_ERR_ENOSPC,
        126 => EXT4_ERR_ENOKEY,
        30 => EXT4_ERR_EROFS,
        27 => EXT4_ERR_EFBIG,
        17 => EXT4_ERR_EEXIST,
        34 => EXT4_ERR_ERANGE,
        75 => EXT4_ERR_EOVERFLOW,
        16 => EXT4_ERR_EBUSY,
        20 => EXT4_ERR_ENOTDIR,
        39 => EXT4_ERR_ENOTEMPTY,
        108 => EXT4_ERR_ESHUTDOWN,
        14 => EXT4_ERR_EFAULT,
        _ => EXT4_ERR_UNKNOWN,
    }
}

/// Where an error happened, as the superblock records it (s_first_error_*,
/// s_last_error_*).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorRecord {
    pub time: u64,
    pub ino: u32,
    pub block: u64,
    /// At most 32 bytes are kept (the field is not NUL-terminated when full).
    pub func: String,
    pub line: u32,
    pub errcode: u8,
}

/// Byte offsets of one error record's fields: time (low word, high byte),
/// inode, block, function name (32 bytes), line, error code.
struct ErrorFields {
    time: (usize, usize),
    ino: usize,
    block: usize,
    func: usize,
    line: usize,
    errcode: usize,
}

// The error record, between s_error_count and s_mount_opts, is not modelled as
// fields: these read and write it in the raw bytes `to_bytes` starts from.
const S_ERROR_COUNT: usize = 0x194;
const S_ERR_END: usize = 0x200;
const S_FIRST_ERROR: usize = 0x198;
const S_LAST_ERROR_TIME: usize = 0x1CC;
const S_FIRST_ERROR_TIME_HI: usize = 0x278;
const S_LAST_ERROR_TIME_HI: usize = 0x279;
const S_FIRST_ERROR_ERRCODE: usize = 0x27A;
const S_LAST_ERROR_ERRCODE: usize = 0x27B;

impl Superblock {
    pub fn s_error_count(&self) -> u32 {
        le32(&self.raw[..], S_ERROR_COUNT)
    }

    /// The first error recorded, if any (s_first_error_time is not zero).
    pub fn first_error(&self) -> Option<ErrorRecord> {
        self.error_at(&ErrorFields {
            time: (S_FIRST_ERROR, S_FIRST_ERROR_TIME_HI),
            ino: 0x19C,
            block: 0x1A0,
            func: 0x1A8,
            line: 0x1C8,
            errcode: S_FIRST_ERROR_ERRCODE,
        })
    }

    /// The last error recorded, if any.
    pub fn last_error(&self) -> Option<ErrorRecord> {
        self.error_at(&ErrorFields {
            time: (S_LAST_ERROR_TIME, S_LAST_ERROR_TIME_HI),
            ino: 0x1D0,
            block: 0x1D8,
            func: 0x1E0,
            line: 0x1D4,
            errcode: S_LAST_ERROR_ERRCODE,
        })
    }

    /// The record whose fields lie at `at` (the first and the last error are
    /// laid out alike, at different offsets).
    fn error_at(&self, at: &ErrorFields) -> Option<ErrorRecord> {
        let b = &self.raw[..];
        let time = time_with_hi(le32(b, at.time.0), b[at.time.1]);
        let func = &b[at.func..at.func + 32];
        let func_len = func.iter().position(|&c| c == 0).unwrap_or(func.len());
        (time != 0 || self.s_error_count() != 0).then(|| ErrorRecord {
            time,
            ino: le32(b, at.ino),
            block: le64(b, at.block),
            func: String::from_utf8_lossy(&func[..func_len]).into_owned(),
            line: le32(b, at.line),
            errcode: b[at.errcode],
        })
    }

    /// Records an error as the kernel's save_error_info does: the error state bit
    /// in s_state, the count, the first error (if none yet) and the last one.
    pub fn record_error(&mut self, e: &ErrorRecord) {
        self.s_state |= EXT4_ERROR_FS;
        let b = &mut self.raw[..];
        let count = le32(b, S_ERROR_COUNT).saturating_add(1);
        put_le32(b, S_ERROR_COUNT, count);
        let mut func = [0u8; 32];
        let name = e.func.as_bytes();
        func[..name.len().min(32)].copy_from_slice(&name[..name.len().min(32)]);
        if le32(b, S_FIRST_ERROR) == 0 && b[S_FIRST_ERROR_TIME_HI] == 0 {
            put_le32(b, S_FIRST_ERROR, e.time as u32);
            b[S_FIRST_ERROR_TIME_HI] = (e.time >> 32) as u8;
            put_le32(b, 0x19C, e.ino);
            put_le64(b, 0x1A0, e.block);
            b[0x1A8..0x1C8].copy_from_slice(&func);
            put_le32(b, 0x1C8, e.line);
            b[S_FIRST_ERROR_ERRCODE] = e.errcode;
        }
        put_le32(b, S_LAST_ERROR_TIME, e.time as u32);
        b[S_LAST_ERROR_TIME_HI] = (e.time >> 32) as u8;
        put_le32(b, 0x1D0, e.ino);
        put_le32(b, 0x1D4, e.line);
        put_le64(b, 0x1D8, e.block);
        b[0x1E0..0x200].copy_from_slice(&func);
        b[S_LAST_ERROR_ERRCODE] = e.errcode;
    }

    /// Marks the filesystem as having errors without recording one: what the
    /// kernel does at mount when the journal says a previous mount aborted
    /// (ext4_clear_journal_err sets EXT4_ERROR_FS and nothing else).
    pub fn mark_errors(&mut self) {
        self.s_state |= EXT4_ERROR_FS;
    }

    /// Carries the error state and record of `from` over (the kernel keeps them
    /// across a journal replay, whose copy of the superblock predates the error).
    pub fn keep_error_info(&mut self, from: &Superblock) {
        self.s_state |= from.s_state & EXT4_ERROR_FS;
        self.raw[S_ERROR_COUNT..S_ERR_END].copy_from_slice(&from.raw[S_ERROR_COUNT..S_ERR_END]);
        for off in [S_FIRST_ERROR_TIME_HI, S_LAST_ERROR_TIME_HI, S_FIRST_ERROR_ERRCODE, S_LAST_ERROR_ERRCODE] {
            self.raw[off] = from.raw[off];
        }
    }
}
