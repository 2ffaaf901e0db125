//! Extent tree nodes: a 12-byte header, then 12-byte index entries (interior) or
//! extents (leaves). The root lives in the inode's 60-byte i_block (4 entries);
//! other nodes fill a block and end with a 4-byte checksum tail right after
//! `eh_max` entries: crc32c(inode seed, node bytes before the tail).
//!
//! An extent's `ee_len` above 32768 marks it unwritten (allocated, reads as zeros);
//! its length is then `ee_len - 32768`.

use super::bytes::*;
use super::csum::crc32c;
use crate::error::{Error, Result};

pub const EXT4_EXT_MAGIC: u16 = 0xF30A;
pub const EXT_INIT_MAX_LEN: u32 = 32768;
pub const EXT_UNWRITTEN_MAX_LEN: u32 = 32767;
/// The kernel refuses deeper trees; so do we, which also stops loops.
pub const EXT4_MAX_EXTENT_DEPTH: u16 = 5;
const HEADER_SIZE: usize = 12;
const ENTRY_SIZE: usize = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentHeader {
    pub eh_magic: u16,
    pub eh_entries: u16,
    pub eh_max: u16,
    pub eh_depth: u16,
    pub eh_generation: u32,
}

/// A leaf entry: logical blocks [ee_block, ee_block + len) map to physical blocks
/// starting at `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub ee_block: u32,
    pub len: u32,
    pub unwritten: bool,
    pub start: u64,
}

/// An interior entry: the subtree at physical block `leaf` covers logical blocks from `ei_block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentIndex {
    pub ei_block: u32,
    pub leaf: u64,
}

/// A parsed node: header plus either index entries or extents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtentNode {
    Index(ExtentHeader, Vec<ExtentIndex>),
    Leaf(ExtentHeader, Vec<Extent>),
}

impl ExtentHeader {
    pub fn parse(b: &[u8]) -> ExtentHeader {
        ExtentHeader {
            eh_magic: le16(b, 0),
            eh_entries: le16(b, 2),
            eh_max: le16(b, 4),
            eh_depth: le16(b, 6),
            eh_generation: le32(b, 8),
        }
    }

    pub fn write(&self, b: &mut [u8]) {
        put_le16(b, 0, self.eh_magic);
        put_le16(b, 2, self.eh_entries);
        put_le16(b, 4, self.eh_max);
        put_le16(b, 6, self.eh_depth);
        put_le32(b, 8, self.eh_generation);
    }
}

impl Extent {
    pub fn parse(b: &[u8]) -> Extent {
        let raw_len = le16(b, 4) as u32;
        let (len, unwritten) =
            if raw_len > EXT_INIT_MAX_LEN { (raw_len - EXT_INIT_MAX_LEN, true) } else { (raw_len, false) };
        Extent { ee_block: le32(b, 0), len, unwritten, start: lo_hi(le32(b, 8), le16(b, 6) as u32) }
    }

    pub fn write(&self, b: &mut [u8]) {
        put_le32(b, 0, self.ee_block);
        let raw_len = if self.unwritten { self.len + EXT_INIT_MAX_LEN } else { self.len };
        put_le16(b, 4, raw_len as u16);
        put_le16(b, 6, (self.start >> 32) as u16);
        put_le32(b, 8, self.start as u32);
    }

    pub fn end(&self) -> u64 {
        self.ee_block as u64 + self.len as u64
    }
}

impl ExtentIndex {
    pub fn parse(b: &[u8]) -> ExtentIndex {
        ExtentIndex { ei_block: le32(b, 0), leaf: lo_hi(le32(b, 4), le16(b, 8) as u32) }
    }

    pub fn write(&self, b: &mut [u8]) {
        put_le32(b, 0, self.ei_block);
        put_le32(b, 4, self.leaf as u32);
        put_le16(b, 8, (self.leaf >> 32) as u16);
        put_le16(b, 10, 0);
    }
}

impl ExtentNode {
    /// Parses a node from `b` (the 60-byte i_block or a whole block) and checks what
    /// the kernel's `__ext4_ext_check` checks without knowing the filesystem: magic,
    /// a non-zero max within the space, entries within max, an index node that is not
    /// empty, the expected depth, and entries that are sorted, non-empty, do not
    /// overlap and end within 2^32 logical blocks. Physical block numbers are the
    /// caller's to check (`Filesystem::check_extent_node`).
    pub fn parse(b: &[u8], expected_depth: Option<u16>, location: &str) -> Result<ExtentNode> {
        if b.len() < HEADER_SIZE {
            return Err(Error::corrupt("extent node shorter than its header", location));
        }
        let h = ExtentHeader::parse(b);
        let bad = |what: String| Err(Error::corrupt(what, location));
        if h.eh_magic != EXT4_EXT_MAGIC {
            return bad(format!("bad extent header magic {:#06x}", h.eh_magic));
        }
        let capacity = (b.len() - HEADER_SIZE) / ENTRY_SIZE;
        if h.eh_max == 0 {
            return bad("extent header has eh_max 0".into());
        }
        if h.eh_max as usize > capacity || h.eh_entries > h.eh_max {
            return bad(format!(
                "extent header entries {} / max {} exceed room for {capacity}",
                h.eh_entries, h.eh_max
            ));
        }
        if h.eh_depth > EXT4_MAX_EXTENT_DEPTH {
            return bad(format!("extent tree depth {} is deeper than {EXT4_MAX_EXTENT_DEPTH}", h.eh_depth));
        }
        if let Some(d) = expected_depth {
            if h.eh_depth != d {
                return bad(format!("extent node has depth {} where {d} was expected", h.eh_depth));
            }
        }
        // An index node without entries maps nothing and cannot be descended: the
        // kernel calls it corrupt rather than a hole.
        if h.eh_depth > 0 && h.eh_entries == 0 {
            return bad(format!("extent index node at depth {} has no entries", h.eh_depth));
        }
        let entries = (0..h.eh_entries as usize).map(|i| &b[HEADER_SIZE + i * ENTRY_SIZE..][..ENTRY_SIZE]);
        let node = if h.eh_depth == 0 {
            let v: Vec<Extent> = entries.map(Extent::parse).collect();
            for e in &v {
                if e.len == 0 {
                    return bad(format!("extent at logical {} has length 0", e.ee_block));
                }
                if e.end() > 1 << 32 {
                    return bad(format!("extent at logical {} of {} blocks ends past 2^32", e.ee_block, e.len));
                }
            }
            for w in v.windows(2) {
                if w[1].ee_block as u64 <= w[0].ee_block as u64 || w[0].end() > w[1].ee_block as u64 {
                    return bad(format!(
                        "extents at logical {} and {} overlap or are unsorted",
                        w[0].ee_block, w[1].ee_block
                    ));
                }
            }
            ExtentNode::Leaf(h, v)
        } else {
            let v: Vec<ExtentIndex> = entries.map(ExtentIndex::parse).collect();
            for w in v.windows(2) {
                if w[1].ei_block <= w[0].ei_block {
                    return bad(format!(
                        "extent index entries at {} and {} are unsorted",
                        w[0].ei_block, w[1].ei_block
                    ));
                }
            }
            ExtentNode::Index(h, v)
        };
        Ok(node)
    }

    pub fn header(&self) -> &ExtentHeader {
        match self {
            ExtentNode::Index(h, _) | ExtentNode::Leaf(h, _) => h,
        }
    }

    /// Serializes into `b` (i_block or a block). Slots past `eh_entries` are left as
    /// they are: the kernel leaves stale entries there, and keeping them makes a
    /// parse/write round trip exact. Fresh nodes start from zeroed buffers.
    pub fn write(&self, b: &mut [u8]) {
        let h = self.header();
        h.write(b);
        match self {
            ExtentNode::Leaf(_, v) => {
                for (i, e) in v.iter().enumerate() {
                    e.write(&mut b[HEADER_SIZE + i * ENTRY_SIZE..]);
                }
            }
            ExtentNode::Index(_, v) => {
                for (i, e) in v.iter().enumerate() {
                    e.write(&mut b[HEADER_SIZE + i * ENTRY_SIZE..]);
                }
            }
        }
    }
}

/// Where a non-root node's checksum tail sits: right after eh_max entries.
pub fn tail_offset(eh_max: u16) -> usize {
    HEADER_SIZE + eh_max as usize * ENTRY_SIZE
}

/// The number of entries a full block can hold, leaving room for the tail.
pub fn max_entries_in_block(block_size: usize) -> u16 {
    ((block_size - HEADER_SIZE - 4) / ENTRY_SIZE) as u16
}

pub fn block_checksum(block: &[u8], inode_seed: u32) -> u32 {
    let h = ExtentHeader::parse(block);
    crc32c(inode_seed, &block[..tail_offset(h.eh_max).min(block.len())])
}

/// Verifies a non-root extent block's tail checksum.
pub fn verify_block_checksum(block: &[u8], inode_seed: u32, location: &str) -> Result<()> {
    let h = ExtentHeader::parse(block);
    let off = tail_offset(h.eh_max);
    if off + 4 > block.len() {
        return Err(Error::corrupt("extent block has no room for its checksum tail", location));
    }
    let have = le32(block, off);
    let want = crc32c(inode_seed, &block[..off]);
    if have != want {
        return Err(Error::corrupt(
            format!("extent block checksum {have:#010x} does not match contents ({want:#010x})"),
            location,
        ));
    }
    Ok(())
}

pub fn set_block_checksum(block: &mut [u8], inode_seed: u32) {
    let h = ExtentHeader::parse(block);
    let off = tail_offset(h.eh_max);
    let c = crc32c(inode_seed, &block[..off]);
    put_le32(block, off, c);
}
