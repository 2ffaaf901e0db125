//! POSIX ACLs in ext4's on-disk form and in the form the xattr interface uses.
//!
//! On disk: a 4-byte version (1), then entries of (tag u16, perm u16) with a u32 id
//! only for named users and groups. User space (`system.posix_acl_*`): version 2,
//! then every entry 8 bytes with id 0xFFFFFFFF where none applies.

use super::bytes::*;

pub const EXT4_ACL_VERSION: u32 = 1;
pub const POSIX_ACL_XATTR_VERSION: u32 = 2;
pub const ACL_USER_OBJ: u16 = 0x01;
pub const ACL_USER: u16 = 0x02;
pub const ACL_GROUP_OBJ: u16 = 0x04;
pub const ACL_GROUP: u16 = 0x08;
pub const ACL_MASK: u16 = 0x10;
pub const ACL_OTHER: u16 = 0x20;
const ACL_UNDEFINED_ID: u32 = u32::MAX;

pub fn disk_to_user(disk: &[u8]) -> Result<Vec<u8>, String> {
    if disk.len() < 4 || le32(disk, 0) != EXT4_ACL_VERSION {
        return Err("ACL has a bad header".into());
    }
    let mut out = Vec::with_capacity(disk.len() * 2);
    out.extend_from_slice(&POSIX_ACL_XATTR_VERSION.to_le_bytes());
    let mut off = 4;
    while off < disk.len() {
        if off + 4 > disk.len() {
            return Err("ACL entry is truncated".into());
        }
        let tag = le16(disk, off);
        let perm = le16(disk, off + 2);
        let id = match tag {
            ACL_USER | ACL_GROUP => {
                if off + 8 > disk.len() {
                    return Err("ACL entry is truncated".into());
                }
                let id = le32(disk, off + 4);
                off += 8;
                id
            }
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => {
                off += 4;
                ACL_UNDEFINED_ID
            }
            _ => return Err(format!("ACL entry has unknown tag {tag:#x}")),
        };
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    Ok(out)
}

pub fn user_to_disk(user: &[u8]) -> Result<Vec<u8>, String> {
    if user.len() < 4 || le32(user, 0) != POSIX_ACL_XATTR_VERSION || !(user.len() - 4).is_multiple_of(8) {
        return Err("ACL value is not in the POSIX xattr format".into());
    }
    let mut out = EXT4_ACL_VERSION.to_le_bytes().to_vec();
    for e in user[4..].chunks_exact(8) {
        let tag = le16(e, 0);
        out.extend_from_slice(&e[..4]);
        match tag {
            ACL_USER | ACL_GROUP => out.extend_from_slice(&e[4..8]),
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => {}
            _ => return Err(format!("ACL entry has unknown tag {tag:#x}")),
        }
    }
    Ok(out)
}

/// The permission bits an access ACL (user-space form) implies, as the kernel's
/// posix_acl_update_mode computes them: owner from USER_OBJ, group from MASK
/// (or GROUP_OBJ without one), others from OTHER; and whether the ACL says no
/// more than those bits (then the kernel stores no ACL at all).
pub fn implied_mode(user: &[u8]) -> Result<(u16, bool), String> {
    if user.len() < 4 || le32(user, 0) != POSIX_ACL_XATTR_VERSION || !(user.len() - 4).is_multiple_of(8) {
        return Err("ACL value is not in the POSIX xattr format".into());
    }
    let (mut owner, mut group, mut mask, mut other) = (None, None, None, None);
    let mut extended = false;
    for e in user[4..].chunks_exact(8) {
        let perm = le16(e, 2) & 7;
        match le16(e, 0) {
            ACL_USER_OBJ => owner = Some(perm),
            ACL_GROUP_OBJ => group = Some(perm),
            ACL_MASK => mask = Some(perm),
            ACL_OTHER => other = Some(perm),
            ACL_USER | ACL_GROUP => extended = true,
            tag => return Err(format!("ACL entry has unknown tag {tag:#x}")),
        }
    }
    let (Some(owner), Some(group), Some(other)) = (owner, group, other) else {
        return Err("ACL lacks an owner, group or other entry".into());
    };
    let equivalent = !extended && mask.is_none();
    Ok((owner << 6 | mask.unwrap_or(group) << 3 | other, equivalent))
}

/// What a new inode inherits from its directory's default ACL (user-space
/// form), created with the permission bits `mode` (no umask: a default ACL
/// replaces it), as the kernel's posix_acl_create computes it: the owner,
/// other, and mask (or, with no mask, group) entries keep only the bits `mode`
/// grants, and `mode` keeps only the bits they grant. Returns the access ACL,
/// the new permission bits (with `mode`'s setuid, setgid and sticky bits), and
/// whether the ACL says more than the bits (named entries or a mask) and so
/// must be stored.
pub fn inherit(default: &[u8], mode: u16) -> Result<(Vec<u8>, u16, bool), String> {
    if default.len() < 4 || le32(default, 0) != POSIX_ACL_XATTR_VERSION || !(default.len() - 4).is_multiple_of(8) {
        return Err("ACL value is not in the POSIX xattr format".into());
    }
    let mut acl = default.to_vec();
    let (mut owner, mut group, mut other) = (mode >> 6 & 7, mode >> 3 & 7, mode & 7);
    let mut extended = false;
    let (mut mask_at, mut group_at) = (None, None);
    for at in (4..acl.len()).step_by(8) {
        let perm = le16(&acl, at + 2);
        let kept = match le16(&acl, at) {
            ACL_USER_OBJ => {
                owner &= perm;
                perm & (owner | !7)
            }
            ACL_OTHER => {
                other &= perm;
                perm & (other | !7)
            }
            ACL_USER | ACL_GROUP => {
                extended = true;
                perm
            }
            ACL_MASK => {
                extended = true;
                mask_at = Some(at);
                perm
            }
            ACL_GROUP_OBJ => {
                group_at = Some(at);
                perm
            }
            tag => return Err(format!("ACL entry has unknown tag {tag:#x}")),
        };
        acl[at + 2..at + 4].copy_from_slice(&kept.to_le_bytes());
    }
    // The group class is the mask's when there is one, else the group entry's.
    let Some(class_at) = mask_at.or(group_at) else {
        return Err("ACL lacks a group entry".into());
    };
    let perm = le16(&acl, class_at + 2);
    group &= perm;
    acl[class_at + 2..class_at + 4].copy_from_slice(&(perm & (group | !7)).to_le_bytes());
    Ok((acl, mode & 0o7000 | owner << 6 | group << 3 | other, extended))
}

/// An access ACL (on-disk form) after a chmod to `mode`, as the kernel's
/// posix_acl_chmod rewrites it: the owner entry takes the owner bits, the mask
/// (or the group entry when there is no mask) the group bits, the other entry
/// the other bits; named users and groups keep theirs, so the mask limits them.
pub fn chmod(disk: &[u8], mode: u16) -> Result<Vec<u8>, String> {
    if disk.len() < 4 || le32(disk, 0) != EXT4_ACL_VERSION {
        return Err("ACL has a bad header".into());
    }
    let mut out = disk.to_vec();
    let has_mask = entries(disk)?.iter().any(|&(tag, _)| tag == ACL_MASK);
    for (tag, at) in entries(disk)? {
        let bits = match tag {
            ACL_USER_OBJ => mode >> 6 & 7,
            ACL_MASK => mode >> 3 & 7,
            ACL_GROUP_OBJ if !has_mask => mode >> 3 & 7,
            ACL_OTHER => mode & 7,
            _ => continue,
        };
        let perm = le16(disk, at + 2) & !7 | bits;
        out[at + 2..at + 4].copy_from_slice(&perm.to_le_bytes());
    }
    Ok(out)
}

/// (tag, byte offset) of each entry of an on-disk ACL.
fn entries(disk: &[u8]) -> Result<Vec<(u16, usize)>, String> {
    let mut found = Vec::new();
    let mut off = 4;
    while off < disk.len() {
        if off + 4 > disk.len() {
            return Err("ACL entry is truncated".into());
        }
        let tag = le16(disk, off);
        found.push((tag, off));
        off += match tag {
            ACL_USER | ACL_GROUP => 8,
            ACL_USER_OBJ | ACL_GROUP_OBJ | ACL_MASK | ACL_OTHER => 4,
            _ => return Err(format!("ACL entry has unknown tag {tag:#x}")),
        };
        if off > disk.len() {
            return Err("ACL entry is truncated".into());
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16)]) -> Vec<u8> {
        let mut v = POSIX_ACL_XATTR_VERSION.to_le_bytes().to_vec();
        for &(tag, perm) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&u32::MAX.to_le_bytes());
        }
        v
    }

    #[test]
    fn implied_mode_follows_the_mask() {
        assert_eq!(implied_mode(&acl(&[(ACL_USER_OBJ, 7), (ACL_GROUP_OBJ, 5), (ACL_OTHER, 5)])), Ok((0o755, true)));
        let masked = acl(&[(ACL_USER_OBJ, 6), (ACL_GROUP_OBJ, 7), (ACL_MASK, 4), (ACL_OTHER, 0)]);
        assert_eq!(implied_mode(&masked), Ok((0o640, false)));
        assert!(implied_mode(&acl(&[(ACL_USER_OBJ, 7)])).is_err());
    }

    #[test]
    fn chmod_rewrites_owner_mask_and_other_and_keeps_named_entries() {
        // u::rw-, u:1000:rw-, g::r--, m::rw-, o::r--; chmod 640.
        let user = [
            POSIX_ACL_XATTR_VERSION.to_le_bytes().to_vec(),
            [ACL_USER_OBJ.to_le_bytes(), 6u16.to_le_bytes()].concat(),
            u32::MAX.to_le_bytes().to_vec(),
            [ACL_USER.to_le_bytes(), 6u16.to_le_bytes()].concat(),
            1000u32.to_le_bytes().to_vec(),
            [ACL_GROUP_OBJ.to_le_bytes(), 4u16.to_le_bytes()].concat(),
            u32::MAX.to_le_bytes().to_vec(),
            [ACL_MASK.to_le_bytes(), 6u16.to_le_bytes()].concat(),
            u32::MAX.to_le_bytes().to_vec(),
            [ACL_OTHER.to_le_bytes(), 4u16.to_le_bytes()].concat(),
            u32::MAX.to_le_bytes().to_vec(),
        ]
        .concat();
        let disk = user_to_disk(&user).unwrap();
        let changed = disk_to_user(&chmod(&disk, 0o640).unwrap()).unwrap();
        let perms: Vec<(u16, u16)> = changed[4..].chunks_exact(8).map(|e| (le16(e, 0), le16(e, 2))).collect();
        assert_eq!(perms, [(ACL_USER_OBJ, 6), (ACL_USER, 6), (ACL_GROUP_OBJ, 4), (ACL_MASK, 4), (ACL_OTHER, 0)]);
        // Without a mask the group entry takes the group bits.
        let plain = user_to_disk(&acl(&[(ACL_USER_OBJ, 7), (ACL_GROUP_OBJ, 7), (ACL_OTHER, 7)])).unwrap();
        let changed = disk_to_user(&chmod(&plain, 0o751).unwrap()).unwrap();
        assert_eq!(implied_mode(&changed), Ok((0o751, true)));
        assert!(chmod(&[1, 0, 0, 0, 1, 0], 0o644).is_err(), "a truncated entry is refused");
    }

    #[test]
    fn inherit_masks_the_default_acl_with_the_mode_and_the_mode_with_it() {
        // d:u::rwx, d:u:1000:r-x, d:g::r-x, d:m::rwx, d:o::---; mkdir 0777 and creat 0666.
        let mut default = acl(&[(ACL_USER_OBJ, 7), (ACL_GROUP_OBJ, 5), (ACL_MASK, 7), (ACL_OTHER, 0)]);
        default.extend_from_slice(&[ACL_USER.to_le_bytes(), 5u16.to_le_bytes()].concat());
        default.extend_from_slice(&1000u32.to_le_bytes());
        let (access, mode, extended) = inherit(&default, 0o777).unwrap();
        assert_eq!((mode, extended), (0o770, true));
        assert_eq!(implied_mode(&access), Ok((0o770, false)));
        let (access, mode, _) = inherit(&default, 0o666).unwrap();
        assert_eq!(mode, 0o660, "the mask keeps only rw- of the mode's group bits");
        assert_eq!(implied_mode(&access), Ok((0o660, false)));
        // Without named entries or a mask it is the mode alone.
        let plain = acl(&[(ACL_USER_OBJ, 7), (ACL_GROUP_OBJ, 5), (ACL_OTHER, 5)]);
        assert_eq!(inherit(&plain, 0o2777).map(|(_, m, e)| (m, e)), Ok((0o2755, false)));
        assert!(inherit(&acl(&[(ACL_USER_OBJ, 7), (ACL_OTHER, 5)]), 0o777).is_err());
    }
}
