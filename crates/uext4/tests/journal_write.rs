//! uext4 writes through the jbd2 journal, and the kernel and e2fsck replay it.
//!
//! After `commit` (and before the checkpoint that `sync` does) the image's home
//! blocks are stale and the log holds the truth, with needs_recovery set. A copy
//! taken then must come back, through the kernel's replay on mount and through
//! `e2fsck -fy`, as exactly the tree uext4 had committed, and then be e2fsck-clean.
//! A small journal makes the log wrap and revokes appear (directories and extent
//! blocks freed after being journaled).

mod oracle;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use uext4::{Filesystem, Options, Owner, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

type Manifest = BTreeMap<Vec<u8>, (char, u64, Vec<u8>)>;

fn manifest(fs: &Filesystem) -> Manifest {
    let mut out = Manifest::new();
    fs.walk(ROOT_INO, &mut |path, st| {
        out.insert(path.to_vec(), (st.file_type.letter(), st.size, oracle::content_digest(fs, st)?));
        Ok(())
    })
    .unwrap();
    out
}

fn open_rw(image: &Path) -> Filesystem {
    // A long interval: commits happen exactly where the test asks for them.
    Filesystem::open(image, Options { read_only: false, commit_interval_secs: 3600, ..Options::default() }).unwrap()
}

/// A round of changes: files of several sizes (some with extent index blocks),
/// directories, symlinks, and removals of things made in earlier rounds.
fn change_round(fs: &Filesystem, round: u32) {
    let dir = fs.mkdir(ROOT_INO, format!("r{round}").as_bytes(), 0o755, ROOT).unwrap().ino;
    for i in 0..20u32 {
        let f = fs.create(dir, format!("f{i}").as_bytes(), 0o644, ROOT).unwrap().ino;
        let len = [0usize, 100, 5000, 70_000][i as usize % 4];
        let body: Vec<u8> = (0..len).map(|k| (k as u32 ^ i ^ round) as u8).collect();
        fs.write(f, 0, &body).unwrap();
    }
    // A fragmented file: every other block, enough extents for an index block.
    let frag = fs.create(dir, b"fragmented", 0o644, ROOT).unwrap().ino;
    for b in (0..1200u64).step_by(2) {
        fs.write(frag, b * 4096, &[round as u8 + 1; 4096]).unwrap();
    }
    fs.symlink(dir, b"link", format!("../r{round}/f1").as_bytes(), ROOT).unwrap();
    if round >= 2 {
        // Remove most of round-2's directory: its blocks were journaled, now revoked.
        let old = fs.lookup(ROOT_INO, format!("r{}", round - 2).as_bytes()).unwrap().unwrap();
        for i in 0..20u32 {
            fs.unlink(old, format!("f{i}").as_bytes()).unwrap();
        }
        fs.unlink(old, b"fragmented").unwrap();
    }
}

fn kernel_replays_and_e2fsck_recovers(mkfs_args: &[&str], rounds: u32) {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F"]).args(mkfs_args).arg(&image).arg("256M"));
    let fs = open_rw(&image);
    for round in 0..rounds {
        change_round(&fs, round);
        fs.commit().unwrap();
    }
    let stats = fs.journal_stats().expect("the image has a journal");
    assert_eq!(stats.commits, rounds as u64, "{stats:?}");
    assert_eq!(stats.checkpoints, 0, "{stats:?}");
    assert_eq!(stats.unjournaled_commits, 0, "{stats:?}");
    let expected = manifest(&fs);
    let for_kernel = dir.path().join("for-kernel");
    let for_e2fsck = dir.path().join("for-e2fsck");
    std::fs::copy(&image, &for_kernel).unwrap();
    std::fs::copy(&image, &for_e2fsck).unwrap();
    // The committed state lives in the log only: the home blocks are behind.
    assert!(oracle::dumpe2fs_field(&for_kernel, "Filesystem features").unwrap().contains("needs_recovery"));
    drop(fs);
    assert!(!oracle::dumpe2fs_field(&image, "Filesystem features").unwrap().contains("needs_recovery"));
    oracle::assert_e2fsck_clean(&image);
    assert_eq!(manifest(&Filesystem::open(&image, Options::default()).unwrap()), expected);

    // e2fsck replays the log (exit 1: it changed the image) and then finds nothing.
    let out = Command::new("e2fsck").arg("-fy").arg(&for_e2fsck).output().unwrap();
    assert!(out.status.code().unwrap_or(8) <= 1, "e2fsck -fy: {}", String::from_utf8_lossy(&out.stdout));
    oracle::assert_e2fsck_clean(&for_e2fsck);
    assert_eq!(manifest(&Filesystem::open(&for_e2fsck, Options::default()).unwrap()), expected);

    if !oracle::require_loop() {
        return;
    }
    {
        // The kernel replays on mount; what it shows is what uext4 committed.
        let m = oracle::Mount::new(&for_kernel, "rw");
        for (path, (kind, size, digest)) in &expected {
            let host = m.dir.join(std::str::from_utf8(&path[1..]).unwrap());
            let meta = std::fs::symlink_metadata(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
            if *kind == 'f' {
                assert_eq!(meta.len(), *size, "{}", host.display());
                let data = std::fs::read(&host).unwrap();
                assert_eq!(&sha2_of(&data), digest, "{}", host.display());
            }
        }
        let mut count = 0;
        count_entries(&m.dir, &mut count);
        assert_eq!(count, expected.len() - 1, "entries the kernel shows");
    }
    oracle::assert_e2fsck_clean(&for_kernel);
}

fn sha2_of(data: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    Sha256::digest(data).to_vec()
}

fn count_entries(dir: &Path, count: &mut usize) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        *count += 1;
        if e.file_type().unwrap().is_dir() {
            count_entries(&e.path(), count);
        }
    }
}

#[test]
fn kernel_and_e2fsck_replay_uext4_journal_default_shape() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    kernel_replays_and_e2fsck_recovers(&[], 3);
}

#[test]
fn kernel_and_e2fsck_replay_uext4_journal_without_checksums_or_64bit() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    kernel_replays_and_e2fsck_recovers(&["-O", "^metadata_csum,^64bit"], 3);
}

/// A 1,024-block journal: many commits wrap the log, and freed journaled blocks
/// are revoked; the recovered copy still equals what was committed.
#[test]
fn small_journal_wraps_and_revokes() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", "-J", "size=4"]).arg(&image).arg("256M"));
    let fs = open_rw(&image);
    for round in 0..80 {
        change_round(&fs, round);
        fs.commit().unwrap();
    }
    let stats = fs.journal_stats().unwrap();
    assert!(stats.wraps >= 1, "the log never wrapped: {stats:?}");
    assert!(stats.revokes_logged > 0, "nothing was revoked: {stats:?}");
    assert!(stats.checkpoints >= 1, "a full log forces checkpoints: {stats:?}");
    let expected = manifest(&fs);
    let copy = dir.path().join("copy");
    let copy2 = dir.path().join("copy2");
    std::fs::copy(&image, &copy).unwrap();
    std::fs::copy(&image, &copy2).unwrap();
    drop(fs);
    oracle::assert_e2fsck_clean(&image);
    let out = Command::new("e2fsck").arg("-fy").arg(&copy).output().unwrap();
    assert!(out.status.code().unwrap_or(8) <= 1, "e2fsck -fy: {}", String::from_utf8_lossy(&out.stdout));
    oracle::assert_e2fsck_clean(&copy);
    assert_eq!(manifest(&Filesystem::open(&copy, Options::default()).unwrap()), expected);
    // uext4's own writable open recovers the same way.
    drop(open_rw(&copy2));
    oracle::assert_e2fsck_clean(&copy2);
    assert_eq!(manifest(&Filesystem::open(&copy2, Options::default()).unwrap()), expected);
}

/// With the commit timer running, a change is committed by the clock alone: no
/// later change, sync or fsync asks for it. A copy taken then recovers to it.
#[test]
fn commit_timer_commits_without_a_further_change() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image).arg("64M"));
    let opts = Options { read_only: false, commit_interval_secs: 1, ..Options::default() };
    let fs = std::sync::Arc::new(Filesystem::open(&image, opts).unwrap());
    fs.start_commit_timer().unwrap();
    let ino = fs.create(ROOT_INO, b"timed", 0o644, ROOT).unwrap().ino;
    fs.write(ino, 0, b"committed by the clock").unwrap();
    // Waiting for an event, not measuring speed: the bound is only a hang guard.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while fs.journal_stats().unwrap().commits == 0 {
        assert!(std::time::Instant::now() < deadline, "no commit within 30 s of a 1 s interval");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let copy = dir.path().join("copy");
    std::fs::copy(&image, &copy).unwrap();
    assert!(oracle::dumpe2fs_field(&copy, "Filesystem features").unwrap().contains("needs_recovery"));
    drop(fs);
    let out = Command::new("e2fsck").arg("-fy").arg(&copy).output().unwrap();
    assert!(out.status.code().unwrap_or(8) <= 1, "e2fsck -fy: {}", String::from_utf8_lossy(&out.stdout));
    oracle::assert_e2fsck_clean(&copy);
    let dumped = dir.path().join("timed");
    oracle::run(Command::new("debugfs").arg("-R").arg(format!("dump /timed {}", dumped.display())).arg(&copy));
    assert_eq!(std::fs::read(&dumped).unwrap(), b"committed by the clock");
}
