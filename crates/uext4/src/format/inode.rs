//! The on-disk inode: 128 bytes of the original ext2 layout, then `i_extra_isize`
//! bytes of extensions (checksum high half, nanosecond and creation times), then
//! in-inode extended attributes up to `s_inode_size`.
//!
//! `Inode` keeps the raw bytes of the whole on-disk slot, so that serializing keeps
//! the xattr area and unknown fields. The checksum is crc32c seeded by the
//! filesystem seed, the inode number and i_generation, over the whole slot with the
//! checksum fields read as zero; only its low 16 bits are stored when the slot has
//! no room for `i_checksum_hi`.

use super::bytes::*;
use super::csum::crc32c;
use crate::error::{Error, Result};

pub const EXT4_GOOD_OLD_INODE_SIZE: usize = 128;
pub const EXT4_N_BLOCKS: usize = 15;

// i_mode file types
pub const S_IFMT: u16 = 0o170000;
pub const S_IFSOCK: u16 = 0o140000;
pub const S_IFLNK: u16 = 0o120000;
pub const S_IFREG: u16 = 0o100000;
pub const S_IFBLK: u16 = 0o060000;
pub const S_IFDIR: u16 = 0o040000;
pub const S_IFCHR: u16 = 0o020000;
pub const S_IFIFO: u16 = 0o010000;

// i_flags
pub const EXT4_IMMUTABLE_FL: u32 = 0x10;
pub const EXT4_APPEND_FL: u32 = 0x20;
pub const EXT4_INDEX_FL: u32 = 0x1000;
pub const EXT4_HUGE_FILE_FL: u32 = 0x40000;
pub const EXT4_EXTENTS_FL: u32 = 0x80000;
pub const EXT4_EA_INODE_FL: u32 = 0x200000;
pub const EXT4_INLINE_DATA_FL: u32 = 0x1000_0000;
pub const EXT4_ENCRYPT_FL: u32 = 0x800;
pub const EXT4_CASEFOLD_FL: u32 = 0x4000_0000;

// Field offsets used more than once.
const I_CHECKSUM_LO: usize = 0x7C;
const I_EXTRA_ISIZE: usize = 0x80;
const I_CHECKSUM_HI: usize = 0x82;

/// A timestamp as stored: seconds since the epoch (with the extra epoch bits
/// applied) and nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    /// Seconds since 1970 (negative before).
    pub sec: i64,
    /// Nanoseconds (0 with 128-byte inodes, which hold seconds only).
    pub nsec: u32,
}

impl Timestamp {
    /// Decodes a 32-bit signed seconds field plus its `_extra` word: the low two
    /// extra bits extend the epoch, the upper 30 are nanoseconds.
    pub fn decode(seconds: u32, extra: Option<u32>) -> Timestamp {
        let base = seconds as i32 as i64;
        match extra {
            Some(x) => Timestamp { sec: base + (((x & 3) as i64) << 32), nsec: x >> 2 },
            None => Timestamp { sec: base, nsec: 0 },
        }
    }

    /// The earliest time ext4 stores: 32-bit signed seconds (1901-12-13).
    pub const MIN_SEC: i64 = i32::MIN as i64;
    /// The latest with an `_extra` word: two epoch bits on top of the signed 32
    /// bits (2446-05-10); without one, i32::MAX (2038-01-19).
    pub const MAX_EXTRA_SEC: i64 = (1 << 34) - 1 + i32::MIN as i64;

    /// The time as ext4 can hold it (the kernel's timestamp_truncate with ext4's
    /// s_time_min/s_time_max): seconds clamped to the range, nanoseconds dropped at
    /// either end and without an `_extra` word (one-second granularity).
    pub fn clamp(self, extra: bool) -> Timestamp {
        let max = if extra { Self::MAX_EXTRA_SEC } else { i32::MAX as i64 };
        let sec = self.sec.clamp(Self::MIN_SEC, max);
        let nsec = if !extra || sec == Self::MIN_SEC || sec == max { 0 } else { self.nsec.min(999_999_999) };
        Timestamp { sec, nsec }
    }

    /// The on-disk pair: the low 32 bits of the seconds, and the `_extra` word
    /// (nanoseconds above two epoch bits).
    pub fn encode(self) -> (u32, u32) {
        let epoch = ((self.sec - (self.sec as i32 as i64)) >> 32) as u32 & 3;
        (self.sec as u32, (self.nsec << 2) | epoch)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Inode {
    pub i_mode: u16,
    pub i_uid: u32,
    pub i_size: u64,
    pub i_atime: Timestamp,
    pub i_ctime: Timestamp,
    pub i_mtime: Timestamp,
    pub i_crtime: Option<Timestamp>,
    pub i_dtime: u32,
    pub i_gid: u32,
    pub i_links_count: u16,
    /// i_blocks as stored (lo + hi), in the unit given by `blocks_unit_is_fs_block`.
    pub i_blocks: u64,
    pub i_flags: u32,
    /// The 60-byte i_block area: extent root, block map, fast symlink or inline data.
    pub i_block: [u8; 60],
    pub i_generation: u32,
    pub i_file_acl: u64,
    pub i_extra_isize: u16,
    pub i_projid: u32,
    raw: Vec<u8>,
}

impl Inode {
    /// Parses one inode slot (s_inode_size bytes).
    pub fn parse(b: &[u8]) -> Result<Inode> {
        if b.len() < EXT4_GOOD_OLD_INODE_SIZE {
            return Err(Error::corrupt("inode slot shorter than 128 bytes", "inode"));
        }
        let extra_isize = if b.len() > EXT4_GOOD_OLD_INODE_SIZE { le16(b, I_EXTRA_ISIZE) } else { 0 };
        if EXT4_GOOD_OLD_INODE_SIZE + extra_isize as usize > b.len() || extra_isize % 4 != 0 {
            return Err(Error::corrupt(format!("i_extra_isize {extra_isize} does not fit the inode"), "inode"));
        }
        let has = |field_end: usize| EXT4_GOOD_OLD_INODE_SIZE + extra_isize as usize >= field_end;
        let extra = |off: usize| {
            if has(off + 4) {
                Some(le32(b, off))
            } else {
                None
            }
        };
        Ok(Inode {
            i_mode: le16(b, 0x0),
            i_uid: le16(b, 0x2) as u32 | ((le16(b, 0x78) as u32) << 16),
            i_size: lo_hi(le32(b, 0x4), le32(b, 0x6C)),
            i_atime: Timestamp::decode(le32(b, 0x8), extra(0x8C)),
            i_ctime: Timestamp::decode(le32(b, 0xC), extra(0x84)),
            i_mtime: Timestamp::decode(le32(b, 0x10), extra(0x88)),
            i_crtime: if has(0x94) { Some(Timestamp::decode(le32(b, 0x90), extra(0x94))) } else { None },
            i_dtime: le32(b, 0x14),
            i_gid: le16(b, 0x18) as u32 | ((le16(b, 0x7A) as u32) << 16),
            i_links_count: le16(b, 0x1A),
            i_blocks: lo_hi(le32(b, 0x1C), le16(b, 0x74) as u32),
            i_flags: le32(b, 0x20),
            i_block: b[0x28..0x64].try_into().unwrap(),
            i_generation: le32(b, 0x64),
            i_file_acl: lo_hi(le32(b, 0x68), le16(b, 0x76) as u32),
            i_extra_isize: extra_isize,
            i_projid: extra(0x9C).unwrap_or(0),
            raw: b.to_vec(),
        })
    }

    /// A new, zeroed slot of `inode_size` bytes with i_extra_isize set.
    pub fn new(inode_size: usize, extra_isize: u16) -> Inode {
        let mut raw = vec![0u8; inode_size];
        if inode_size > EXT4_GOOD_OLD_INODE_SIZE {
            put_le16(&mut raw, I_EXTRA_ISIZE, extra_isize);
        }
        Inode::parse(&raw).expect("a zeroed slot is a valid inode")
    }

    pub fn file_type(&self) -> u16 {
        self.i_mode & S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.file_type() == S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.file_type() == S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.file_type() == S_IFLNK
    }
    pub fn has_flag(&self, f: u32) -> bool {
        self.i_flags & f != 0
    }

    /// i_blocks counts fs blocks (not 512-byte sectors) with huge_file and the
    /// inode's HUGE_FILE flag.
    pub fn blocks_512(&self, huge_file_feature: bool, block_size: u32) -> u64 {
        if huge_file_feature && self.has_flag(EXT4_HUGE_FILE_FL) {
            self.i_blocks * (block_size as u64 / 512)
        } else {
            self.i_blocks
        }
    }

    /// Device number of a character or block device inode, decoded from i_block as
    /// the kernel does (old 16-bit form in word 0, new form in word 1).
    pub fn device_number(&self) -> (u32, u32) {
        let old = le32(&self.i_block, 0);
        if old != 0 {
            ((old >> 8) & 0xff, old & 0xff)
        } else {
            let new = le32(&self.i_block, 4);
            ((new & 0xfff00) >> 8, (new & 0xff) | ((new >> 12) & 0xfff00))
        }
    }

    /// Bytes of the in-inode extended attribute area (after i_extra_isize).
    pub fn xattr_area(&self) -> &[u8] {
        let start = EXT4_GOOD_OLD_INODE_SIZE + self.i_extra_isize as usize;
        if self.raw.len() > EXT4_GOOD_OLD_INODE_SIZE && start <= self.raw.len() {
            &self.raw[start..]
        } else {
            &[]
        }
    }

    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    fn has_checksum_hi(&self) -> bool {
        self.raw.len() > EXT4_GOOD_OLD_INODE_SIZE && self.i_extra_isize >= 4
    }

    /// The checksum of the raw slot, given the per-inode seed (see `inode_csum_seed`).
    pub fn compute_checksum(raw: &[u8], inode_seed: u32, has_hi: bool) -> u32 {
        let c = crc32c(inode_seed, &raw[..I_CHECKSUM_LO]);
        let c = crc32c(c, &[0, 0]);
        let c = crc32c(c, &raw[I_CHECKSUM_LO + 2..EXT4_GOOD_OLD_INODE_SIZE]);
        if raw.len() <= EXT4_GOOD_OLD_INODE_SIZE {
            return c;
        }
        let c = crc32c(c, &raw[EXT4_GOOD_OLD_INODE_SIZE..I_CHECKSUM_HI]);
        if has_hi {
            let c = crc32c(c, &[0, 0]);
            crc32c(c, &raw[I_CHECKSUM_HI + 2..])
        } else {
            crc32c(c, &raw[I_CHECKSUM_HI..])
        }
    }

    /// Verifies the stored checksum of inode `ino`; `fs_seed` is the filesystem's
    /// checksum seed.
    pub fn verify_checksum(&self, ino: u32, fs_seed: u32) -> Result<()> {
        let seed = inode_csum_seed(fs_seed, ino, self.i_generation);
        let has_hi = self.has_checksum_hi();
        let want = Self::compute_checksum(&self.raw, seed, has_hi);
        let lo = le16(&self.raw, I_CHECKSUM_LO) as u32;
        let (have, want) =
            if has_hi { (lo | ((le16(&self.raw, I_CHECKSUM_HI) as u32) << 16), want) } else { (lo, want & 0xffff) };
        if have != want {
            return Err(Error::corrupt(
                format!("inode checksum {have:#x} does not match contents ({want:#x})"),
                format!("inode {ino}"),
            ));
        }
        Ok(())
    }

    /// Serializes to the raw slot, writing the checksum when `fs_seed` is given.
    pub fn to_bytes(&self, ino: u32, fs_seed: Option<u32>) -> Vec<u8> {
        let mut b = self.raw.clone();
        let big = b.len() > EXT4_GOOD_OLD_INODE_SIZE;
        let fits = |end: usize| EXT4_GOOD_OLD_INODE_SIZE + self.i_extra_isize as usize >= end && big;
        put_le16(&mut b, 0x0, self.i_mode);
        put_le16(&mut b, 0x2, self.i_uid as u16);
        put_le16(&mut b, 0x78, (self.i_uid >> 16) as u16);
        put_le32(&mut b, 0x4, self.i_size as u32);
        put_le32(&mut b, 0x6C, (self.i_size >> 32) as u32);
        for (t, off, extra_off) in [(self.i_atime, 0x8, 0x8C), (self.i_ctime, 0xC, 0x84), (self.i_mtime, 0x10, 0x88)] {
            // Out-of-range times never wrap into another century.
            let (s, x) = t.clamp(fits(extra_off + 4)).encode();
            put_le32(&mut b, off, s);
            if fits(extra_off + 4) {
                put_le32(&mut b, extra_off, x);
            }
        }
        if let Some(t) = self.i_crtime {
            if fits(0x98) {
                let (s, x) = t.clamp(true).encode();
                put_le32(&mut b, 0x90, s);
                put_le32(&mut b, 0x94, x);
            }
        }
        put_le32(&mut b, 0x14, self.i_dtime);
        put_le16(&mut b, 0x18, self.i_gid as u16);
        put_le16(&mut b, 0x7A, (self.i_gid >> 16) as u16);
        put_le16(&mut b, 0x1A, self.i_links_count);
        put_le32(&mut b, 0x1C, self.i_blocks as u32);
        put_le16(&mut b, 0x74, (self.i_blocks >> 32) as u16);
        put_le32(&mut b, 0x20, self.i_flags);
        b[0x28..0x64].copy_from_slice(&self.i_block);
        put_le32(&mut b, 0x64, self.i_generation);
        put_le32(&mut b, 0x68, self.i_file_acl as u32);
        put_le16(&mut b, 0x76, (self.i_file_acl >> 32) as u16);
        if big {
            put_le16(&mut b, I_EXTRA_ISIZE, self.i_extra_isize);
        }
        if fits(0xA0) {
            put_le32(&mut b, 0x9C, self.i_projid);
        }
        if let Some(seed) = fs_seed {
            let has_hi = big && self.i_extra_isize >= 4;
            let c = Self::compute_checksum(&b, inode_csum_seed(seed, ino, self.i_generation), has_hi);
            put_le16(&mut b, I_CHECKSUM_LO, c as u16);
            if has_hi {
                put_le16(&mut b, I_CHECKSUM_HI, (c >> 16) as u16);
            }
        }
        b
    }

    /// Replaces the in-inode xattr area (everything after i_extra_isize).
    pub fn set_xattr_area(&mut self, area: &[u8]) {
        let start = EXT4_GOOD_OLD_INODE_SIZE + self.i_extra_isize as usize;
        let n = area.len().min(self.raw.len().saturating_sub(start));
        self.raw[start..start + n].copy_from_slice(&area[..n]);
        self.raw[start + n..].fill(0);
    }
}

/// The per-inode checksum seed shared by the inode, its extent blocks and its
/// directory blocks: crc32c(crc32c(fs_seed, le32 ino), le32 generation).
pub fn inode_csum_seed(fs_seed: u32, ino: u32, generation: u32) -> u32 {
    crc32c(crc32c(fs_seed, &ino.to_le_bytes()), &generation.to_le_bytes())
}
