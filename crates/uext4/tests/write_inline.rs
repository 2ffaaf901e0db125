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

/// A fresh inline_data image made by mkfs.ext4 (`-b` block size, `-I` inode size).
fn fresh_image(dir: &std::path::Path, name: &str, block: u32, inode: u32) -> std::path::PathBuf {
    let image = dir.join(name);
    oracle::run(
        std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "inline_data", "-b", &block.to_string(), "-I", &inode.to_string()])
            .arg(&image)
            .arg("64M"),
    );
    image
}

fn writable(image: &std::path::Path) -> Filesystem {
    Filesystem::open(image, Options { read_only: false, ..Options::default() }).unwrap()
}

/// An inode's i_block and in-body xattr area as stored, with the inode numbers
/// of a directory's entries and parent masked (the two allocators may number
/// inodes differently; everything else must match).
fn inline_area(fs: &Filesystem, ino: u32) -> (u32, u64, Vec<u8>) {
    let inode = fs.inode(ino).unwrap();
    let mut bytes = inode.i_block.to_vec();
    bytes.extend_from_slice(inode.xattr_area());
    if inode.is_dir() && inode.has_flag(EXT4_INLINE_DATA_FL) {
        let data = fs.inline_data(ino, &inode).unwrap();
        bytes[..4].fill(0);
        // Each run of entries: i_block after the parent, then the value.
        let value_at = 60 + inode.xattr_area().len() - (data.len() - 60);
        let runs = [(4usize, 60usize, 4usize), (60, data.len(), value_at)];
        for (start, end, stored) in runs {
            let mut off = start;
            while off + 8 <= end {
                let rec_len = u16::from_le_bytes([data[off + 4], data[off + 5]]) as usize;
                let at = stored + off - start;
                bytes[at..at + 4].fill(0);
                if rec_len == 0 {
                    break;
                }
                off += rec_len;
            }
        }
    }
    (inode.i_flags, inode.i_size, bytes)
}

/// Files of 1..=128 bytes (each one write) and directories of 0..=7 names made
/// by uext4 lie in their inodes byte for byte as the kernel lays out the same
/// operations (4 KiB blocks, 256-byte inodes: 128 bytes inline).
#[test]
fn inline_inodes_equal_the_kernels_byte_for_byte() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (block, inode_size, max) in [(4096, 256, 128usize), (1024, 512, 384)] {
        let kernel = fresh_image(dir.path(), "kernel.img", block, inode_size);
        let ours = fresh_image(dir.path(), "ours.img", block, inode_size);
        let sizes: Vec<usize> = (1..=max).filter(|n| *n <= 130 || n % 37 == 0 || *n == max).collect();
        let content = |n: usize| (0..n).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>();
        {
            let m = oracle::Mount::new(&kernel, "");
            for &n in &sizes {
                std::fs::write(m.dir.join(format!("f{n}")), content(n)).unwrap();
            }
            for k in 0..=7 {
                let d = m.dir.join(format!("d{k}"));
                std::fs::create_dir(&d).unwrap();
                for i in 0..k {
                    std::fs::write(d.join(format!("name-{i}")), b"").unwrap();
                }
            }
            m.unmount();
        }
        {
            let fs = writable(&ours);
            for &n in &sizes {
                let f = fs.create(ROOT_INO, format!("f{n}").as_bytes(), 0o644, ROOT).unwrap().ino;
                assert_eq!(fs.write(f, 0, &content(n)).unwrap(), n);
            }
            for k in 0..=7 {
                let d = fs.mkdir(ROOT_INO, format!("d{k}").as_bytes(), 0o755, ROOT).unwrap().ino;
                for i in 0..k {
                    fs.create(d, format!("name-{i}").as_bytes(), 0o644, ROOT).unwrap();
                }
            }
            fs.sync().unwrap();
        }
        oracle::assert_e2fsck_clean(&ours);
        oracle::assert_e2fsck_clean(&kernel);
        let k = Filesystem::open(&kernel, Options::default()).unwrap();
        let u = Filesystem::open(&ours, Options::default()).unwrap();
        let mut names: Vec<String> = sizes.iter().map(|n| format!("/f{n}")).collect();
        names.extend((0..=7).map(|k| format!("/d{k}")));
        for name in names {
            let ki = k.lookup_path(name.as_bytes()).unwrap();
            let ui = u.lookup_path(name.as_bytes()).unwrap();
            let (kf, ks, kb) = inline_area(&k, ki);
            let (uf, us, ub) = inline_area(&u, ui);
            assert_eq!((uf, us), (kf, ks), "{name} ({block}/{inode_size}): flags and size");
            assert_eq!(ub, kb, "{name} ({block}/{inode_size}): i_block and xattr area");
        }
        // The edges themselves: the capacity inline, one more byte not; the
        // directory of 7 names has grown into system.data.
        let flags = |p: String| u.stat(u.lookup_path(p.as_bytes()).unwrap()).unwrap().flags & EXT4_INLINE_DATA_FL;
        assert_ne!(flags(format!("/f{max}")), 0);
        assert_ne!(flags("/d7".into()), 0);
        assert_eq!(u.stat(u.lookup_path(b"/d7").unwrap()).unwrap().size, max as u64);
        std::fs::remove_file(&kernel).unwrap();
        std::fs::remove_file(&ours).unwrap();
    }
}

/// Block 0 of directory `path`, with the inode numbers of its entries and its
/// checksum tail masked.
fn dir_block0(fs: &Filesystem, image: &std::path::Path, path: &str) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let ino = fs.lookup_path(path.as_bytes()).unwrap();
    let inode = fs.inode(ino).unwrap();
    assert_eq!(inode.i_flags & EXT4_INLINE_DATA_FL, 0, "{path} is still inline");
    let bs = fs.statfs().block_size as usize;
    let uext4::extent::MapKind::Mapped(p) = fs.map_blocks(ino, &inode, 0, 1).unwrap().kind else {
        panic!("{path} has no block 0")
    };
    let mut block = vec![0u8; bs];
    std::fs::File::open(image).unwrap().read_exact_at(&mut block, p * bs as u64).unwrap();
    let mut off = 0;
    while off + 8 <= bs {
        let rec_len = u16::from_le_bytes([block[off + 4], block[off + 5]]) as usize;
        block[off..off + 4].fill(0);
        if rec_len == 0 {
            break;
        }
        if rec_len == 12 && block[off + 7] == 0xDE {
            block[off + 8..off + 12].fill(0);
        }
        off += rec_len;
    }
    block
}

/// (directory, names created, names then removed, names then created)
type Plan = (String, Vec<String>, Vec<String>, Vec<String>);

/// A directory that outgrows its inode moves to a block laid out byte for byte as
/// the kernel lays it out (names kept where they were, the last entry stretched to
/// the end), after the 8th and 9th names, after removals, and on to more names.
#[test]
fn a_full_inline_directory_moves_to_the_kernels_block() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (block, inode_size, many) in [(4096, 256, 9usize), (1024, 512, 30)] {
        let kernel = fresh_image(dir.path(), "kernel.img", block, inode_size);
        let ours = fresh_image(dir.path(), "ours.img", block, inode_size);
        let plan: Vec<Plan> = vec![
            ("eight".into(), (0..many - 1).map(|i| format!("name-{i}")).collect(), vec![], vec![]),
            ("nine".into(), (0..many).map(|i| format!("name-{i}")).collect(), vec![], vec![]),
            ("twelve".into(), (0..many + 3).map(|i| format!("n{i}")).collect(), vec![], vec![]),
            (
                "holes".into(),
                (0..many - 2).map(|i| format!("name-{i}")).collect(),
                vec!["name-1".into(), "name-5".into(), "name-0".into()],
                (0..6).map(|i| format!("later-{i}")).collect(),
            ),
            ("long".into(), vec!["a".repeat(40), "b".repeat(200), "c".repeat(250)], vec![], vec!["d".into()]),
        ];
        {
            let m = oracle::Mount::new(&kernel, "");
            for (d, first, removed, then) in &plan {
                let d = m.dir.join(d);
                std::fs::create_dir(&d).unwrap();
                for n in first {
                    std::fs::write(d.join(n), b"").unwrap();
                }
                for n in removed {
                    std::fs::remove_file(d.join(n)).unwrap();
                }
                for n in then {
                    std::fs::create_dir(d.join(n)).unwrap();
                }
            }
            m.unmount();
        }
        {
            let fs = writable(&ours);
            for (d, first, removed, then) in &plan {
                let d = fs.mkdir(ROOT_INO, d.as_bytes(), 0o755, ROOT).unwrap().ino;
                for n in first {
                    fs.create(d, n.as_bytes(), 0o644, ROOT).unwrap();
                }
                for n in removed {
                    fs.unlink(d, n.as_bytes()).unwrap();
                }
                for n in then {
                    fs.mkdir(d, n.as_bytes(), 0o755, ROOT).unwrap();
                }
            }
            fs.sync().unwrap();
        }
        oracle::assert_e2fsck_clean(&ours);
        let k = Filesystem::open(&kernel, Options::default()).unwrap();
        let u = Filesystem::open(&ours, Options::default()).unwrap();
        for (d, ..) in &plan {
            let path = format!("/{d}");
            assert_eq!(
                dir_block0(&u, &ours, &path),
                dir_block0(&k, &kernel, &path),
                "{path} ({block}/{inode_size}): block 0"
            );
            let names = |fs: &Filesystem| {
                let mut v: Vec<Vec<u8>> = fs
                    .read_dir(fs.lookup_path(path.as_bytes()).unwrap())
                    .unwrap()
                    .into_iter()
                    .map(|e| e.name)
                    .collect();
                v.sort();
                v
            };
            assert_eq!(names(&u), names(&k));
        }
        std::fs::remove_file(&kernel).unwrap();
        std::fs::remove_file(&ours).unwrap();
    }
}

/// What one side shows of a tree: per path (relative, lost+found left out) its
/// kind, permissions, size, mtime and, for files, the SHA-256 of the contents.
type Snapshot = std::collections::BTreeMap<String, (bool, u32, u64, (i64, u32), Option<Vec<u8>>)>;

/// The contents the test expects: per path, the file's bytes, or None for a directory.
type Model = std::collections::BTreeMap<String, Option<Vec<u8>>>;

fn sha(data: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(data).to_vec()
}

fn snapshot_uext4(fs: &Filesystem) -> Snapshot {
    fn walk(fs: &Filesystem, dir: u32, prefix: &str, out: &mut Snapshot) {
        for e in fs.read_dir(dir).unwrap() {
            if e.name == b"." || e.name == b".." || (dir == ROOT_INO && e.name == b"lost+found") {
                continue;
            }
            let path = format!("{prefix}{}", String::from_utf8(e.name.clone()).unwrap());
            let st = fs.stat(e.ino).unwrap();
            let is_dir = st.file_type == uext4::FileType::Directory;
            let digest = (!is_dir).then(|| sha(&fs.read_all(e.ino).unwrap()));
            out.insert(path.clone(), (is_dir, st.perm as u32, st.size, (st.mtime.sec, st.mtime.nsec), digest));
            if is_dir {
                walk(fs, e.ino, &format!("{path}/"), out);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(fs, ROOT_INO, "", &mut out);
    out
}

fn snapshot_kernel(root: &std::path::Path) -> Snapshot {
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &std::path::Path, prefix: &str, top: bool, out: &mut Snapshot) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            if top && name == "lost+found" {
                continue;
            }
            let path = format!("{prefix}{name}");
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            let digest = (!md.is_dir()).then(|| sha(&std::fs::read(e.path()).unwrap()));
            out.insert(
                path.clone(),
                (md.is_dir(), md.mode() & 0o7777, md.size(), (md.mtime(), md.mtime_nsec() as u32), digest),
            );
            if md.is_dir() {
                walk(&e.path(), &format!("{path}/"), false, out);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(root, "", true, &mut out);
    out
}

/// The snapshot holds exactly the model's paths, with its contents.
fn assert_matches_model(snapshot: &Snapshot, model: &Model, when: &str) {
    let paths: Vec<&String> = snapshot.keys().collect();
    let expected: Vec<&String> = model.keys().collect();
    assert_eq!(paths, expected, "{when}: the paths");
    for (path, want) in model {
        let got = &snapshot[path];
        match want {
            None => assert!(got.0, "{when}: {path} is not a directory"),
            Some(data) => {
                assert_eq!(got.2, data.len() as u64, "{when}: size of {path}");
                assert_eq!(got.4.as_ref(), Some(&sha(data)), "{when}: contents of {path}");
            }
        }
    }
}

fn debugfs_inline_size(image: &std::path::Path, path: &str) -> Option<usize> {
    let out = oracle::run(std::process::Command::new("debugfs").arg("-R").arg(format!("stat /{path}")).arg(image));
    out.lines().find_map(|l| l.trim().strip_prefix("Size of inline data: ").map(|n| n.trim().parse().unwrap()))
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add((i * 7 % 251) as u8)).collect()
}

/// Every kind of inline inode made by uext4 is read and changed by the kernel,
/// and what the kernel made and changed is read and changed by uext4, at 4 KiB
/// and 1 KiB blocks with 256-byte inodes and with 512-byte ones: contents by
/// SHA-256, listings, modes, sizes and mtimes equal on both sides, e2fsck -fn
/// silent after every turn, debugfs seeing the inline layouts.
#[test]
fn round_trips_with_the_kernel() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (block, inode_size, cap) in [(4096u32, 256u32, 128usize), (1024, 256, 128), (1024, 512, 384)] {
        let when = |turn: &str| format!("{turn} ({block}-byte blocks, {inode_size}-byte inodes)");
        let image = fresh_image(dir.path(), "trip.img", block, inode_size);
        let mut model = Model::new();
        // Turn 1: uext4 makes every kind.
        {
            let fs = writable(&image);
            let file = |model: &mut Model, parent: u32, path: &str, data: &[u8]| {
                let name = path.rsplit('/').next().unwrap();
                let ino = fs.create(parent, name.as_bytes(), 0o640, ROOT).unwrap().ino;
                if !data.is_empty() {
                    assert_eq!(fs.write(ino, 0, data).unwrap(), data.len());
                }
                model.insert(path.into(), Some(data.to_vec()));
                ino
            };
            for n in [1, 59, 60, 61, cap, cap + 1] {
                file(&mut model, ROOT_INO, &format!("s{n}"), &bytes(n, n as u8));
            }
            file(&mut model, ROOT_INO, "empty", b"");
            // Grown by appends: inline all the way to the capacity, then past it.
            let grown = file(&mut model, ROOT_INO, "grown", &bytes(10, 1));
            let out = file(&mut model, ROOT_INO, "grown-out", &bytes(10, 2));
            let mut g = bytes(10, 1);
            let mut o = bytes(10, 2);
            for step in [50, cap - 60, 40] {
                let more = bytes(step, step as u8);
                if g.len() + step <= cap {
                    fs.write(grown, g.len() as u64, &more).unwrap();
                    g.extend_from_slice(&more);
                }
                fs.write(out, o.len() as u64, &more).unwrap();
                o.extend_from_slice(&more);
            }
            model.insert("grown".into(), Some(g));
            model.insert("grown-out".into(), Some(o));
            // Shrunk, grown by truncate within its inline size, overwritten.
            let shrunk = file(&mut model, ROOT_INO, "shrunk", &bytes(cap, 3));
            fs.setattr(shrunk, &SetAttr { size: Some(30), ..Default::default() }).unwrap();
            let mut s = bytes(cap, 3);
            s.truncate(30);
            s.resize(50, 0);
            fs.setattr(shrunk, &SetAttr { size: Some(50), ..Default::default() }).unwrap();
            model.insert("shrunk".into(), Some(s));
            let over = file(&mut model, ROOT_INO, "over", &bytes(100, 4));
            fs.write(over, 20, b"OVERWRITTEN").unwrap();
            let mut v = bytes(100, 4);
            v[20..31].copy_from_slice(b"OVERWRITTEN");
            model.insert("over".into(), Some(v));
            // Directories of 0..=12 names (inline, grown into system.data, moved to a block).
            for k in 0..=12 {
                let d = fs.mkdir(ROOT_INO, format!("d{k}").as_bytes(), 0o750, ROOT).unwrap().ino;
                model.insert(format!("d{k}"), None);
                for i in 0..k {
                    file(&mut model, d, &format!("d{k}/e{i}"), format!("{k}-{i}").as_bytes());
                }
            }
            // On to an htree.
            let big = fs.mkdir(ROOT_INO, b"big", 0o755, ROOT).unwrap().ino;
            model.insert("big".into(), None);
            for i in 0..300 {
                file(&mut model, big, &format!("big/entry-with-a-long-name-{i:04}"), b"");
            }
            // Renames within, out of and into inline directories; an inline
            // directory moved to another parent; rmdir of an empty one.
            let at = |p: &str| fs.lookup_path(p.as_bytes()).unwrap();
            fs.rename(at("/d5"), b"e0", at("/d5"), b"r0", 0).unwrap();
            let v = model.remove("d5/e0").unwrap();
            model.insert("d5/r0".into(), v);
            fs.rename(at("/d6"), b"e1", at("/d4"), b"moved-in", 0).unwrap();
            let v = model.remove("d6/e1").unwrap();
            model.insert("d4/moved-in".into(), v);
            fs.rename(at("/d3"), b"e2", ROOT_INO, b"moved-out", 0).unwrap();
            let v = model.remove("d3/e2").unwrap();
            model.insert("moved-out".into(), v);
            fs.rename(ROOT_INO, b"d2", at("/d7"), b"sub", 0).unwrap();
            for p in ["d2", "d2/e0", "d2/e1"] {
                let v = model.remove(p).unwrap();
                model.insert(p.replacen("d2", "d7/sub", 1), v);
            }
            fs.mkdir(at("/d1"), b"gone", 0o755, ROOT).unwrap();
            fs.rmdir(at("/d1"), b"gone").unwrap();
            fs.set_xattr(at("/s1"), b"user.kept", b"beside the data", 0).unwrap();
            fs.sync().unwrap();
            assert_matches_model(&snapshot_uext4(&fs), &model, &when("uext4 made"));
        }
        oracle::assert_e2fsck_clean(&image);
        let inline = |path: &str| debugfs_inline_size(&image, path);
        for (path, size) in [("s1", 60), ("s59", 60), ("s61", 61), (&*format!("s{cap}"), cap), ("grown", cap)] {
            assert_eq!(inline(path), Some(size), "{}: debugfs on {path}", when("uext4 made"));
        }
        assert_eq!(inline(&format!("s{}", cap + 1)), None);
        assert_eq!(inline("grown-out"), None);
        assert_eq!(inline("d0"), Some(60));
        assert_eq!(inline("d3"), Some(60));
        // 12 two-byte names: 4 in i_block, 5 in 68 bytes of system.data, all in 324.
        assert_eq!(inline("d12"), if cap == 128 { None } else { Some(cap) });
        assert_eq!(inline("d9"), Some(cap));
        assert_eq!(inline("big"), None);
        assert_eq!(inline("empty"), None, "an empty file is not inline until written");
        // Turn 2: the kernel reads all of it (mtimes too) and changes it.
        let ours = {
            let fs = Filesystem::open(&image, Options::default()).unwrap();
            snapshot_uext4(&fs)
        };
        {
            let m = oracle::Mount::new(&image, "");
            let p = |s: &str| m.dir.join(s);
            assert_eq!(snapshot_kernel(&m.dir), ours, "{}", when("the kernel reads uext4's"));
            assert_eq!(oracle::host_xattrs(&p("s1")), vec![(b"user.kept".to_vec(), b"beside the data".to_vec())]);
            use std::io::Write;
            let append = |model: &mut Model, path: &str, data: &[u8]| {
                std::fs::OpenOptions::new().append(true).open(p(path)).unwrap().write_all(data).unwrap();
                model.get_mut(path).unwrap().as_mut().unwrap().extend_from_slice(data);
            };
            append(&mut model, "s1", b"+kernel");
            append(&mut model, "s59", &bytes(200, 9));
            append(&mut model, "grown-out", b"tail");
            let f = std::fs::OpenOptions::new().write(true).open(p(&format!("s{cap}"))).unwrap();
            f.set_len(5).unwrap();
            drop(f);
            model.get_mut(&format!("s{cap}")).unwrap().as_mut().unwrap().truncate(5);
            for i in 0..3 {
                std::fs::write(p(&format!("d1/k{i}")), b"k").unwrap();
                model.insert(format!("d1/k{i}"), Some(b"k".to_vec()));
            }
            std::fs::remove_file(p("d4/e0")).unwrap();
            model.remove("d4/e0");
            std::fs::rename(p("d7/sub"), p("d8/sub2")).unwrap();
            for q in ["d7/sub", "d7/sub/e0", "d7/sub/e1"] {
                let v = model.remove(q).unwrap();
                model.insert(q.replacen("d7/sub", "d8/sub2", 1), v);
            }
            // The kernel's own inline inodes, for uext4 to change.
            std::fs::write(p("k-small"), b"made by the kernel").unwrap();
            model.insert("k-small".into(), Some(b"made by the kernel".to_vec()));
            std::fs::create_dir(p("k-dir")).unwrap();
            model.insert("k-dir".into(), None);
            for i in 0..3 {
                std::fs::write(p(&format!("k-dir/x{i}")), b"x").unwrap();
                model.insert(format!("k-dir/x{i}"), Some(b"x".to_vec()));
            }
            assert_matches_model(&snapshot_kernel(&m.dir), &model, &when("the kernel changed"));
            m.unmount();
        }
        oracle::assert_e2fsck_clean(&image);
        assert_eq!(inline("k-small"), Some(60));
        assert_eq!(inline("s1"), Some(60));
        assert_eq!(inline("s59"), if cap == 128 { None } else { Some(259) });
        // Turn 3: uext4 reads the kernel's changes and changes them again.
        let kernels = {
            let m = oracle::Mount::new(&image, "ro");
            let s = snapshot_kernel(&m.dir);
            m.unmount();
            s
        };
        {
            let fs = writable(&image);
            assert_eq!(snapshot_uext4(&fs), kernels, "{}", when("uext4 reads the kernel's"));
            let at = |p: &str| fs.lookup_path(p.as_bytes()).unwrap();
            let grow = |model: &mut Model, path: &str, data: &[u8]| {
                let entry = model.get_mut(path).unwrap().as_mut().unwrap();
                fs.write(at(&format!("/{path}")), entry.len() as u64, data).unwrap();
                entry.extend_from_slice(data);
            };
            grow(&mut model, "k-small", &bytes(50, 5));
            grow(&mut model, "s1", &bytes(30, 6));
            let k_dir = at("/k-dir");
            for i in 0..12 {
                fs.create(k_dir, format!("more-{i}").as_bytes(), 0o600, ROOT).unwrap();
                model.insert(format!("k-dir/more-{i}"), Some(Vec::new()));
            }
            fs.unlink(at("/d1"), b"k1").unwrap();
            model.remove("d1/k1");
            fs.setattr(at("/s61"), &SetAttr { size: Some(3), ..Default::default() }).unwrap();
            model.get_mut("s61").unwrap().as_mut().unwrap().truncate(3);
            fs.sync().unwrap();
            assert_matches_model(&snapshot_uext4(&fs), &model, &when("uext4 changed the kernel's"));
        }
        oracle::assert_e2fsck_clean(&image);
        assert_eq!(inline("k-small"), Some(68));
        assert_eq!(inline("s61"), Some(60));
        // The kernel reads the last turn.
        let ours = {
            let fs = Filesystem::open(&image, Options::default()).unwrap();
            snapshot_uext4(&fs)
        };
        let m = oracle::Mount::new(&image, "ro");
        assert_eq!(snapshot_kernel(&m.dir), ours, "{}", when("the kernel reads uext4's last turn"));
        m.unmount();
        std::fs::remove_file(&image).unwrap();
    }
}

extern "C" {
    fn lseek(fd: i32, offset: i64, whence: i32) -> i64;
}

/// The kernel's lseek SEEK_DATA (3) or SEEK_HOLE (4) on a file, None for ENXIO.
fn kernel_seek(path: &std::path::Path, offset: u64, data: bool) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: a valid descriptor; lseek only reads its arguments.
    let r = unsafe { lseek(f.as_raw_fd(), offset as i64, if data { 3 } else { 4 }) };
    (r >= 0).then_some(r as u64)
}

/// SEEK_DATA and SEEK_HOLE on uext4's inline files equal the kernel's lseek on
/// the same files; attributes set beside inline data land where the kernel puts
/// them (the body while it has room, else the xattr block, the data staying
/// inline; a full block is ENOSPC on both), and the room they take is the
/// inline capacity's, as the kernel counts it.
#[test]
fn seeks_and_xattrs_beside_inline_data_match_the_kernel() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() || !oracle::have_tool("setfattr") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = fresh_image(dir.path(), "kernel.img", 4096, 256);
    let ours = fresh_image(dir.path(), "ours.img", 4096, 256);
    // (name, size written, truncated up to)
    let files: [(&str, usize, Option<u64>); 5] = [
        ("one", 1, None),
        ("sixty", 60, None),
        ("hundred", 100, None),
        ("up", 10, Some(40)),
        ("up-more", 70, Some(100)),
    ];
    // (file, attribute, value length): in order, on both sides.
    let attrs: [(&str, &str, usize); 6] = [
        ("hundred", "user.a", 4),
        ("hundred", "user.bb", 100),
        ("hundred", "user.c", 3000),
        ("hundred", "user.d", 2000),
        ("grows", "user.x", 40),
        ("grows", "user.y", 10),
    ];
    let value = |n: usize| vec![b'v'; n];
    let mut kernel_results = Vec::new();
    {
        let m = oracle::Mount::new(&kernel, "");
        for (name, size, up) in files {
            std::fs::write(m.dir.join(name), bytes(size, 1)).unwrap();
            if let Some(up) = up {
                std::fs::OpenOptions::new().write(true).open(m.dir.join(name)).unwrap().set_len(up).unwrap();
            }
        }
        std::fs::write(m.dir.join("grows"), bytes(10, 2)).unwrap();
        for (file, attr, len) in attrs {
            let ok = std::process::Command::new("setfattr")
                .args(["-n", attr, "-v", &String::from_utf8(value(len)).unwrap()])
                .arg(m.dir.join(file))
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&ok.stderr).to_string();
            kernel_results.push(if ok.status.success() {
                "ok".to_string()
            } else if text.contains("No space left") {
                "ENOSPC".to_string()
            } else {
                text
            });
        }
        // Grows past what the body leaves beside user.x and user.y.
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(m.dir.join("grows")).unwrap().write_all(&bytes(60, 3)).unwrap();
        for (name, ..) in files {
            let p = m.dir.join(name);
            let size = std::fs::metadata(&p).unwrap().len();
            for off in [0, 1, 9, 10, 39, 59, 60, 61, 99, size.saturating_sub(1), size, size + 1] {
                let (d, h) = (kernel_seek(&p, off, true), kernel_seek(&p, off, false));
                kernel_results.push(format!("{name} {off}: data {d:?} hole {h:?}"));
            }
        }
        m.unmount();
    }
    let mut our_results = Vec::new();
    {
        let fs = writable(&ours);
        for (name, size, up) in files {
            let ino = fs.create(ROOT_INO, name.as_bytes(), 0o644, ROOT).unwrap().ino;
            fs.write(ino, 0, &bytes(size, 1)).unwrap();
            if let Some(up) = up {
                fs.setattr(ino, &SetAttr { size: Some(up), ..Default::default() }).unwrap();
            }
        }
        let grows = fs.create(ROOT_INO, b"grows", 0o644, ROOT).unwrap().ino;
        fs.write(grows, 0, &bytes(10, 2)).unwrap();
        for (file, attr, len) in attrs {
            let ino = fs.lookup_path(format!("/{file}").as_bytes()).unwrap();
            our_results.push(match fs.set_xattr(ino, attr.as_bytes(), &value(len), 0) {
                Ok(()) => "ok".to_string(),
                Err(uext4::Error::NoSpace(_)) => "ENOSPC".to_string(),
                Err(e) => e.to_string(),
            });
        }
        fs.write(grows, 10, &bytes(60, 3)).unwrap();
        for (name, ..) in files {
            let ino = fs.lookup_path(format!("/{name}").as_bytes()).unwrap();
            let size = fs.stat(ino).unwrap().size;
            for off in [0, 1, 9, 10, 39, 59, 60, 61, 99, size.saturating_sub(1), size, size + 1] {
                let (d, h) =
                    (fs.seek_data_or_hole(ino, off, true).unwrap(), fs.seek_data_or_hole(ino, off, false).unwrap());
                our_results.push(format!("{name} {off}: data {d:?} hole {h:?}"));
            }
        }
        fs.sync().unwrap();
    }
    assert_eq!(our_results, kernel_results);
    oracle::assert_e2fsck_clean(&ours);
    // The same layouts, by debugfs: inline or not, inline sizes, an xattr block or not.
    let shape = |image: &std::path::Path, name: &str| {
        let out = oracle::run(std::process::Command::new("debugfs").arg("-R").arg(format!("stat /{name}")).arg(image));
        let inline = out.lines().find(|l| l.contains("Size of inline data")).map(str::to_string);
        let acl = out.lines().find_map(|l| l.trim().strip_prefix("File ACL: ")).map(|v| v.trim() != "0");
        let size = out.lines().find_map(|l| l.split("Size: ").nth(1).map(|s| s.trim().to_string()));
        (inline, acl, size)
    };
    for name in ["one", "sixty", "hundred", "up", "up-more", "grows"] {
        assert_eq!(shape(&ours, name), shape(&kernel, name), "{name}: debugfs stat");
    }
    let k = Filesystem::open(&kernel, Options::default()).unwrap();
    let u = Filesystem::open(&ours, Options::default()).unwrap();
    for name in ["hundred", "grows"] {
        let attrs = |fs: &Filesystem| {
            let mut a = fs.xattrs(fs.lookup_path(format!("/{name}").as_bytes()).unwrap()).unwrap();
            a.sort();
            a
        };
        assert_eq!(attrs(&u), attrs(&k), "{name}: attributes");
    }
}

/// With inline_data=off nothing new is inline, and e2fsck agrees.
#[test]
fn inline_data_off_makes_ordinary_inodes() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = fresh_image(dir.path(), "off.img", 4096, 256);
    {
        let mut opts = Options { read_only: false, ..Options::default() };
        opts.set("inline_data", "off").unwrap();
        let fs = Filesystem::open(&image, opts).unwrap();
        assert!(fs.tunables().iter().any(|t| t.name == "inline_data" && t.value == "off"));
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, ROOT).unwrap().ino;
        let f = fs.create(d, b"f", 0o644, ROOT).unwrap().ino;
        fs.write(f, 0, b"small").unwrap();
        for ino in [d, f] {
            assert_eq!(fs.stat(ino).unwrap().flags & EXT4_INLINE_DATA_FL, 0);
        }
        fs.sync().unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    assert_eq!(debugfs_inline_size(&image, "d"), None);
    assert_eq!(debugfs_inline_size(&image, "d/f"), None);
}

/// The kernel (6.18) makes no inline symlinks — a target of 60 bytes or more gets
/// a block — and neither does uext4; e2fsprogs does (mkfs.ext4 -d), and uext4
/// reads, moves and removes those, leaving e2fsck silent and the kernel reading
/// the moved one.
#[test]
fn symlinks_follow_the_kernel_and_e2fsprogs_inline_ones_are_kept() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    let long = "x".repeat(100);
    let other = "y".repeat(70);
    std::os::unix::fs::symlink(&long, tree.join("long-link")).unwrap();
    std::os::unix::fs::symlink(&other, tree.join("sub/l2")).unwrap();
    let image = dir.path().join("sym.img");
    oracle::run(
        std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "inline_data", "-I", "256", "-d"])
            .arg(&tree)
            .arg(&image)
            .arg("16M"),
    );
    {
        let fs = writable(&image);
        let link = fs.lookup_path(b"/long-link").unwrap();
        assert_ne!(fs.stat(link).unwrap().flags & EXT4_INLINE_DATA_FL, 0, "e2fsprogs made no inline symlink");
        assert_eq!(fs.read_link(link).unwrap(), long.as_bytes());
        let sub = fs.lookup_path(b"/sub").unwrap();
        fs.rename(ROOT_INO, b"long-link", sub, b"moved", 0).unwrap();
        fs.unlink(sub, b"l2").unwrap();
        // uext4's own symlink of the same length gets a block, as the kernel's does.
        let ours = fs.symlink(ROOT_INO, b"ours", long.as_bytes(), ROOT).unwrap().ino;
        assert_eq!(fs.stat(ours).unwrap().flags & EXT4_INLINE_DATA_FL, 0);
        fs.sync().unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "");
    assert_eq!(std::fs::read_link(m.dir.join("sub/moved")).unwrap().as_os_str(), long.as_str());
    assert_eq!(std::fs::read_link(m.dir.join("ours")).unwrap().as_os_str(), long.as_str());
    assert!(!m.dir.join("sub/l2").exists());
    std::os::unix::fs::symlink(&long, m.dir.join("kernels")).unwrap();
    m.unmount();
    assert_eq!(debugfs_inline_size(&image, "kernels"), None, "the kernel made an inline symlink");
    assert_eq!(debugfs_inline_size(&image, "ours"), None);
    oracle::assert_e2fsck_clean(&image);
}

/// A file truncated up before its first write still goes inline at that write,
/// its size past the inline bytes (even past the capacity), as the kernel does
/// it; e2fsck accepts that shape, and the rest reads as zeros on both sides.
#[test]
fn a_file_sized_before_its_first_write_goes_inline_as_the_kernels() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = fresh_image(dir.path(), "kernel.img", 4096, 256);
    let ours = fresh_image(dir.path(), "ours.img", 4096, 256);
    let sizes = [50u64, 100, 1000];
    {
        let m = oracle::Mount::new(&kernel, "");
        for size in sizes {
            let p = m.dir.join(format!("t{size}"));
            let f = std::fs::File::create(&p).unwrap();
            f.set_len(size).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, b"abc", 0).unwrap();
        }
        m.unmount();
    }
    {
        let fs = writable(&ours);
        for size in sizes {
            let ino = fs.create(ROOT_INO, format!("t{size}").as_bytes(), 0o644, ROOT).unwrap().ino;
            fs.setattr(ino, &SetAttr { size: Some(size), ..Default::default() }).unwrap();
            fs.write(ino, 0, b"abc").unwrap();
        }
        fs.sync().unwrap();
    }
    oracle::assert_e2fsck_clean(&kernel);
    oracle::assert_e2fsck_clean(&ours);
    let k = Filesystem::open(&kernel, Options::default()).unwrap();
    let u = Filesystem::open(&ours, Options::default()).unwrap();
    for size in sizes {
        let name = format!("/t{size}");
        let (ki, ui) = (k.lookup_path(name.as_bytes()).unwrap(), u.lookup_path(name.as_bytes()).unwrap());
        assert_eq!(inline_area(&u, ui), inline_area(&k, ki), "{name}");
        let mut want = vec![0u8; size as usize];
        want[..3].copy_from_slice(b"abc");
        assert!(u.read_all(ui).unwrap() == want && k.read_all(ki).unwrap() == want, "{name}: contents");
    }
}

/// Threads creating, writing and removing names side by side in shared small
/// directories (each moving from inline to a block while others change it, under
/// the structure lock) and in small files: whatever the interleaving, every name
/// and byte ends as its thread left it, and e2fsck -fn is silent.
#[test]
fn concurrent_changes_of_inline_directories_and_files() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = fresh_image(dir.path(), "threads.img", 1024, 256);
    let fs = std::sync::Arc::new(writable(&image));
    let dirs: Vec<u32> =
        (0..6).map(|d| fs.mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, ROOT).unwrap().ino).collect();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let (fs, dirs) = (fs.clone(), dirs.clone());
            s.spawn(move || {
                for round in 0..12 {
                    for &d in &dirs {
                        let name = format!("t{t}-{round}");
                        let f = fs.create(d, name.as_bytes(), 0o644, ROOT).unwrap().ino;
                        fs.write(f, 0, &bytes(10 + round * 11, t)).unwrap();
                        if round % 3 == 2 {
                            fs.unlink(d, format!("t{t}-{}", round - 1).as_bytes()).unwrap();
                        }
                    }
                }
            });
        }
    });
    for &d in &dirs {
        let mut names: Vec<String> = fs
            .read_dir(d)
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8(e.name).unwrap())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        let mut want: Vec<String> =
            (0..4).flat_map(|t| (0..12).filter(|r| r % 3 != 1).map(move |r| format!("t{t}-{r}"))).collect();
        want.sort();
        assert_eq!(names, want);
        for t in 0..4u8 {
            let f = fs.lookup(d, format!("t{t}-11").as_bytes()).unwrap().unwrap();
            assert_eq!(fs.read_all(f).unwrap(), bytes(10 + 11 * 11, t));
        }
    }
    fs.sync().unwrap();
    drop(fs);
    oracle::assert_e2fsck_clean(&image);
}

/// errno of a host xattr call on `path` (0 when it succeeds): `op` is 's' set,
/// 'g' get, 'r' remove.
fn host_xattr_errno(path: &std::path::Path, name: &[u8], op: char) -> i32 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = [0u8; 256];
    // SAFETY: both strings are NUL-terminated; the buffer is valid for its length.
    let rc = unsafe {
        match op {
            's' => libc::lsetxattr(c.as_ptr(), n.as_ptr(), b"x".as_ptr() as *const libc::c_void, 1, 0) as isize,
            'g' => libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr() as *mut libc::c_void, buf.len()),
            _ => libc::lremovexattr(c.as_ptr(), n.as_ptr()) as isize,
        }
    };
    if rc < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    } else {
        0
    }
}

/// `system.data` holds an inline inode's bytes, and only changes to the inode's
/// contents may touch it: the kernel has no xattr handler for it, nor for any
/// `system.` name but the two POSIX ACLs, and answers EOPNOTSUPP to get, set and
/// remove. uext4 answers as the kernel does, name by name, and the inline file and
/// directory stay whole (before, a set or remove went through and e2fsck aborted).
#[test]
fn reserved_system_names_are_refused_as_the_kernel_refuses_them() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let names: [&[u8]; 6] =
        [b"system.data", b"system.foo", b"system.richacl", b"system.posix_acl_accessX", b"user.", b"nonamespace"];
    let dir = tempfile::tempdir().unwrap();
    let image = fresh_image(dir.path(), "reserved.img", 4096, 256);
    let mut kernel = Vec::new();
    {
        let m = oracle::Mount::new(&image, "");
        std::fs::write(m.dir.join("f"), b"inline bytes").unwrap();
        std::fs::create_dir(m.dir.join("d")).unwrap();
        for path in [m.dir.join("f"), m.dir.join("d")] {
            for name in names {
                for op in ['s', 'g', 'r'] {
                    kernel.push((name, op, host_xattr_errno(&path, name, op)));
                }
            }
        }
        m.unmount();
    }
    assert!(kernel.iter().any(|&(name, _, e)| name == b"system.data" && e == libc::EOPNOTSUPP), "{kernel:?}");
    {
        let fs = writable(&image);
        let mut ours = Vec::new();
        for path in [&b"/f"[..], b"/d"] {
            let ino = fs.lookup_path(path).unwrap();
            for name in names {
                for op in ['s', 'g', 'r'] {
                    let result = match op {
                        's' => fs.set_xattr(ino, name, b"x", 0),
                        'g' => fs.get_xattr(ino, name).map(drop),
                        _ => fs.remove_xattr(ino, name),
                    };
                    let errno = match result {
                        Ok(()) => 0,
                        // get_xattr says "absent" as Ok(None); remove as NotFound.
                        Err(uext4::Error::NotFound(_)) => libc::ENODATA,
                        Err(e) => e.errno(),
                    };
                    ours.push((name, op, errno));
                }
            }
        }
        assert_eq!(ours, kernel, "(name, operation, errno) for the file, then the directory");
        let f = fs.lookup_path(b"/f").unwrap();
        assert_ne!(fs.stat(f).unwrap().flags & EXT4_INLINE_DATA_FL, 0);
        let mut buf = [0u8; 64];
        let n = fs.read(f, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"inline bytes");
        fs.sync().unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
}
