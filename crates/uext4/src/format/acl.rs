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
}
