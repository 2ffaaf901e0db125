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

/// What one thread wrote: files with their contents, and directories.
type Written = (BTreeMap<String, Vec<u8>>, Vec<String>);

/// Four threads fill one disk at once — files written in 40 KiB pieces, a file
/// of each thread's grown 4 KiB at a time (the threads' blocks interleave, so
/// its extent tree keeps splitting, which needs blocks right up to the end),
/// directories, xattrs, fallocate — each until ENOSPC. Every refusal must be an
/// ordinary ENOSPC before the operation changed anything: the filesystem never
/// enters its error state (an operation that ran out of space halfway would
/// abort the journal), e2fsck -fn is silent and the kernel reads back every
/// byte each thread was told it wrote.
#[test]
fn concurrent_writers_fill_the_disk_and_get_enospc_not_an_abort() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path(), 24);
    let mut files = BTreeMap::new();
    let mut dirs = Vec::new();
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let results: Vec<Written> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4usize)
                .map(|t| {
                    let fs = &fs;
                    s.spawn(move || {
                        let _caller = fs.acting_as(Owner { uid: 1000, gid: 1000 });
                        let own = fs.mkdir(ROOT_INO, format!("t{t}").as_bytes(), 0o777, ROOT).unwrap().ino;
                        let (mut files, mut dirs) = (BTreeMap::new(), vec![format!("t{t}")]);
                        let frag = fs.create(own, b"frag", 0o644, ROOT).unwrap().ino;
                        let mut frag_data = Vec::new();
                        let mut refusals = 0;
                        for i in 0.. {
                            let step: uext4::Result<()> = (|| {
                                if i % 2 == 1 {
                                    let chunk = body(t * 7 + i, 4096);
                                    let n = fs.write(frag, frag_data.len() as u64, &chunk)?;
                                    frag_data.extend_from_slice(&chunk[..n]);
                                    files.insert(format!("t{t}/frag"), frag_data.clone());
                                    return Ok(());
                                }
                                match i / 2 % 5 {
                                    0 => {
                                        let name = format!("d{i}");
                                        fs.mkdir(own, name.as_bytes(), 0o755, ROOT)?;
                                        dirs.push(format!("t{t}/{name}"));
                                    }
                                    1 => {
                                        let name = format!("x{i}");
                                        let ino = fs.create(own, name.as_bytes(), 0o644, ROOT)?.ino;
                                        files.insert(format!("t{t}/{name}"), Vec::new());
                                        fs.set_xattr(ino, b"user.big", &vec![t as u8; 3000], 0)?;
                                    }
                                    2 => {
                                        let name = format!("p{i}");
                                        let ino = fs.create(own, name.as_bytes(), 0o644, ROOT)?.ino;
                                        files.insert(format!("t{t}/{name}"), Vec::new());
                                        fs.fallocate(ino, 0, 200_000, 0)?;
                                        files.insert(format!("t{t}/{name}"), vec![0; 200_000]);
                                    }
                                    _ => {
                                        let name = format!("f{i}");
                                        let ino = fs.create(own, name.as_bytes(), 0o644, ROOT)?.ino;
                                        let mut data = Vec::new();
                                        files.insert(format!("t{t}/{name}"), Vec::new());
                                        for piece in 0..8 {
                                            let chunk = body(t * 1000 + i + piece, 40 * 1024);
                                            let n = fs.write(ino, data.len() as u64, &chunk)?;
                                            data.extend_from_slice(&chunk[..n]);
                                            files.insert(format!("t{t}/{name}"), data.clone());
                                            if n < chunk.len() {
                                                break;
                                            }
                                        }
                                    }
                                }
                                Ok(())
                            })();
                            match step {
                                Ok(()) => {}
                                Err(Error::NoSpace(_)) => {
                                    refusals += 1;
                                    if refusals == 40 {
                                        break;
                                    }
                                }
                                Err(e) => panic!("thread {t}, step {i}: {e}"),
                            }
                        }
                        (files, dirs)
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert!(!fs.has_failed(), "the filesystem entered its error state: {}", fs.read_only_reason());
        for (f, d) in results {
            files.extend(f);
            dirs.extend(d);
        }
        assert!(fs.statfs().available_blocks < 64, "the disk did not fill: {:?}", fs.statfs());
        fs.sync().unwrap();
    }
    check_through_kernel(&image, &files, &dirs);
}

/// On a disk full to the last block, punching a hole that splits an extent of
/// a file whose four in-inode extents are taken needs a new tree block: like
/// the kernel (which keeps s_resv_clusters for it), uext4 takes it from the
/// blocks it keeps for changes that cannot be refused, and the punch succeeds
/// — a punch cannot fail halfway, and must not take the filesystem down. The
/// kernel then reads the file with its hole, and e2fsck -fn is silent.
#[test]
fn a_punch_on_a_full_disk_gets_its_tree_block() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = image(dir.path(), 16);
    let mut files = BTreeMap::new();
    {
        let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
        let _root = fs.acting_as(ROOT);
        let bs = fs.statfs().block_size as usize;
        let mut f_data = vec![0u8; 70 * bs];
        let f = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
        // Four extents: blocks 0-9, 20-29, 40-49, 60-69.
        for start in [0usize, 20, 40, 60] {
            let piece = body(start, 10 * bs);
            fs.write(f, (start * bs) as u64, &piece).unwrap();
            f_data[start * bs..(start + 10) * bs].copy_from_slice(&piece);
        }
        // Fill the disk, as root, with data and then with one-block xattrs,
        // until not even one block is granted.
        let fill = fs.create(ROOT_INO, b"fill", 0o644, ROOT).unwrap().ino;
        let chunk = body(9, 1 << 20);
        let mut filled = Vec::new();
        loop {
            match fs.write(fill, filled.len() as u64, &chunk) {
                Ok(n) if n > 0 => filled.extend_from_slice(&chunk[..n]),
                Ok(_) | Err(Error::NoSpace(_)) => break,
                Err(e) => panic!("{e}"),
            }
        }
        files.insert("fill".to_string(), filled);
        let value = vec![7u8; bs / 2];
        for i in 0.. {
            let name = format!("x{i}");
            let ino = match fs.create(ROOT_INO, name.as_bytes(), 0o644, ROOT) {
                Ok(st) => st.ino,
                Err(Error::NoSpace(_)) => break,
                Err(e) => panic!("{e}"),
            };
            files.insert(name, Vec::new());
            match fs.set_xattr(ino, b"user.fill", &value, 0) {
                Ok(()) => {}
                Err(Error::NoSpace(_)) => break,
                Err(e) => panic!("{e}"),
            }
        }
        let punched = 5 * bs as u64;
        fs.fallocate(f, punched, bs as u64, 0x02 | 0x01).unwrap();
        f_data[5 * bs..6 * bs].fill(0);
        assert!(!fs.has_failed(), "{}", fs.read_only_reason());
        assert_eq!(fs.read_all(f).unwrap(), f_data);
        fs.sync().unwrap();
        files.insert("f".to_string(), f_data);
    }
    let extents = oracle::run(std::process::Command::new("debugfs").args(["-R", "ex /f"]).arg(&image));
    assert!(extents.lines().any(|l| l.trim_start().starts_with("0/ 1")), "the tree grew a level:\n{extents}");
    check_through_kernel(&image, &files, &[]);
}
