//! Hashed directory index (htree / dx) nodes.
//!
//! Block 0 of an indexed directory is a `dx_root`: fake "." and ".." entries (the
//! latter's rec_len covering the rest of the block, so linear readers skip it), then
//! `dx_root_info` (hash version, indirect levels) and a count/limit header followed
//! by (hash, block) entries. Interior `dx_node` blocks start with one fake empty
//! entry spanning the block. Entry 0 has no hash: its hash slot holds limit and
//! count. With metadata_csum, `limit` leaves room for an 8-byte `dx_tail` whose
//! checksum covers the block up to `count` entries, then dt_reserved, then 4 zeros.

use super::bytes::*;
use super::csum::crc32c;
use crate::error::{Error, Result};

pub const DX_ROOT_INFO_OFFSET: usize = 0x18;
pub const DX_NODE_COUNTLIMIT_OFFSET: usize = 8;
pub const DX_ENTRY_SIZE: usize = 8;
pub const DX_TAIL_SIZE: usize = 8;
/// Levels below the root without largedir, and with it.
pub const DX_MAX_LEVELS: u8 = 2;
pub const DX_MAX_LEVELS_LARGEDIR: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DxEntry {
    pub hash: u32,
    pub block: u32,
}

/// Index entries of a dx_root or dx_node, with where they start in the block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DxNode {
    pub countlimit_offset: usize,
    pub limit: u16,
    pub entries: Vec<DxEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DxRootInfo {
    pub hash_version: u8,
    pub info_length: u8,
    pub indirect_levels: u8,
    pub unused_flags: u8,
}

/// How many index entries fit: the space after the header, less one entry for the
/// checksum tail when metadata_csum is on.
pub fn dx_limit(block_size: usize, countlimit_offset: usize, csum: bool) -> u16 {
    let n = (block_size - countlimit_offset) / DX_ENTRY_SIZE;
    (if csum { n - 1 } else { n }) as u16
}

pub fn parse_root_info(block: &[u8], location: &str) -> Result<DxRootInfo> {
    let bad = |what: String| Err(Error::corrupt(what, location));
    if block.len() < DX_ROOT_INFO_OFFSET + 16 {
        return bad("htree root block is too small".into());
    }
    if block[6] != 1 || block[8] != b'.' {
        return bad("htree root does not start with '.'".into());
    }
    let info = DxRootInfo {
        hash_version: block[DX_ROOT_INFO_OFFSET + 4],
        info_length: block[DX_ROOT_INFO_OFFSET + 5],
        indirect_levels: block[DX_ROOT_INFO_OFFSET + 6],
        unused_flags: block[DX_ROOT_INFO_OFFSET + 7],
    };
    if le32(block, DX_ROOT_INFO_OFFSET) != 0 {
        return bad("htree root info reserved field is not zero".into());
    }
    if info.info_length != 8 {
        return bad(format!("htree root info length {} is not 8", info.info_length));
    }
    Ok(info)
}

/// Parses the count/limit header and entries at `countlimit_offset`, checking that
/// count and limit fit the block and that hashes ascend.
pub fn parse_node(block: &[u8], countlimit_offset: usize, expected_limit: u16, location: &str) -> Result<DxNode> {
    let bad = |what: String| Err(Error::corrupt(what, location));
    let limit = le16(block, countlimit_offset);
    let count = le16(block, countlimit_offset + 2);
    if limit != expected_limit {
        return bad(format!("htree node limit {limit} is not the expected {expected_limit}"));
    }
    if count == 0 || count > limit {
        return bad(format!("htree node count {count} is outside 1..={limit}"));
    }
    let mut entries = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let off = countlimit_offset + i * DX_ENTRY_SIZE;
        let hash = if i == 0 { 0 } else { le32(block, off) };
        entries.push(DxEntry { hash, block: le32(block, off + 4) });
    }
    for w in entries.windows(2) {
        if w[1].hash < w[0].hash {
            return bad(format!("htree hashes {:#x} and {:#x} are out of order", w[0].hash, w[1].hash));
        }
    }
    Ok(DxNode { countlimit_offset, limit, entries })
}

/// Writes count, limit and entries at the node's countlimit offset.
pub fn write_node(block: &mut [u8], node: &DxNode) {
    let base = node.countlimit_offset;
    for (i, e) in node.entries.iter().enumerate() {
        let off = base + i * DX_ENTRY_SIZE;
        if i > 0 {
            put_le32(block, off, e.hash);
        }
        put_le32(block, off + 4, e.block);
    }
    put_le16(block, base, node.limit);
    put_le16(block, base + 2, node.entries.len() as u16);
}

pub fn checksum(block: &[u8], countlimit_offset: usize, inode_seed: u32) -> Result<u32> {
    let limit = le16(block, countlimit_offset) as usize;
    let count = le16(block, countlimit_offset + 2) as usize;
    let tail = countlimit_offset + limit * DX_ENTRY_SIZE;
    if tail + DX_TAIL_SIZE > block.len() || count > limit {
        return Err(Error::corrupt("htree node has no room for its checksum tail", "htree node"));
    }
    let c = crc32c(inode_seed, &block[..countlimit_offset + count * DX_ENTRY_SIZE]);
    let c = crc32c(c, &block[tail..tail + 4]);
    Ok(crc32c(c, &[0; 4]))
}

pub fn verify_checksum(block: &[u8], countlimit_offset: usize, inode_seed: u32, location: &str) -> Result<()> {
    let limit = le16(block, countlimit_offset) as usize;
    let want = checksum(block, countlimit_offset, inode_seed)
        .map_err(|_| Error::corrupt("htree node has no room for its checksum tail", location))?;
    let have = le32(block, countlimit_offset + limit * DX_ENTRY_SIZE + 4);
    if have != want {
        return Err(Error::corrupt(
            format!("htree node checksum {have:#010x} does not match contents ({want:#010x})"),
            location,
        ));
    }
    Ok(())
}

pub fn set_checksum(block: &mut [u8], countlimit_offset: usize, inode_seed: u32) -> Result<()> {
    let limit = le16(block, countlimit_offset) as usize;
    let tail = countlimit_offset + limit * DX_ENTRY_SIZE;
    if tail + DX_TAIL_SIZE > block.len() {
        return Err(Error::corrupt("htree node has no room for its checksum tail", "htree node"));
    }
    // dt_reserved is covered by the checksum but kept as found: e2fsck -D leaves
    // bytes there and the kernel never clears them. New nodes start zeroed.
    let c = checksum(block, countlimit_offset, inode_seed)?;
    put_le32(block, tail + 4, c);
    Ok(())
}
