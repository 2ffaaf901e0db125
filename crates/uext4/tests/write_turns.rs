//! Taking turns with the kernel: the kernel writes, uext4 changes what it wrote,
//! the kernel changes what uext4 wrote, and uext4 reads the result; e2fsck -fn is
//! silent between every turn and each side sees exactly what the other left.

mod oracle;

use std::path::Path;
use uext4::{Filesystem, Options, Owner, SetAttr, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn turns(mkfs_args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::run(std::process::Command::new("mkfs.ext4").args(["-q", "-F"]).args(mkfs_args).arg(&image).arg("128M"));

    // Turn 1: the kernel makes a tree, with a big (indexed) directory.
    {
        let m = oracle::Mount::new(&image, "");
        std::fs::create_dir_all(m.dir.join("k/big")).unwrap();
        for i in 0..3000 {
            std::fs::write(m.dir.join(format!("k/big/kernel-{i:05}")), format!("k{i}")).unwrap();
        }
        std::fs::write(m.dir.join("k/file"), vec![5u8; 200_000]).unwrap();
        std::os::unix::fs::symlink("file", m.dir.join("k/link")).unwrap();
    }
    oracle::assert_e2fsck_clean(&image);

    // Turn 2: uext4 changes the kernel's tree.
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let big = fs.lookup_path(b"/k/big").unwrap();
        for i in (0..3000).step_by(2) {
            fs.unlink(big, format!("kernel-{i:05}").as_bytes()).unwrap();
        }
        for i in 0..1000 {
            let ino = fs.create(big, format!("uext4-{i:05}").as_bytes(), 0o640, ROOT).unwrap().ino;
            fs.write(ino, 0, format!("u{i}").as_bytes()).unwrap();
        }
        let file = fs.lookup_path(b"/k/file").unwrap();
        fs.write(file, 150_000, &[6u8; 100_000]).unwrap();
        fs.setattr(file, &SetAttr { perm: Some(0o600), ..Default::default() }).unwrap();
        let k = fs.lookup_path(b"/k").unwrap();
        fs.rename(k, b"link", ROOT_INO, b"moved-link", 0).unwrap();
        let u = fs.mkdir(ROOT_INO, b"u", 0o755, ROOT).unwrap().ino;
        fs.set_xattr(u, b"user.by", b"uext4", 0).unwrap();
    }
    oracle::assert_e2fsck_clean(&image);

    // Turn 3: the kernel checks uext4's changes and changes them in turn.
    {
        let m = oracle::Mount::new(&image, "");
        let p = |s: &str| m.dir.join(s);
        let names: Vec<String> =
            std::fs::read_dir(p("k/big")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 1500 + 1000);
        assert_eq!(std::fs::read_to_string(p("k/big/uext4-00777")).unwrap(), "u777");
        assert!(!p("k/big/kernel-00010").exists() && p("k/big/kernel-00011").exists());
        let file = std::fs::read(p("k/file")).unwrap();
        assert_eq!(file.len(), 250_000);
        assert!(file[..150_000].iter().all(|&b| b == 5) && file[150_000..].iter().all(|&b| b == 6));
        assert_eq!(std::fs::read_link(p("moved-link")).unwrap(), Path::new("file"));
        for i in 0..500 {
            std::fs::remove_file(p(&format!("k/big/uext4-{i:05}"))).unwrap();
            std::fs::write(p(&format!("u/kernel-in-u-{i}")), b"from the kernel").unwrap();
        }
        std::fs::rename(p("u"), p("k/u")).unwrap();
    }
    oracle::assert_e2fsck_clean(&image);

    // Turn 4: uext4 reads what the kernel did.
    let fs = Filesystem::open(&image, Options::default()).unwrap();
    let big = fs.lookup_path(b"/k/big").unwrap();
    assert_eq!(fs.read_dir(big).unwrap().len(), 2 + 1500 + 500);
    assert!(fs.lookup(big, b"uext4-00100").unwrap().is_none());
    assert!(fs.lookup(big, b"uext4-00900").unwrap().is_some());
    let u = fs.lookup_path(b"/k/u").unwrap();
    assert_eq!(fs.read_dir(u).unwrap().len(), 2 + 500);
    assert_eq!(fs.get_xattr(u, b"user.by").unwrap().as_deref(), Some(&b"uext4"[..]));
    assert_eq!(fs.lookup(u, b"..").unwrap(), Some(fs.lookup_path(b"/k").unwrap()));
}

#[test]
fn taking_turns_with_the_kernel() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    turns(&[]);
    turns(&["-b", "4096"]);
    turns(&["-O", "^metadata_csum"]);
}
