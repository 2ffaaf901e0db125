//! Changing what the kernel stored inline (-O inline_data): entries added to and
//! removed from inline directories, renames between them, writes that grow an
//! inline file past the inode, truncates. uext4 moves such an inode into a block
//! first, as the kernel does when inline space runs out. Judged by e2fsck and the
//! kernel's view.

mod oracle;

use uext4::format::inode::EXT4_INLINE_DATA_FL;
use uext4::{Filesystem, Options, Owner, SetAttr, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

#[test]
fn changes_to_inline_files_and_directories() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    oracle::run(std::process::Command::new("mkfs.ext4").args(["-q", "-F", "-O", "inline_data"]).arg(&image).arg("64M"));
    {
        let m = oracle::Mount::new(&image, "");
        for d in ["d1", "d2", "d3"] {
            std::fs::create_dir(m.dir.join(d)).unwrap();
            std::fs::write(m.dir.join(d).join("small"), format!("in {d}")).unwrap();
        }
        std::fs::write(m.dir.join("tiny"), b"tiny file").unwrap();
        std::fs::write(m.dir.join("cut"), vec![b'c'; 100]).unwrap();
    }
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let inline = |p: &[u8]| fs.stat(fs.lookup_path(p).unwrap()).unwrap().flags & EXT4_INLINE_DATA_FL != 0;
        assert!(inline(b"/d1") && inline(b"/tiny"), "the kernel did not store these inline");
        let d1 = fs.lookup_path(b"/d1").unwrap();
        let d2 = fs.lookup_path(b"/d2").unwrap();
        let d3 = fs.lookup_path(b"/d3").unwrap();
        let new = fs.create(d1, b"added", 0o644, ROOT).unwrap().ino;
        fs.write(new, 0, b"added by uext4").unwrap();
        fs.unlink(d2, b"small").unwrap();
        fs.rename(d3, b"small", d2, b"moved", 0).unwrap();
        fs.rename(ROOT_INO, b"d3", d1, b"d3-inside", 0).unwrap();
        let tiny = fs.lookup_path(b"/tiny").unwrap();
        fs.write(tiny, 9, &vec![b'+'; 10_000]).unwrap();
        let cut = fs.lookup_path(b"/cut").unwrap();
        fs.setattr(cut, &SetAttr { size: Some(10), ..Default::default() }).unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    let p = |s: &str| m.dir.join(s);
    let names = |s: &str| {
        let mut v: Vec<String> =
            std::fs::read_dir(p(s)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    };
    assert_eq!(names("d1"), ["added", "d3-inside", "small"]);
    assert_eq!(names("d2"), ["moved"]);
    assert_eq!(std::fs::read_to_string(p("d1/added")).unwrap(), "added by uext4");
    assert_eq!(std::fs::read_to_string(p("d2/moved")).unwrap(), "in d3");
    assert!(names("d1/d3-inside").is_empty());
    let tiny = std::fs::read(p("tiny")).unwrap();
    assert_eq!(&tiny[..9], b"tiny file");
    assert!(tiny.len() == 10_009 && tiny[9..].iter().all(|&b| b == b'+'));
    assert_eq!(std::fs::read(p("cut")).unwrap(), vec![b'c'; 10]);
}
