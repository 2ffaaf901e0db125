//! Block group descriptors: 32 bytes, or `s_desc_size` (64) with the 64bit feature.
//!
//! The descriptor checksum is 16 bits: with metadata_csum the low half of
//! crc32c(csum_seed, le32 group ‖ descriptor with bg_checksum zeroed); with only
//! gdt_csum (uninit_bg) crc16(~0, s_uuid ‖ le32 group ‖ descriptor without bg_checksum).

use super::bytes::*;
use super::csum::{crc16, crc32c};
use crate::error::{Error, Result};

pub const EXT4_BG_INODE_UNINIT: u16 = 0x1;
pub const EXT4_BG_BLOCK_UNINIT: u16 = 0x2;
pub const EXT4_BG_INODE_ZEROED: u16 = 0x4;

const BG_CHECKSUM_OFFSET: usize = 0x1E;

/// How descriptors of this filesystem are checksummed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdCsum {
    None,
    /// gdt_csum: crc16 seeded with the filesystem UUID.
    Crc16 {
        uuid: [u8; 16],
    },
    /// metadata_csum: crc32c from the filesystem's checksum seed.
    Crc32c {
        seed: u32,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupDesc {
    pub bg_block_bitmap: u64,
    pub bg_inode_bitmap: u64,
    pub bg_inode_table: u64,
    pub bg_free_blocks_count: u32,
    pub bg_free_inodes_count: u32,
    pub bg_used_dirs_count: u32,
    pub bg_flags: u16,
    pub bg_exclude_bitmap: u64,
    pub bg_block_bitmap_csum: u32,
    pub bg_inode_bitmap_csum: u32,
    pub bg_itable_unused: u32,
    pub bg_checksum: u16,
}

impl GroupDesc {
    /// Parses one descriptor of `desc_size` bytes (32 or more); the high halves
    /// exist only when desc_size >= 64.
    pub fn parse(b: &[u8], desc_size: usize) -> GroupDesc {
        let wide = desc_size >= 64 && b.len() >= 64;
        let hi32 = |off: usize| if wide { le32(b, off) } else { 0 };
        let hi16 = |off: usize| if wide { le16(b, off) as u32 } else { 0 };
        GroupDesc {
            bg_block_bitmap: lo_hi(le32(b, 0x0), hi32(0x20)),
            bg_inode_bitmap: lo_hi(le32(b, 0x4), hi32(0x24)),
            bg_inode_table: lo_hi(le32(b, 0x8), hi32(0x28)),
            bg_free_blocks_count: le16(b, 0xC) as u32 | (hi16(0x2C) << 16),
            bg_free_inodes_count: le16(b, 0xE) as u32 | (hi16(0x2E) << 16),
            bg_used_dirs_count: le16(b, 0x10) as u32 | (hi16(0x30) << 16),
            bg_flags: le16(b, 0x12),
            bg_exclude_bitmap: lo_hi(le32(b, 0x14), hi32(0x34)),
            bg_block_bitmap_csum: le16(b, 0x18) as u32 | (hi16(0x38) << 16),
            bg_inode_bitmap_csum: le16(b, 0x1A) as u32 | (hi16(0x3A) << 16),
            bg_itable_unused: le16(b, 0x1C) as u32 | (hi16(0x32) << 16),
            bg_checksum: le16(b, BG_CHECKSUM_OFFSET),
        }
    }

    /// Writes the modelled fields into `b` (desc_size bytes, other bytes kept)
    /// and then the checksum.
    pub fn write(&self, b: &mut [u8], desc_size: usize, group: u32, csum: GdCsum) {
        let wide = desc_size >= 64;
        put_le32(b, 0x0, self.bg_block_bitmap as u32);
        put_le32(b, 0x4, self.bg_inode_bitmap as u32);
        put_le32(b, 0x8, self.bg_inode_table as u32);
        put_le16(b, 0xC, self.bg_free_blocks_count as u16);
        put_le16(b, 0xE, self.bg_free_inodes_count as u16);
        put_le16(b, 0x10, self.bg_used_dirs_count as u16);
        put_le16(b, 0x12, self.bg_flags);
        put_le32(b, 0x14, self.bg_exclude_bitmap as u32);
        put_le16(b, 0x18, self.bg_block_bitmap_csum as u16);
        put_le16(b, 0x1A, self.bg_inode_bitmap_csum as u16);
        put_le16(b, 0x1C, self.bg_itable_unused as u16);
        if wide {
            put_le32(b, 0x20, (self.bg_block_bitmap >> 32) as u32);
            put_le32(b, 0x24, (self.bg_inode_bitmap >> 32) as u32);
            put_le32(b, 0x28, (self.bg_inode_table >> 32) as u32);
            put_le16(b, 0x2C, (self.bg_free_blocks_count >> 16) as u16);
            put_le16(b, 0x2E, (self.bg_free_inodes_count >> 16) as u16);
            put_le16(b, 0x30, (self.bg_used_dirs_count >> 16) as u16);
            put_le16(b, 0x32, (self.bg_itable_unused >> 16) as u16);
            put_le32(b, 0x34, (self.bg_exclude_bitmap >> 32) as u32);
            put_le16(b, 0x38, (self.bg_block_bitmap_csum >> 16) as u16);
            put_le16(b, 0x3A, (self.bg_inode_bitmap_csum >> 16) as u16);
        }
        let c = checksum(&b[..desc_size], group, csum).unwrap_or(self.bg_checksum);
        put_le16(b, BG_CHECKSUM_OFFSET, c);
    }

    /// Checks `b`'s stored checksum; `Corrupt` names the group on a mismatch.
    pub fn verify(b: &[u8], desc_size: usize, group: u32, csum: GdCsum) -> Result<()> {
        if let Some(want) = checksum(&b[..desc_size], group, csum) {
            let have = le16(b, BG_CHECKSUM_OFFSET);
            if have != want {
                return Err(Error::corrupt(
                    format!("group descriptor checksum {have:#06x} does not match contents ({want:#06x})"),
                    format!("group {group}"),
                ));
            }
        }
        Ok(())
    }
}

/// The checksum a descriptor should carry, or None when the filesystem has none.
pub fn checksum(desc: &[u8], group: u32, csum: GdCsum) -> Option<u16> {
    let group_le = group.to_le_bytes();
    let after = BG_CHECKSUM_OFFSET + 2;
    match csum {
        GdCsum::None => None,
        GdCsum::Crc32c { seed } => {
            let c = crc32c(seed, &group_le);
            let c = crc32c(c, &desc[..BG_CHECKSUM_OFFSET]);
            let c = crc32c(c, &[0, 0]);
            let c = crc32c(c, &desc[after..]);
            Some(c as u16)
        }
        GdCsum::Crc16 { uuid } => {
            let c = crc16(!0, &uuid);
            let c = crc16(c, &group_le);
            let c = crc16(c, &desc[..BG_CHECKSUM_OFFSET]);
            Some(crc16(c, &desc[after..]))
        }
    }
}
