//! Extended attributes written by uext4, judged by e2fsck and the kernel's
//! listxattr/getxattr: small values in the inode body, large ones in a block,
//! replace and remove, XATTR_CREATE/XATTR_REPLACE, POSIX ACLs, 128-byte inodes,
//! and a block the kernel shares between two inodes (refcount 2), which must be
//! copied before it changes and released correctly on unlink.

mod oracle;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use uext4::xattr::{XATTR_CREATE, XATTR_REPLACE};
use uext4::{Error, Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };
type Attrs = BTreeMap<Vec<u8>, Vec<u8>>;

fn kernel_xattrs(p: &Path) -> Attrs {
    oracle::host_xattrs(p).into_iter().collect()
}

fn acl() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in
        [(1u16, 7u16, u32::MAX), (2, 5, 1234), (4, 5, u32::MAX), (0x10, 7, u32::MAX), (0x20, 4, u32::MAX)]
    {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn exercise(image: &Path) -> Attrs {
    let fs = Filesystem::open(image, Options { read_only: false, ..Options::default() }).unwrap();
    let ino = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
    let mut want = Attrs::new();
    let mut set = |name: &str, value: Vec<u8>, flags: u32| {
        fs.set_xattr(ino, name.as_bytes(), &value, flags).unwrap();
        want.insert(name.as_bytes().to_vec(), value);
    };
    set("user.small", b"1".to_vec(), 0);
    set("user.empty", Vec::new(), 0);
    set("trusted.t", b"trusted".to_vec(), 0);
    set("security.selinux", b"system_u:object_r:tmp_t:s0".to_vec(), 0);
    set("user.big", vec![b'B'; 500], 0);
    set("user.big2", vec![b'C'; 150], 0);
    set("system.posix_acl_access", acl(), 0);
    set("user.small", b"replaced".to_vec(), XATTR_REPLACE);
    fs.remove_xattr(ino, b"user.big2").unwrap();
    want.remove(&b"user.big2"[..]);
    assert!(matches!(fs.set_xattr(ino, b"user.small", b"x", XATTR_CREATE), Err(Error::Exists(_))));
    assert!(matches!(fs.set_xattr(ino, b"user.nope", b"x", XATTR_REPLACE), Err(Error::NotFound(_))));
    assert!(matches!(fs.remove_xattr(ino, b"user.nope"), Err(Error::NotFound(_))));
    // Too large for any block (no ea_inode): refused, nothing changed.
    assert!(matches!(fs.set_xattr(ino, b"user.huge", &[1u8; 5000], 0), Err(Error::NoSpace(_))));
    let mut ours: Attrs = fs.xattrs(ino).unwrap().into_iter().collect();
    ours.remove(&b"system.data"[..]);
    assert_eq!(ours, want, "uext4's own view");
    // A file whose attributes are set and then all removed, and one that is unlinked.
    let g = fs.create(ROOT_INO, b"g", 0o644, ROOT).unwrap().ino;
    fs.set_xattr(g, b"user.big", &[7u8; 900], 0).unwrap();
    fs.remove_xattr(g, b"user.big").unwrap();
    let h = fs.create(ROOT_INO, b"h", 0o644, ROOT).unwrap().ino;
    fs.set_xattr(h, b"user.big", &[8u8; 900], 0).unwrap();
    fs.unlink(ROOT_INO, b"h").unwrap();
    want
}

fn check(image: &Path, want: &Attrs) {
    oracle::assert_e2fsck_clean(image);
    let m = oracle::Mount::new(image, "ro");
    assert_eq!(&kernel_xattrs(&m.dir.join("f")), want);
    assert!(kernel_xattrs(&m.dir.join("g")).is_empty());
}

#[test]
fn xattrs_in_body_and_block() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    for args in [&["-I", "256"][..], &["-I", "128"][..], &["-b", "4096", "-O", "^metadata_csum"][..]] {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        oracle::run(Command::new("mkfs.ext4").args(["-q", "-F"]).args(args).arg(&image).arg("64M"));
        let want = exercise(&image);
        check(&image, &want);
    }
}

#[test]
fn a_block_shared_by_the_kernel_is_copied_before_it_changes() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F", "-I", "128"]).arg(&image).arg("64M"));
    {
        let m = oracle::Mount::new(&image, "");
        for f in ["a", "b", "c"] {
            std::fs::write(m.dir.join(f), f).unwrap();
            oracle::run(
                Command::new("setfattr").args(["-n", "user.shared", "-v"]).arg("s".repeat(500)).arg(m.dir.join(f)),
            );
        }
    }
    let acl_block = |name: &str| {
        let out = oracle::run(Command::new("debugfs").arg("-R").arg(format!("stat /{name}")).arg(&image));
        out.lines().find_map(|l| l.trim().strip_prefix("File ACL:").map(|v| v.trim().to_string())).unwrap()
    };
    assert_eq!(acl_block("a"), acl_block("b"), "the kernel did not share the xattr block");
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let a = fs.lookup_path(b"/a").unwrap();
        fs.set_xattr(a, b"user.own", b"mine", 0).unwrap();
        fs.unlink(ROOT_INO, b"b").unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    assert_ne!(acl_block("a"), acl_block("c"));
    let m = oracle::Mount::new(&image, "ro");
    let a = kernel_xattrs(&m.dir.join("a"));
    assert_eq!(a.get(&b"user.own"[..]).map(|v| v.as_slice()), Some(&b"mine"[..]));
    assert_eq!(a.get(&b"user.shared"[..]).map(|v| v.len()), Some(500));
    assert_eq!(kernel_xattrs(&m.dir.join("c")).get(&b"user.shared"[..]).map(|v| v.len()), Some(500));
}

/// The first attribute on a filesystem made without ext_attr turns the
/// feature on (as the kernel's ext4_xattr_update_super_block does): e2fsck
/// otherwise takes the xattr block for damage (it said "i_file_acl ... should
/// be zero" and freed it). dumpe2fs lists the feature, e2fsck -fn is silent and
/// the kernel reads the attribute.
#[test]
fn the_first_xattr_turns_ext_attr_on() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    oracle::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-t", "ext2", "-I", "128", "-O", "^ext_attr"])
            .arg(&image)
            .arg("8M"),
    );
    let features = oracle::dumpe2fs_field(&image, "Filesystem features").unwrap();
    assert!(!features.contains("ext_attr"), "{features}");
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let ino = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
        fs.set_xattr(ino, b"user.t", b"hello", 0).unwrap();
    }
    let features = oracle::dumpe2fs_field(&image, "Filesystem features").unwrap();
    assert!(features.contains("ext_attr"), "{features}");
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    assert_eq!(kernel_xattrs(&m.dir.join("f")).get(&b"user.t"[..]).map(Vec::as_slice), Some(&b"hello"[..]));
}
