//! Several threads changing one Filesystem at once: each in its own directory,
//! and all in one shared directory (which grows into an htree meanwhile). Nothing
//! may deadlock or be lost: e2fsck -fn stays silent and the kernel sees exactly the
//! files each thread left, with their contents.

mod oracle;

use std::collections::BTreeMap;
use std::sync::Arc;
use uext4::{Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };
const THREADS: usize = 4;
const FILES: usize = 1500;

fn body(t: usize, i: usize) -> Vec<u8> {
    format!("thread {t} file {i} ").repeat(1 + i % 300).into_bytes()
}

#[test]
fn threads_create_write_and_remove_at_once() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 256 << 20, ..Default::default() }).unwrap();
    let fs = Arc::new(Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap());
    let shared = fs.mkdir(ROOT_INO, b"shared", 0o755, ROOT).unwrap().ino;
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let own = fs.mkdir(ROOT_INO, format!("own-{t}").as_bytes(), 0o755, ROOT).unwrap().ino;
                let mut kept = BTreeMap::new();
                for i in 0..FILES {
                    for (dir, prefix) in [(own, format!("own-{t}")), (shared, "shared".to_string())] {
                        let name = format!("t{t}-file-{i:05}");
                        let ino = fs.create(dir, name.as_bytes(), 0o644, ROOT).unwrap().ino;
                        fs.write(ino, 0, &body(t, i)).unwrap();
                        // Remove every fourth again, while others are still creating.
                        if i % 4 == 3 {
                            fs.unlink(dir, name.as_bytes()).unwrap();
                        } else {
                            kept.insert(format!("{prefix}/{name}"), body(t, i));
                        }
                    }
                }
                kept
            })
        })
        .collect();
    let mut expect = BTreeMap::new();
    for h in handles {
        expect.extend(h.join().expect("a writer thread panicked"));
    }
    fs.sync().unwrap();
    drop(fs);
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    let mut seen = 0;
    for d in std::fs::read_dir(&m.dir).unwrap() {
        let d = d.unwrap();
        let name = d.file_name().into_string().unwrap();
        if name == "lost+found" {
            continue;
        }
        for f in std::fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            let key = format!("{name}/{}", f.file_name().into_string().unwrap());
            let want = expect.get(&key).unwrap_or_else(|| panic!("unexpected {key}"));
            assert_eq!(&std::fs::read(f.path()).unwrap(), want, "{key}");
            seen += 1;
        }
    }
    assert_eq!(seen, expect.len());
}
