//! Inline data: a small file's or directory's bytes kept in the inode — the first 60
//! in i_block, the rest in the value of the `system.data` xattr in the inode body.
//! An inline directory's i_block starts with the parent's inode number (the
//! implicit ".."), followed by entries; "." is implicit too.

use crate::error::{Error, Result};
use crate::format::inode::Inode;
use crate::format::xattr::{self, INDEX_SYSTEM};
use crate::fs::Filesystem;

impl Filesystem {
    /// The inline bytes: i_block followed by the system.data value, as stored.
    pub fn inline_data(&self, ino: u32, inode: &Inode) -> Result<Vec<u8>> {
        let mut data = inode.i_block.to_vec();
        let attrs = xattr::parse_ibody(inode.xattr_area(), ino)?;
        let found = attrs.into_iter().find(|(e, _)| e.e_name_index == INDEX_SYSTEM && e.name == b"data");
        match found {
            Some((_, value)) => data.extend_from_slice(&value),
            None => {
                return Err(Error::corrupt("inline inode has no system.data attribute", format!("inode {ino}")));
            }
        }
        Ok(data)
    }
}
