//! Reading extended attributes: the inode body first, then the xattr block (whose
//! checksum is verified once through the cache). POSIX ACLs are stored in ext4's
//! compact form and are returned in the form user space sees (`getfattr`).

use crate::error::{Error, Result};
use crate::format::acl;
use crate::format::xattr::{
    self, INDEX_POSIX_ACL_ACCESS, INDEX_POSIX_ACL_DEFAULT, INDEX_SECURITY, INDEX_SYSTEM, INDEX_TRUSTED, INDEX_USER,
};
use crate::fs::Filesystem;

/// An attribute as stored on disk.
pub struct RawXattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    pub name_index: u8,
}

impl Filesystem {
    #[doc(hidden)]
    /// Every attribute as stored, inode body before block.
    pub fn xattrs_raw(&self, ino: u32) -> Result<Vec<RawXattr>> {
        let inode = self.inode(ino)?;
        let mut out = Vec::new();
        for (e, v) in xattr::parse_ibody(inode.xattr_area(), ino)? {
            out.push(RawXattr { name: e.full_name(), value: v, name_index: e.e_name_index });
        }
        if inode.i_file_acl != 0 {
            let blk = inode.i_file_acl;
            let buf = self.xattr_block(ino, blk)?;
            let data = buf.read();
            for (e, v) in xattr::parse_block(&data, blk)?.1 {
                out.push(RawXattr { name: e.full_name(), value: v, name_index: e.e_name_index });
            }
        }
        Ok(out)
    }

    /// Inode `ino`'s xattr block `blk`, checked before anything reads or changes it:
    /// inside the filesystem and clear of its metadata, parsed, and its checksum
    /// verified once through the cache.
    pub(crate) fn xattr_block(&self, ino: u32, blk: u64) -> Result<std::sync::Arc<crate::cache::Buffer>> {
        self.vol.check_metadata_free_range(blk, 1, &|| format!("xattr block of inode {ino}"))?;
        let verify = self.vol.geo.metadata_csum && self.vol.geo.verify_checksums;
        let seed = self.vol.geo.csum_seed;
        let buf = self.vol.cache.get_verified_as(blk, crate::dev::IoClass::Other, |b| {
            if verify {
                xattr::verify_block_checksum(b, blk, seed)?;
            }
            Ok(())
        })?;
        xattr::parse_block(&buf.read(), blk)?;
        Ok(buf)
    }

    /// Attributes as `listxattr`/`getxattr` show them: system.data (inline data)
    /// hidden, ACLs converted to the user-space format.
    ///
    /// # Errors
    /// `Corrupt` for a damaged attribute area.
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

    /// The value of attribute `name` (as user space spells it, e.g. `user.comment`).
    ///
    /// # Errors
    /// `NotFound` (ENODATA) when the attribute is absent; `OutOfRange` for a name over 255 bytes;
    /// `Unsupported` for an unknown namespace; `Corrupt` for a damaged attribute area.
    pub fn get_xattr(&self, ino: u32, name: &[u8]) -> Result<Option<Vec<u8>>> {
        settable_name(name)?;
        Ok(self.xattrs(ino)?.into_iter().find(|(n, _)| n == name).map(|(_, v)| v))
    }
}

/// Splits a name user space passes to get/set/removexattr into (index, suffix),
/// accepting only what the kernel's ext4 xattr handlers accept: `user.`,
/// `trusted.` and `security.` with a non-empty suffix, and the two POSIX ACL
/// names exactly. Everything else under `system.` — above all `system.data`,
/// which holds inline data and must change only with the inode's contents —
/// has no handler, so the kernel answers EOPNOTSUPP, as this does.
///
/// # Errors
/// `Unsupported` for a namespace without a handler; `Invalid` for a bare prefix
/// (`user.`); `OutOfRange` for a name over 255 bytes.
fn settable_name(name: &[u8]) -> Result<(u8, &[u8])> {
    let shown = || String::from_utf8_lossy(name).into_owned();
    let (index, suffix) =
        xattr::split_name(name).ok_or_else(|| Error::unsupported(format!("xattr namespace of {}", shown())))?;
    if name.len() > 255 {
        return Err(Error::OutOfRange(format!("xattr name of {} bytes is longer than 255", name.len())));
    }
    match index {
        INDEX_USER | INDEX_TRUSTED | INDEX_SECURITY if suffix.is_empty() => {
            Err(Error::Invalid(format!("xattr name {} has no name after its prefix", shown())))
        }
        INDEX_USER | INDEX_TRUSTED | INDEX_SECURITY => Ok((index, suffix)),
        INDEX_POSIX_ACL_ACCESS | INDEX_POSIX_ACL_DEFAULT if suffix.is_empty() => Ok((index, suffix)),
        _ => Err(Error::unsupported(format!("xattr {}: no handler for it (the kernel's EOPNOTSUPP)", shown()))),
    }
}

/// setxattr flags, as in <sys/xattr.h>.
pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;

/// The largest value setxattr(2) takes (linux/limits.h).
pub const XATTR_SIZE_MAX: usize = 65536;

/// One attribute as laid out on disk: name index, name suffix, stored value.
#[derive(Clone)]
struct DiskAttr {
    index: u8,
    suffix: Vec<u8>,
    value: Vec<u8>,
}

impl DiskAttr {
    fn space(&self) -> usize {
        xattr::entry_len(self.suffix.len()) + xattr::value_len(self.value.len())
    }
}

/// Lays out entries from `entries_off` and values packed down from `end`; value
/// offsets count from `value_base`. Returns the entry hashes.
fn lay_out(area: &mut [u8], attrs: &[DiskAttr], entries_off: usize, value_base: usize, end: usize) -> Vec<u32> {
    use crate::format::bytes::{put_le16, put_le32};
    let mut e = entries_off;
    let mut v = end;
    let mut hashes = Vec::new();
    for a in attrs {
        v -= xattr::value_len(a.value.len());
        area[v..v + a.value.len()].copy_from_slice(&a.value);
        // system.data's e_hash is 0, as the kernel leaves it (inline/mod.rs).
        let hash =
            if a.index == INDEX_SYSTEM && a.suffix == b"data" { 0 } else { xattr::entry_hash(&a.suffix, &a.value) };
        area[e] = a.suffix.len() as u8;
        area[e + 1] = a.index;
        put_le16(area, e + 2, if a.value.is_empty() { 0 } else { (v - value_base) as u16 });
        put_le32(area, e + 4, 0);
        put_le32(area, e + 8, a.value.len() as u32);
        put_le32(area, e + 12, hash);
        area[e + 16..e + 16 + a.suffix.len()].copy_from_slice(&a.suffix);
        e += xattr::entry_len(a.suffix.len());
        hashes.push(hash);
    }
    hashes
}

/// An in-inode xattr area of `area_len` bytes holding `attrs` (index, name suffix,
/// value), which the caller has checked fit; empty when there are none.
pub(crate) fn ibody_area(area_len: usize, attrs: &[(u8, Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut area = vec![0u8; area_len];
    if !attrs.is_empty() {
        area[..4].copy_from_slice(&xattr::EXT4_XATTR_MAGIC.to_le_bytes());
        let attrs: Vec<DiskAttr> = attrs
            .iter()
            .map(|(index, suffix, value)| DiskAttr { index: *index, suffix: suffix.clone(), value: value.clone() })
            .collect();
        lay_out(&mut area, &attrs, 4, 4, area_len);
    }
    area
}

impl Filesystem {
    /// Sets an attribute (`name` as user space spells it), in the inode body when it
    /// fits, else in the xattr block. A block shared with other inodes is copied first.
    ///
    /// # Errors
    /// `Exists` (XATTR_CREATE) or `NotFound` (XATTR_REPLACE) as the flags say; `OutOfRange` for a name
    /// over 255 bytes; `TooBig` for a value over 64 KiB; `Invalid` for unknown flags; `NotPermitted`
    /// for user.* on what is neither file nor directory; `AccessDenied` for a default ACL on a
    /// non-directory; `NoSpace` when it fits neither the inode nor a block; `Unsupported` for an
    /// unknown namespace; `ReadOnly`; `Corrupt`.
    pub fn set_xattr(&self, ino: u32, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        let (index, suffix) = settable_name(name)?;
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Error::Invalid(format!("setxattr flags {flags:#x}")));
        }
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::TooBig(format!("an xattr value of {} bytes (at most {XATTR_SIZE_MAX})", value.len())));
        }
        let inode = self.inode(ino)?;
        crate::ns::inode_flags::refuse_if_pinned(ino, &inode, "setting an xattr")?;
        // The VFS's rules by kind: user.* only on files and directories
        // (xattr_permission), a default ACL only on a directory (set_posix_acl).
        if index == INDEX_USER && !inode.is_reg() && !inode.is_dir() {
            return Err(Error::NotPermitted(format!("user.* xattrs on inode {ino}, neither file nor directory")));
        }
        if index == INDEX_POSIX_ACL_DEFAULT && !inode.is_dir() {
            return Err(Error::AccessDenied(format!("a default ACL on inode {ino}, which is not a directory")));
        }
        if index == INDEX_POSIX_ACL_ACCESS {
            // As the kernel's ext4_set_acl: the ACL sets the mode's rwx bits, and one
            // that says no more than a mode is not stored at all.
            let (bits, equivalent) = acl::implied_mode(value).map_err(Error::Invalid)?;
            let perm = (self.stat(ino)?.perm & !0o777) | bits;
            self.setattr_keeping_acl(ino, &crate::ns::change::SetAttr { perm: Some(perm), ..Default::default() })?;
            if equivalent {
                return match self.remove_xattr(ino, name) {
                    Err(Error::NotFound(_)) => Ok(()),
                    other => other,
                };
            }
        }
        let value = if index == INDEX_POSIX_ACL_ACCESS || index == INDEX_POSIX_ACL_DEFAULT {
            acl::user_to_disk(value).map_err(Error::Invalid)?
        } else {
            value.to_vec()
        };
        self.change_xattrs(ino, &mut |attrs| {
            let at = attrs.iter().position(|a| a.index == index && a.suffix == suffix);
            match (at, flags & XATTR_CREATE != 0, flags & XATTR_REPLACE != 0) {
                (Some(_), true, _) => return Err(Error::Exists(String::from_utf8_lossy(name).into_owned())),
                (None, _, true) => return Err(Error::NotFound(String::from_utf8_lossy(name).into_owned())),
                (Some(i), _, _) => attrs[i].value = value.clone(),
                (None, _, _) => attrs.push(DiskAttr { index, suffix: suffix.to_vec(), value: value.clone() }),
            }
            Ok(())
        })
    }

    /// Rewrites the access ACL of `ino`, if it has one, for the mode `perm`
    /// (`acl::chmod`).
    pub(crate) fn chmod_access_acl(&self, ino: u32, perm: u16) -> Result<()> {
        if self.get_xattr(ino, b"system.posix_acl_access")?.is_none() {
            return Ok(());
        }
        self.change_xattrs(ino, &mut |attrs| {
            for a in attrs.iter_mut().filter(|a| a.index == INDEX_POSIX_ACL_ACCESS && a.suffix.is_empty()) {
                a.value =
                    acl::chmod(&a.value, perm).map_err(|what| Error::corrupt(what, format!("ACL of inode {ino}")))?;
            }
            Ok(())
        })
    }

    /// Removes attribute `name`.
    ///
    /// # Errors
    /// `NotFound` (ENODATA) when the attribute is absent; `ReadOnly`; `Corrupt`.
    pub fn remove_xattr(&self, ino: u32, name: &[u8]) -> Result<()> {
        let (index, suffix) = settable_name(name)?;
        crate::ns::inode_flags::refuse_if_pinned(ino, &*self.inode(ino)?, "removing an xattr")?;
        self.change_xattrs(ino, &mut |attrs| {
            let at = attrs.iter().position(|a| a.index == index && a.suffix == suffix);
            match at {
                Some(i) => {
                    attrs.remove(i);
                    Ok(())
                }
                None => Err(Error::NotFound(String::from_utf8_lossy(name).into_owned())),
            }
        })
    }

    /// Reads every attribute, lets `edit` change the list, and writes it back: the
    /// inode body first (system.data always there), the rest into one block.
    fn change_xattrs(&self, ino: u32, edit: &mut dyn FnMut(&mut Vec<DiskAttr>) -> Result<()>) -> Result<()> {
        let _lock = self.inode_locks.write(ino as u64);
        let mut inode = (*self.inode(ino)?).clone();
        self.require_changeable(ino, &inode)?;
        let mut attrs: Vec<DiskAttr> = Vec::new();
        for (e, v) in xattr::parse_ibody(inode.xattr_area(), ino)? {
            attrs.push(DiskAttr { index: e.e_name_index, suffix: e.name, value: v });
        }
        let body_count = attrs.len();
        let old_block = inode.i_file_acl;
        let mut old_refcount = 0;
        if old_block != 0 {
            let buf = self.xattr_block(ino, old_block)?;
            // It may be freed or rewritten: it must be ours per the bitmap.
            self.alloc.check_blocks_in_use(&[(old_block, 1)], &|| format!("xattr block of inode {ino}"))?;
            let (h, entries) = xattr::parse_block(&buf.read(), old_block)?;
            old_refcount = h.h_refcount;
            for (e, v) in entries {
                attrs.push(DiskAttr { index: e.e_name_index, suffix: e.name, value: v });
            }
        }
        let was_in_block: Vec<(u8, Vec<u8>)> =
            attrs[body_count..].iter().map(|a| (a.index, a.suffix.clone())).collect();
        edit(&mut attrs)?;

        // Placed as the kernel's ext4_xattr_set_handle places them: system.data
        // (inline data) stays in the inode, first; an attribute in the block stays
        // there; one in the body stays while it fits, else moves to the block; a
        // new one goes into the body when it fits, else into the block. (The
        // room left in the body is the inline data's capacity: inline/mod.rs.)
        let is_data = |a: &DiskAttr| a.index == INDEX_SYSTEM && a.suffix == b"data";
        attrs.sort_by_key(|a| !is_data(a));
        let area_len = inode.xattr_area().len();
        let mut body_room = area_len.saturating_sub(8);
        let mut body = Vec::new();
        let mut block = Vec::new();
        for a in attrs {
            let stays_in_block = !is_data(&a) && was_in_block.iter().any(|(i, s)| *i == a.index && *s == a.suffix);
            if !stays_in_block && area_len >= 8 && a.space() <= body_room {
                body_room -= a.space();
                body.push(a);
            } else {
                block.push(a);
            }
        }
        let bs = self.vol.geo.block_size;
        let block_room = bs - xattr::XATTR_BLOCK_HEADER_LEN - 4;
        if block.iter().map(DiskAttr::space).sum::<usize>() > block_room {
            return Err(Error::NoSpace(format!("attributes of inode {ino} do not fit one {bs}-byte block")));
        }
        let needs_block = !block.is_empty();
        let _space = match needs_block && (old_block == 0 || old_refcount > 1) {
            true => Some(self.alloc.ensure_space(1)?),
            false => None,
        };
        let mut tx = self.begin(4)?;
        // As the kernel's ext4_xattr_update_super_block: the first attribute
        // on a filesystem without ext_attr turns the feature on, or e2fsck
        // would take the xattr block for damage (and free it).
        if needs_block || !body.is_empty() {
            let mut sb = self.vol.sb.write();
            if sb.s_feature_compat & crate::format::superblock::COMPAT_EXT_ATTR == 0 {
                sb.s_feature_compat |= crate::format::superblock::COMPAT_EXT_ATTR;
                self.stage_superblock(&mut tx, &sb)?;
            }
        }

        let body: Vec<(u8, Vec<u8>, Vec<u8>)> = body.into_iter().map(|a| (a.index, a.suffix, a.value)).collect();
        inode.set_xattr_area(&ibody_area(area_len, &body));

        let sectors = bs as u64 / 512;
        // Let go of the old block: freed if it was ours alone, else one reference less.
        let mut reuse = None;
        if old_block != 0 {
            if old_refcount <= 1 {
                if needs_block {
                    reuse = Some(old_block);
                } else {
                    self.alloc.free_blocks_range(&mut tx, old_block, 1)?;
                    inode.i_blocks = inode.i_blocks.saturating_sub(sectors);
                }
            } else {
                let buf = self.vol.cache.get(old_block)?;
                {
                    let mut data = buf.write();
                    crate::format::bytes::put_le32(&mut data, 4, old_refcount - 1);
                    if self.vol.geo.metadata_csum {
                        xattr::set_block_checksum(&mut data, old_block, self.vol.geo.csum_seed);
                    }
                }
                tx.dirty(&buf);
                inode.i_blocks = inode.i_blocks.saturating_sub(sectors);
            }
            inode.i_file_acl = 0;
        }
        if needs_block {
            let blk = match reuse {
                Some(b) => b,
                None => {
                    let (b, _) = self.alloc.alloc_blocks(&mut tx, self.inode_goal(ino, inode.is_reg()), 1)?;
                    inode.i_blocks += sectors;
                    b
                }
            };
            // The kernel looks entries up in a block by sorted order.
            block.sort_by(|a, b| (a.index, a.suffix.len(), &a.suffix).cmp(&(b.index, b.suffix.len(), &b.suffix)));
            self.vol.cache.classify(blk, crate::dev::IoClass::Other);
            let buf = self.vol.cache.get_new(blk);
            {
                let mut data = buf.write();
                let hashes = lay_out(&mut data, &block, xattr::XATTR_BLOCK_HEADER_LEN, 0, bs);
                xattr::XattrBlockHeader {
                    h_magic: xattr::EXT4_XATTR_MAGIC,
                    h_refcount: 1,
                    h_blocks: 1,
                    h_hash: xattr::block_hash(&hashes),
                    h_checksum: 0,
                }
                .write(&mut data);
                if self.vol.geo.metadata_csum {
                    xattr::set_block_checksum(&mut data, blk, self.vol.geo.csum_seed);
                }
            }
            tx.dirty(&buf);
            inode.i_file_acl = blk;
        }
        inode.i_ctime = crate::ns::change::now();
        self.write_inode(&mut tx, ino, &inode)?;
        tx.finish()
    }
}

impl Filesystem {
    /// Lets go of an inode's xattr block: freed if only this inode used it, else one
    /// reference fewer.
    pub(crate) fn release_xattr_block(
        &self,
        tx: &mut crate::journal::handle::Handle,
        ino: u32,
        inode: &mut crate::format::inode::Inode,
    ) -> Result<()> {
        let blk = inode.i_file_acl;
        if blk == 0 {
            return Ok(());
        }
        let buf = self.xattr_block(ino, blk)?;
        let refcount = xattr::parse_block(&buf.read(), blk)?.0.h_refcount;
        if refcount <= 1 {
            drop(buf);
            self.alloc.free_blocks_range(tx, blk, 1)?;
        } else {
            {
                let mut data = buf.write();
                crate::format::bytes::put_le32(&mut data, 4, refcount - 1);
                if self.vol.geo.metadata_csum {
                    xattr::set_block_checksum(&mut data, blk, self.vol.geo.csum_seed);
                }
            }
            tx.dirty(&buf);
        }
        inode.i_file_acl = 0;
        inode.i_blocks = inode.i_blocks.saturating_sub(self.vol.geo.block_size as u64 / 512);
        Ok(())
    }
}
