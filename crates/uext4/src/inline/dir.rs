//! Inline directories, as the kernel's `fs/ext4/inline.c` keeps them: i_block
//! starts with the parent's inode number (the implicit ".."; "." is implicit
//! too), then entries fill the other 56 bytes; when those are full the
//! system.data value grows once to all the body can give (`ext4_update_inline_dir`:
//! i_size becomes the capacity) and takes entries in a second run; when that is
//! full too the directory moves to one block (`ext4_convert_inline_data_nolock`,
//! `uninline`), laid out byte for byte as the kernel's
//! `ext4_finish_convert_inline_dir` lays it out, and the ordinary block paths go
//! on from there (to an htree when that block fills).
//!
//! Each run of entries is changed as the kernel changes a directory block: a name
//! goes into the first entry with room to spare (`ext4_find_dest_de`), a removed
//! entry merges into the one before it in its run, or is emptied when it is the
//! first, and its bytes are wiped (`ext4_generic_delete_entry`).
//!
//! Invariant: an inline directory's i_size equals its inline bytes (60 plus the
//! system.data value); anything else is Corrupt. The caller holds the directory's
//! structure lock for writing (inline directories are never changed under a
//! shared hold: pdirops shares only indexed directories) and writes the inode.

use super::EXT4_MIN_INLINE_DATA_SIZE;
use crate::error::{Error, Result};
use crate::format::bytes::{le32, put_le16, put_le32};
use crate::format::dirent::{self, DirEntryIter, EXT4_FT_DIR};
use crate::format::inode::Inode;
use crate::fs::Filesystem;
use crate::journal::handle::Handle;

/// Bytes of i_block holding the parent's inode number (EXT4_INLINE_DOTDOT_SIZE).
const EXT4_INLINE_DOTDOT_SIZE: usize = 4;

/// What adding a name to an inline directory came to.
pub(crate) enum InlineAdd {
    /// The name is in; the inode (changed in place) is to be written.
    Added,
    /// No room: the directory must move to a block first. The inode may have
    /// changed (system.data grown) and is to be written before that move.
    Full,
}

impl Filesystem {
    /// Makes `inode` a new, empty inline directory under `parent` (the kernel's
    /// `ext4_try_create_inline_dir`); false when this inode cannot be inline.
    pub(crate) fn init_inline_dir(&self, ino: u32, inode: &mut Inode, parent: u32) -> Result<bool> {
        if !self.inline_allowed(ino, inode)? {
            return Ok(false);
        }
        let mut bytes = vec![0u8; EXT4_MIN_INLINE_DATA_SIZE];
        put_le32(&mut bytes, 0, parent);
        // One empty entry covers the rest of i_block.
        let rest = EXT4_MIN_INLINE_DATA_SIZE - EXT4_INLINE_DOTDOT_SIZE;
        put_le16(&mut bytes, EXT4_INLINE_DOTDOT_SIZE + 4, rest as u16);
        self.store_inline(ino, inode, &bytes)?;
        inode.i_size = EXT4_MIN_INLINE_DATA_SIZE as u64;
        Ok(true)
    }

    /// An inline directory's bytes, checked: i_size matches them, and each run of
    /// entries parses to its end.
    pub(crate) fn inline_dir_bytes(&self, dir: u32, inode: &Inode) -> Result<Vec<u8>> {
        let data = self.inline_data(dir, inode)?;
        if inode.i_size != data.len() as u64 {
            return Err(Error::corrupt(
                format!("inline directory of {} bytes holds {} inline", inode.i_size, data.len()),
                format!("directory inode {dir}"),
            ));
        }
        for (start, end) in Self::inline_runs(data.len()) {
            for e in self.inline_entries(dir, &data[start..end], start) {
                e?;
            }
        }
        Ok(data)
    }

    /// The runs of entries in `len` inline bytes: i_block after the parent, and
    /// the system.data value when there is one.
    fn inline_runs(len: usize) -> Vec<(usize, usize)> {
        let mut runs = vec![(EXT4_INLINE_DOTDOT_SIZE, EXT4_MIN_INLINE_DATA_SIZE)];
        if len > EXT4_MIN_INLINE_DATA_SIZE {
            runs.push((EXT4_MIN_INLINE_DATA_SIZE, len));
        }
        runs
    }

    fn inline_entries<'a>(&self, dir: u32, run: &'a [u8], start: usize) -> DirEntryIter<'a> {
        let what = if start < EXT4_MIN_INLINE_DATA_SIZE { "i_block" } else { "system.data" };
        // The location string must outlive the iterator: leak-free by keeping it static.
        let _ = dir;
        DirEntryIter::new(run, run.len(), self.vol.geo.has_filetype, self.vol.geo.inodes_count, what)
    }

    /// Puts an entry into the run `[start, end)` of `data` if some entry there has
    /// room (the kernel's `ext4_find_dest_de` and `ext4_insert_dentry`).
    fn insert_in_run(
        &self,
        dir: u32,
        data: &mut [u8],
        start: usize,
        end: usize,
        entry: (&[u8], u32, u8),
    ) -> Result<bool> {
        let (name, ino, file_type) = entry;
        let need = dirent::rec_len_for(name.len());
        let mut slot = None;
        for e in self.inline_entries(dir, &data[start..end], start) {
            let e = e.map_err(|e| Self::located(e, dir))?;
            let used = if e.inode == 0 { 0 } else { dirent::rec_len_for(e.name.len()) };
            if e.rec_len - used >= need {
                slot = Some((start + e.offset, e.rec_len, used));
                break;
            }
        }
        let Some((off, rec_len, used)) = slot else { return Ok(false) };
        let run_len = end - start;
        if used > 0 {
            put_le16(data, off + 4, dirent::rec_len_to_disk(used, run_len));
        }
        let file_type = if self.vol.geo.has_filetype { file_type } else { 0 };
        dirent::write_entry(data, off + used, ino, rec_len - used, file_type, name, run_len);
        Ok(true)
    }

    fn located(e: Error, dir: u32) -> Error {
        match e {
            Error::Corrupt { what, location } => {
                Error::Corrupt { what, location: format!("inline directory inode {dir}, {location}") }
            }
            other => other,
        }
    }

    /// Adds `name` -> `ino` to inline directory `dir` (the kernel's
    /// `ext4_try_add_inline_entry`): into i_block, else into the system.data run,
    /// growing it first to the body's capacity when it is empty.
    pub(crate) fn inline_add_entry(
        &self,
        dir: u32,
        inode: &mut Inode,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<InlineAdd> {
        let mut data = self.inline_dir_bytes(dir, inode)?;
        let entry = (name, ino, file_type);
        if self.insert_in_run(dir, &mut data, EXT4_INLINE_DOTDOT_SIZE, EXT4_MIN_INLINE_DATA_SIZE, entry)? {
            self.store_inline(dir, inode, &data)?;
            return Ok(InlineAdd::Added);
        }
        if data.len() == EXT4_MIN_INLINE_DATA_SIZE {
            let capacity = self.max_inline_size(dir, inode)?;
            if capacity < EXT4_MIN_INLINE_DATA_SIZE + dirent::rec_len_for(1) {
                return Ok(InlineAdd::Full);
            }
            // One empty entry over the whole new run (ext4_update_final_de).
            data.resize(capacity, 0);
            let run = capacity - EXT4_MIN_INLINE_DATA_SIZE;
            put_le16(&mut data, EXT4_MIN_INLINE_DATA_SIZE + 4, dirent::rec_len_to_disk(run, run));
            self.store_inline(dir, inode, &data)?;
            inode.i_size = capacity as u64;
        }
        let len = data.len();
        if self.insert_in_run(dir, &mut data, EXT4_MIN_INLINE_DATA_SIZE, len, entry)? {
            self.store_inline(dir, inode, &data)?;
            return Ok(InlineAdd::Added);
        }
        Ok(InlineAdd::Full)
    }

    /// Finds `name` in an inline directory: (its offset, its run).
    fn inline_find(&self, dir: u32, data: &[u8], name: &[u8]) -> Result<Option<(usize, (usize, usize))>> {
        for (start, end) in Self::inline_runs(data.len()) {
            for e in self.inline_entries(dir, &data[start..end], start) {
                let e = e.map_err(|e| Self::located(e, dir))?;
                if e.inode != 0 && e.name == name {
                    return Ok(Some((start + e.offset, (start, end))));
                }
            }
        }
        Ok(None)
    }

    /// Removes `name` from inline directory `dir` in `inode`; returns the inode it named.
    pub(crate) fn inline_remove_entry(&self, dir: u32, inode: &mut Inode, name: &[u8]) -> Result<u32> {
        let mut data = self.inline_dir_bytes(dir, inode)?;
        let shown = || Error::NotFound(String::from_utf8_lossy(name).into_owned());
        let (off, (start, end)) = self.inline_find(dir, &data, name)?.ok_or_else(shown)?;
        let run_len = end - start;
        let ino = le32(&data, off);
        let rec_len = dirent::rec_len_from_disk(crate::format::bytes::le16(&data, off + 4), run_len);
        // The entry before it in its run, if any.
        let mut prev = None;
        for e in self.inline_entries(dir, &data[start..end], start) {
            let e = e.map_err(|e| Self::located(e, dir))?;
            if start + e.offset == off {
                break;
            }
            prev = Some((start + e.offset, e.rec_len));
        }
        match prev {
            Some((poff, prec)) => {
                put_le16(&mut data, poff + 4, dirent::rec_len_to_disk(prec + rec_len, run_len));
                data[off..off + rec_len].fill(0);
            }
            None => {
                put_le32(&mut data, off, 0);
                data[off + 6..off + rec_len].fill(0);
            }
        }
        self.store_inline(dir, inode, &data)?;
        Ok(ino)
    }

    /// Points the entry `name` of inline directory `dir` at `ino`, in place.
    pub(crate) fn inline_retarget_entry(
        &self,
        dir: u32,
        inode: &mut Inode,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<()> {
        let mut data = self.inline_dir_bytes(dir, inode)?;
        let (off, _) = self
            .inline_find(dir, &data, name)?
            .ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        put_le32(&mut data, off, ino);
        if self.vol.geo.has_filetype {
            data[off + 7] = file_type;
        }
        self.store_inline(dir, inode, &data)
    }

    /// Sets an inline directory's parent (its implicit "..").
    pub(crate) fn inline_set_parent(&self, dir: u32, inode: &mut Inode, parent: u32) -> Result<()> {
        let mut data = self.inline_dir_bytes(dir, inode)?;
        put_le32(&mut data, 0, parent);
        self.store_inline(dir, inode, &data)
    }

    /// The block an inline directory moves to, as the kernel's
    /// `ext4_finish_convert_inline_dir` makes it: "." and ".." of 12 bytes each,
    /// then the inline entries after the parent copied as they are (both runs, with
    /// their rec_lens), the last one stretched to the end of the block (or to the
    /// checksum tail).
    pub(crate) fn inline_dir_block(&self, dir: u32, inode: &Inode, data: &[u8]) -> Result<Vec<u8>> {
        let bs = self.vol.geo.block_size;
        let data = {
            // Checked as a whole (i_size, runs) before anything is copied.
            let checked = self.inline_dir_bytes(dir, inode)?;
            debug_assert_eq!(checked, data);
            checked
        };
        let tail = if self.vol.geo.metadata_csum { dirent::DIRENT_TAIL_LEN } else { 0 };
        let header = 2 * dirent::rec_len_for(2);
        let copied = data.len() - EXT4_INLINE_DOTDOT_SIZE;
        if header + copied > bs - tail {
            return Err(Error::corrupt("inline directory larger than a block", format!("directory inode {dir}")));
        }
        let mut block = vec![0u8; bs];
        let ft = if self.vol.geo.has_filetype { EXT4_FT_DIR } else { 0 };
        dirent::write_entry(&mut block, 0, dir, dirent::rec_len_for(1), ft, b".", bs);
        dirent::write_entry(&mut block, 12, le32(&data, 0), dirent::rec_len_for(2), ft, b"..", bs);
        block[header..header + copied].copy_from_slice(&data[EXT4_INLINE_DOTDOT_SIZE..]);
        // The last entry of what was copied reaches to the end (ext4_update_final_de).
        let used = header + copied;
        let mut last = 0;
        let mut off = 0;
        while off < used {
            last = off;
            let len = dirent::rec_len_from_disk(crate::format::bytes::le16(&block, off + 4), bs);
            if len == 0 {
                return Err(Error::corrupt("inline directory entry of rec_len 0", format!("directory inode {dir}")));
            }
            off += len;
        }
        put_le16(&mut block, last + 4, dirent::rec_len_to_disk(bs - tail - last, bs));
        if self.vol.geo.metadata_csum {
            dirent::set_tail(&mut block, self.inode_seed(dir, inode));
        }
        Ok(block)
    }
}

impl Filesystem {
    /// Adds a name to a directory that may be inline: in place when it fits, else
    /// after moving the directory to a block (in this handle). Returns the
    /// directory inode as changed; the caller writes it. `None` when `dir` is not
    /// inline (the caller goes on with the block paths).
    pub(crate) fn add_entry_inline_first(
        &self,
        tx: &mut Handle,
        dir: u32,
        dir_inode: &mut Inode,
        name: &[u8],
        ino: u32,
        file_type: u8,
    ) -> Result<bool> {
        match self.inline_add_entry(dir, dir_inode, name, ino, file_type)? {
            InlineAdd::Added => Ok(true),
            InlineAdd::Full => {
                // The grown (or unchanged) inline inode is the one converted.
                self.write_inode(tx, dir, dir_inode)?;
                self.uninline(tx, dir)?;
                *dir_inode = (*self.inode(dir)?).clone();
                Ok(false)
            }
        }
    }
}
