//! Reading extended attributes: the inode body first, then the xattr block (whose
//! checksum is verified once through the cache). POSIX ACLs are stored in ext4's
//! compact form and are returned in the form user space sees (`getfattr`).

use crate::error::{Error, Result};
use crate::format::acl;
use crate::format::xattr::{self, INDEX_POSIX_ACL_ACCESS, INDEX_POSIX_ACL_DEFAULT, INDEX_SYSTEM};
use crate::fs::Filesystem;

/// An attribute as stored on disk.
pub struct RawXattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    pub name_index: u8,
}

impl Filesystem {
    /// Every attribute as stored, inode body before block.
    pub fn xattrs_raw(&self, ino: u32) -> Result<Vec<RawXattr>> {
        let inode = self.inode(ino)?;
        let mut out = Vec::new();
        for (e, v) in xattr::parse_ibody(inode.xattr_area(), ino)? {
            out.push(RawXattr { name: e.full_name(), value: v, name_index: e.e_name_index });
        }
        if inode.i_file_acl != 0 {
            let blk = inode.i_file_acl;
            self.check_block(blk, &|| format!("xattr block of inode {ino}"))?;
            let verify = self.geo.metadata_csum && self.geo.verify_checksums;
            let seed = self.geo.csum_seed;
            let buf = self.cache.get_verified(blk, |b| {
                xattr::parse_block(b, blk)?;
                if verify {
                    xattr::verify_block_checksum(b, blk, seed)?;
                }
                Ok(())
            })?;
            let data = buf.read();
            for (e, v) in xattr::parse_block(&data, blk)?.1 {
                out.push(RawXattr { name: e.full_name(), value: v, name_index: e.e_name_index });
            }
        }
        Ok(out)
    }

    /// Attributes as `listxattr`/`getxattr` show them: system.data (inline data)
    /// hidden, ACLs converted to the user-space format.
    pub fn xattrs(&self, ino: u32) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for RawXattr { name, value, name_index: index } in self.xattrs_raw(ino)? {
            if index == INDEX_SYSTEM && name == b"system.data" {
                continue;
            }
            let value = if index == INDEX_POSIX_ACL_ACCESS || index == INDEX_POSIX_ACL_DEFAULT {
                acl::disk_to_user(&value).map_err(|what| Error::corrupt(what, format!("ACL of inode {ino}")))?
            } else {
                value
            };
            out.push((name, value));
        }
        Ok(out)
    }

    pub fn get_xattr(&self, ino: u32, name: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.xattrs(ino)?.into_iter().find(|(n, _)| n == name).map(|(_, v)| v))
    }
}
