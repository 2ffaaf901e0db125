//! A full disk: writing until ENOSPC in three shapes (one big file, many small
//! files, many directories). ENOSPC must come cleanly (a short write or NoSpace),
//! e2fsck -fn must stay silent, the kernel must read back everything written
//! before, and space freed afterwards must be usable again.

mod oracle;

use std::collections::BTreeMap;
use uext4::{Error, Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

fn image(dir: &std::path::Path, mb: u64) -> std::path::PathBuf {
    let image = dir.join("fs.img");
    uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: mb << 20, ..Default::default() }).unwrap();
    image
}

fn body(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 3 + i * 11) as u8).collect()
}

fn check_through_kernel(image: &std::path::Path, files: &BTreeMap<String, Vec<u8>>, dirs: &[String]) {
    oracle::assert_e2fsck_clean(image);
    let m = oracle::Mount::new(image, "ro");
    for (path, data) in files {
        let got = std::fs::read(m.dir.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(&got == data, "{path}: {} bytes read, {} written", got.len(), data.len());
    }
    for d in dirs {
        assert!(m.dir.join(d).is_dir(), "{d} missing");
    }
}

#[test]
fn one_big_file() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path(), 32);
    let mut files = BTreeMap::new();
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let ino = fs.create(ROOT_INO, b"big", 0o644, ROOT).unwrap().ino;
        let chunk = body(1, 1 << 20);
        let mut data = Vec::new();
        loop {
            match fs.write(ino, data.len() as u64, &chunk) {
                Ok(n) if n == chunk.len() => data.extend_from_slice(&chunk),
                Ok(n) => {
                    data.extend_from_slice(&chunk[..n]);
                    break;
                }
                Err(Error::NoSpace(_)) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(matches!(fs.write(ino, data.len() as u64, b"more"), Err(Error::NoSpace(_))));
        assert!(data.len() > 20 << 20, "only {} bytes fit", data.len());
        let st = fs.statfs();
        // Writes stop when less than one data block's worst case (8 blocks) is left.
        assert!(st.available_blocks < 8, "a full disk still reports room: {st:?}");
        files.insert("big".to_string(), data);
    }
    check_through_kernel(&image, &files, &[]);
    // Freeing space makes room again.
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        fs.unlink(ROOT_INO, b"big").unwrap();
        let ino = fs.create(ROOT_INO, b"after", 0o644, ROOT).unwrap().ino;
        assert_eq!(fs.write(ino, 0, &body(2, 5 << 20)).unwrap(), 5 << 20);
    }
    let mut after = BTreeMap::new();
    after.insert("after".to_string(), body(2, 5 << 20));
    check_through_kernel(&image, &after, &[]);
}

#[test]
fn many_small_files() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path(), 16);
    let mut files = BTreeMap::new();
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, ROOT).unwrap().ino;
        for i in 0.. {
            let name = format!("file-{i:06}");
            let ino = match fs.create(d, name.as_bytes(), 0o644, ROOT) {
                Ok(st) => st.ino,
                Err(Error::NoSpace(_)) => break,
                Err(e) => panic!("{e}"),
            };
            let data = body(i, 3000);
            match fs.write(ino, 0, &data) {
                Ok(n) => files.insert(format!("d/{name}"), data[..n].to_vec()),
                Err(Error::NoSpace(_)) => files.insert(format!("d/{name}"), Vec::new()),
                Err(e) => panic!("{e}"),
            };
        }
        assert!(files.len() > 1000, "only {} files", files.len());
    }
    check_through_kernel(&image, &files, &[]);
}

#[test]
fn many_directories() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path(), 16);
    let mut dirs = Vec::new();
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let top = fs.mkdir(ROOT_INO, b"top", 0o755, ROOT).unwrap().ino;
        for i in 0.. {
            let name = format!("dir-{i:06}");
            match fs.mkdir(top, name.as_bytes(), 0o755, ROOT) {
                Ok(_) => dirs.push(format!("top/{name}")),
                Err(Error::NoSpace(_)) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(dirs.len() > 1000, "only {} directories", dirs.len());
    }
    check_through_kernel(&image, &BTreeMap::new(), &dirs);
}
