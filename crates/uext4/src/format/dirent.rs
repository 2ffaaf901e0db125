//! Linear directory entries (`ext4_dir_entry_2`) and the 12-byte checksum tail.
//!
//! A directory block is a chain of entries whose `rec_len`s add up to exactly the
//! block (or the inline area); a deleted or padding entry has inode 0. With
//! metadata_csum each block ends in a fake entry (inode 0, rec_len 12, name_len 0,
//! file_type 0xDE) holding crc32c(inode seed, block bytes before the tail).

use super::bytes::*;
use super::csum::crc32c;
use crate::error::{Error, Result};

pub const EXT4_FT_UNKNOWN: u8 = 0;
pub const EXT4_FT_REG_FILE: u8 = 1;
pub const EXT4_FT_DIR: u8 = 2;
pub const EXT4_FT_CHRDEV: u8 = 3;
pub const EXT4_FT_BLKDEV: u8 = 4;
pub const EXT4_FT_FIFO: u8 = 5;
pub const EXT4_FT_SOCK: u8 = 6;
pub const EXT4_FT_SYMLINK: u8 = 7;
pub const EXT4_FT_DIR_CSUM: u8 = 0xDE;

pub const EXT4_NAME_LEN: usize = 255;
pub const DIRENT_HEADER_LEN: usize = 8;
pub const DIRENT_TAIL_LEN: usize = 12;

/// Space an entry with a name of `name_len` bytes needs: header + name, rounded to 4.
pub const fn rec_len_for(name_len: usize) -> usize {
    (DIRENT_HEADER_LEN + name_len + 3) & !3
}

/// Decodes rec_len; 65536-byte blocks store a full-block entry as 0 or 65535 and
/// lengths above 65535 in the low two bits. Smaller blocks store it as is, so a
/// damaged rec_len is reported as the value on disk.
pub fn rec_len_from_disk(raw: u16, block_size: usize) -> usize {
    let len = raw as usize;
    if block_size < 65536 {
        len
    } else if raw == 0 || raw == 65535 {
        block_size
    } else {
        (len & 65532) | ((len & 3) << 16)
    }
}

pub fn rec_len_to_disk(len: usize, block_size: usize) -> u16 {
    if len == block_size && block_size >= 65536 {
        65535
    } else {
        ((len & 65532) | ((len >> 16) & 3)) as u16
    }
}

/// The mode's file type (S_IF*) as a dirent file_type.
pub fn file_type_from_mode(mode: u16) -> u8 {
    match mode & 0o170000 {
        0o100000 => EXT4_FT_REG_FILE,
        0o040000 => EXT4_FT_DIR,
        0o020000 => EXT4_FT_CHRDEV,
        0o060000 => EXT4_FT_BLKDEV,
        0o010000 => EXT4_FT_FIFO,
        0o140000 => EXT4_FT_SOCK,
        0o120000 => EXT4_FT_SYMLINK,
        _ => EXT4_FT_UNKNOWN,
    }
}

/// One entry as it lies in a directory block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Byte offset of the entry in its block or area.
    pub offset: usize,
    pub inode: u32,
    pub rec_len: usize,
    pub file_type: u8,
    pub name: &'a [u8],
}

impl DirEntry<'_> {
    pub fn is_tail(&self) -> bool {
        self.inode == 0 && self.rec_len == DIRENT_TAIL_LEN && self.name.is_empty() && self.file_type == EXT4_FT_DIR_CSUM
    }
}

/// Walks the entries of a directory block or inline area, validating each the way
/// the kernel's `ext4_check_dir_entry` does. Without the `filetype` feature the
/// two bytes after rec_len are ext2's 16-bit name_len; as in the kernel (and
/// e2fsprogs' `ext2fs_dirent_name_len`) only the low byte is the length, since no
/// name exceeds 255 bytes, and the high byte, which is then always written 0,
/// gives no type: such entries read as EXT4_FT_UNKNOWN. The checksum tail keeps
/// its 0xDE marker either way.
pub struct DirEntryIter<'a> {
    buf: &'a [u8],
    pos: usize,
    block_size: usize,
    has_filetype: bool,
    inodes_count: u32,
    location: &'a str,
    failed: bool,
}

impl<'a> DirEntryIter<'a> {
    pub fn new(buf: &'a [u8], block_size: usize, has_filetype: bool, inodes_count: u32, location: &'a str) -> Self {
        DirEntryIter { buf, pos: 0, block_size, has_filetype, inodes_count, location, failed: false }
    }
}

impl<'a> Iterator for DirEntryIter<'a> {
    type Item = Result<DirEntry<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        let b = self.buf;
        let off = self.pos;
        let fail = |s: &mut Self, what: String| {
            s.failed = true;
            Some(Err(Error::corrupt(what, format!("{} offset {off}", s.location))))
        };
        if off + DIRENT_HEADER_LEN > b.len() {
            return fail(self, format!("directory entry header runs past the end ({} bytes)", b.len()));
        }
        let inode = le32(b, off);
        let rec_len = rec_len_from_disk(le16(b, off + 4), self.block_size);
        let name_len = b[off + 6] as usize;
        let is_tail_shape = inode == 0 && rec_len == DIRENT_TAIL_LEN && name_len == 0 && b[off + 7] == EXT4_FT_DIR_CSUM;
        let file_type = if self.has_filetype || is_tail_shape { b[off + 7] } else { EXT4_FT_UNKNOWN };
        if rec_len < rec_len_for(0) + 4 && !(rec_len == DIRENT_TAIL_LEN && inode == 0) {
            return fail(self, format!("rec_len {rec_len} is smaller than the minimal 12"));
        }
        if !rec_len.is_multiple_of(4) {
            return fail(self, format!("rec_len {rec_len} is not a multiple of 4"));
        }
        if off + rec_len > b.len() {
            return fail(self, format!("rec_len {rec_len} runs past the end of the block ({} bytes)", b.len()));
        }
        if rec_len < rec_len_for(name_len) {
            return fail(self, format!("rec_len {rec_len} is too small for a name of {name_len} bytes"));
        }
        if inode > self.inodes_count {
            return fail(self, format!("entry names inode {inode}, beyond the inode count {}", self.inodes_count));
        }
        self.pos += rec_len;
        let name = &b[off + DIRENT_HEADER_LEN..off + DIRENT_HEADER_LEN + name_len];
        Some(Ok(DirEntry { offset: off, inode, rec_len, file_type, name }))
    }
}

/// Writes one entry header and name at `off`. Without the `filetype` feature the
/// caller passes `file_type` 0 (the high byte of ext2's 16-bit name_len).
pub fn write_entry(
    b: &mut [u8],
    off: usize,
    inode: u32,
    rec_len: usize,
    file_type: u8,
    name: &[u8],
    block_size: usize,
) {
    put_le32(b, off, inode);
    put_le16(b, off + 4, rec_len_to_disk(rec_len, block_size));
    b[off + 6] = name.len() as u8;
    b[off + 7] = file_type;
    b[off + DIRENT_HEADER_LEN..off + DIRENT_HEADER_LEN + name.len()].copy_from_slice(name);
}

/// True when the block ends in a well-formed checksum tail.
pub fn has_tail(block: &[u8]) -> bool {
    let t = block.len() - DIRENT_TAIL_LEN;
    le32(block, t) == 0
        && le16(block, t + 4) == DIRENT_TAIL_LEN as u16
        && block[t + 6] == 0
        && block[t + 7] == EXT4_FT_DIR_CSUM
}

pub fn block_checksum(block: &[u8], inode_seed: u32) -> u32 {
    crc32c(inode_seed, &block[..block.len() - DIRENT_TAIL_LEN])
}

pub fn verify_block_checksum(block: &[u8], inode_seed: u32, location: &str) -> Result<()> {
    if !has_tail(block) {
        return Err(Error::corrupt("directory block has no checksum tail", location));
    }
    let have = le32(block, block.len() - 4);
    let want = block_checksum(block, inode_seed);
    if have != want {
        return Err(Error::corrupt(
            format!("directory block checksum {have:#010x} does not match contents ({want:#010x})"),
            location,
        ));
    }
    Ok(())
}

/// Writes the tail entry and its checksum.
pub fn set_tail(block: &mut [u8], inode_seed: u32) {
    let t = block.len() - DIRENT_TAIL_LEN;
    block[t..].fill(0);
    put_le16(block, t + 4, DIRENT_TAIL_LEN as u16);
    block[t + 7] = EXT4_FT_DIR_CSUM;
    let c = block_checksum(block, inode_seed);
    put_le32(block, block.len() - 4, c);
}
