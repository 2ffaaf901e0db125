//! Extended attributes: entries in the inode body (after i_extra_isize, behind a
//! 4-byte magic) and in one xattr block (32-byte header, then entries; values packed
//! from the end). Entries are terminated by four zero bytes. In the inode, value
//! offsets count from the first entry; in a block, from the block start.
//!
//! The block checksum is crc32c(fs seed, le64 block number ‖ block with h_checksum
//! zeroed). Entry hashes (checked by e2fsck) mix name bytes and value words.

use super::bytes::*;
use super::csum::crc32c;
use crate::error::{Error, Result};

pub const EXT4_XATTR_MAGIC: u32 = 0xEA02_0000;
pub const XATTR_BLOCK_HEADER_LEN: usize = 32;
pub const XATTR_ENTRY_HEADER_LEN: usize = 16;
const H_CHECKSUM_OFFSET: usize = 0x10;

/// (e_name_index, prefix) as the kernel's xattr handlers define them.
pub const NAME_PREFIXES: &[(u8, &str)] = &[
    (1, "user."),
    (2, "system.posix_acl_access"),
    (3, "system.posix_acl_default"),
    (4, "trusted."),
    (6, "security."),
    (7, "system."),
    (8, "system.richacl"),
];

pub const INDEX_USER: u8 = 1;
pub const INDEX_POSIX_ACL_ACCESS: u8 = 2;
pub const INDEX_POSIX_ACL_DEFAULT: u8 = 3;
pub const INDEX_TRUSTED: u8 = 4;
pub const INDEX_SECURITY: u8 = 6;
pub const INDEX_SYSTEM: u8 = 7;

/// An entry with its value.
pub type Attr = (XattrEntry, Vec<u8>);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrEntry {
    pub e_name_index: u8,
    pub name: Vec<u8>,
    pub e_value_offs: u16,
    pub e_value_inum: u32,
    pub e_value_size: u32,
    pub e_hash: u32,
}

impl XattrEntry {
    /// The full attribute name as user space sees it ("user.foo").
    pub fn full_name(&self) -> Vec<u8> {
        let prefix = NAME_PREFIXES.iter().find(|(i, _)| *i == self.e_name_index).map(|(_, p)| *p).unwrap_or("");
        let mut v = prefix.as_bytes().to_vec();
        v.extend_from_slice(&self.name);
        v
    }
}

/// Splits a full name into (index, suffix), choosing the longest matching prefix.
pub fn split_name(full: &[u8]) -> Option<(u8, &[u8])> {
    NAME_PREFIXES
        .iter()
        .filter(|(_, p)| full.starts_with(p.as_bytes()))
        .max_by_key(|(_, p)| p.len())
        .map(|(i, p)| (*i, &full[p.len()..]))
}

/// Space one entry takes: header plus the name, rounded to 4.
pub fn entry_len(name_len: usize) -> usize {
    (XATTR_ENTRY_HEADER_LEN + name_len + 3) & !3
}

pub fn value_len(size: usize) -> usize {
    (size + 3) & !3
}

/// Parses the entry table starting at `entries_off` of `area`, with values
/// addressed relative to `value_base`. Every entry and value must lie inside `area`.
pub fn parse_entries(area: &[u8], entries_off: usize, value_base: usize, location: &str) -> Result<Vec<Attr>> {
    let bad = |what: String| Err(Error::corrupt(what, location));
    let mut out = Vec::new();
    let mut off = entries_off;
    loop {
        if off + 4 > area.len() {
            return bad("xattr entries run past the end without a terminator".into());
        }
        if le32(area, off) == 0 {
            break;
        }
        if off + XATTR_ENTRY_HEADER_LEN > area.len() {
            return bad("xattr entry header runs past the end".into());
        }
        let name_len = area[off] as usize;
        let e = XattrEntry {
            e_name_index: area[off + 1],
            e_value_offs: le16(area, off + 2),
            e_value_inum: le32(area, off + 4),
            e_value_size: le32(area, off + 8),
            e_hash: le32(area, off + 12),
            name: Vec::new(),
        };
        // An empty suffix is normal: POSIX ACLs are index 2 or 3 with no name at all.
        let name_end = off + XATTR_ENTRY_HEADER_LEN + name_len;
        if name_end > area.len() {
            return bad(format!("xattr name of {name_len} bytes runs past the end"));
        }
        let name = area[off + XATTR_ENTRY_HEADER_LEN..name_end].to_vec();
        if e.e_value_inum != 0 {
            return Err(Error::unsupported("xattr values stored in inodes (ea_inode)"));
        }
        let vstart = value_base + e.e_value_offs as usize;
        let vend = vstart + e.e_value_size as usize;
        if e.e_value_size > 0 && (vend > area.len() || vstart < name_end.min(value_base.max(entries_off))) {
            return bad(format!(
                "xattr value at offset {} size {} lies outside the attribute area",
                e.e_value_offs, e.e_value_size
            ));
        }
        let value = if e.e_value_size > 0 { area[vstart..vend].to_vec() } else { Vec::new() };
        out.push((XattrEntry { name, ..e }, value));
        off += entry_len(name_len);
    }
    Ok(out)
}

/// Parses the in-inode xattr area; an area without the magic holds no attributes.
pub fn parse_ibody(area: &[u8], ino: u32) -> Result<Vec<Attr>> {
    if area.len() < 4 || le32(area, 0) != EXT4_XATTR_MAGIC {
        return Ok(Vec::new());
    }
    parse_entries(area, 4, 4, &format!("in-inode xattrs of inode {ino}"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XattrBlockHeader {
    pub h_magic: u32,
    pub h_refcount: u32,
    pub h_blocks: u32,
    pub h_hash: u32,
    pub h_checksum: u32,
}

impl XattrBlockHeader {
    pub fn parse(b: &[u8]) -> XattrBlockHeader {
        XattrBlockHeader {
            h_magic: le32(b, 0),
            h_refcount: le32(b, 4),
            h_blocks: le32(b, 8),
            h_hash: le32(b, 0xC),
            h_checksum: le32(b, H_CHECKSUM_OFFSET),
        }
    }

    pub fn write(&self, b: &mut [u8]) {
        put_le32(b, 0, self.h_magic);
        put_le32(b, 4, self.h_refcount);
        put_le32(b, 8, self.h_blocks);
        put_le32(b, 0xC, self.h_hash);
        put_le32(b, H_CHECKSUM_OFFSET, self.h_checksum);
    }
}

pub fn parse_block(block: &[u8], blocknr: u64) -> Result<(XattrBlockHeader, Vec<Attr>)> {
    let location = format!("xattr block {blocknr}");
    let h = XattrBlockHeader::parse(block);
    if h.h_magic != EXT4_XATTR_MAGIC {
        return Err(Error::corrupt(format!("bad xattr block magic {:#x}", h.h_magic), location));
    }
    if h.h_blocks != 1 {
        return Err(Error::corrupt(format!("xattr block claims {} blocks", h.h_blocks), location));
    }
    let entries = parse_entries(block, XATTR_BLOCK_HEADER_LEN, 0, &location)?;
    Ok((h, entries))
}

pub fn block_checksum(block: &[u8], blocknr: u64, fs_seed: u32) -> u32 {
    let c = crc32c(fs_seed, &blocknr.to_le_bytes());
    let c = crc32c(c, &block[..H_CHECKSUM_OFFSET]);
    let c = crc32c(c, &[0; 4]);
    crc32c(c, &block[H_CHECKSUM_OFFSET + 4..])
}

pub fn verify_block_checksum(block: &[u8], blocknr: u64, fs_seed: u32) -> Result<()> {
    let have = le32(block, H_CHECKSUM_OFFSET);
    let want = block_checksum(block, blocknr, fs_seed);
    if have != want {
        return Err(Error::corrupt(
            format!("xattr block checksum {have:#010x} does not match contents ({want:#010x})"),
            format!("xattr block {blocknr}"),
        ));
    }
    Ok(())
}

pub fn set_block_checksum(block: &mut [u8], blocknr: u64, fs_seed: u32) {
    let c = block_checksum(block, blocknr, fs_seed);
    put_le32(block, H_CHECKSUM_OFFSET, c);
}

/// The entry hash e2fsck checks: name bytes rotated in 5 bits at a time, then the
/// value's little-endian words 16 bits at a time.
pub fn entry_hash(name: &[u8], value: &[u8]) -> u32 {
    let mut hash: u32 = 0;
    for &c in name {
        hash = (hash << 5) ^ (hash >> 27) ^ c as u32;
    }
    let mut padded = value.to_vec();
    padded.resize(value_len(value.len()), 0);
    for w in padded.chunks_exact(4) {
        hash = (hash << 16) ^ (hash >> 16) ^ le32(w, 0);
    }
    hash
}

/// The block hash: entry hashes folded together; zero if any entry hash is zero.
pub fn block_hash(entry_hashes: &[u32]) -> u32 {
    let mut hash: u32 = 0;
    for &h in entry_hashes {
        if h == 0 {
            return 0;
        }
        hash = (hash << 16) ^ (hash >> 16) ^ h;
    }
    hash
}
