//! Feature gating at open: an unknown incompat feature refuses the open and names
//! the bit; an unknown ro_compat feature opens read-only (and refuses a writable
//! open); a writable open of an image whose journal needs recovery is refused with
//! a message saying what to do.

mod oracle;

use std::path::Path;
use std::process::Command;
use uext4::format::superblock::{Superblock, INCOMPAT_RECOVER, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE};
use uext4::{Error, Filesystem, Options};

fn make_image(dir: &Path) -> std::path::PathBuf {
    let image = dir.join("fs.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image).arg("16M"));
    image
}

/// Rewrites the primary superblock with `edit` applied (checksum recomputed).
fn edit_superblock(image: &Path, edit: impl FnOnce(&mut Superblock)) {
    let mut data = std::fs::read(image).unwrap();
    let off = SUPERBLOCK_OFFSET as usize;
    let mut sb = Superblock::parse(&data[off..off + SUPERBLOCK_SIZE], true).unwrap();
    edit(&mut sb);
    data[off..off + SUPERBLOCK_SIZE].copy_from_slice(&sb.to_bytes());
    std::fs::write(image, data).unwrap();
}

#[test]
fn unknown_incompat_feature_refuses_and_names_it() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = make_image(dir.path());
    edit_superblock(&image, |sb| sb.s_feature_incompat |= 1 << 30);
    match Filesystem::open(&image, Options::default()) {
        Err(Error::Unsupported { feature }) => assert!(feature.contains("FEATURE_I30"), "{feature}"),
        other => panic!("expected Unsupported, got {:?}", other.map(|_| ())),
    }
    // A known incompat feature uext4 does not read is named too.
    let image2 = dir.path().join("casefold.img");
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F", "-O", "casefold"]).arg(&image2).arg("16M"));
    let err = Filesystem::open(&image2, Options::default()).err().expect("casefold must be refused");
    assert!(err.to_string().contains("casefold"), "{err}");
    // An external journal device carries an ext4 superblock but is no filesystem:
    // named as what it is, not called corrupt (it said "0 inodes per group").
    let journal = dir.path().join("journal.img");
    oracle::run(
        Command::new("mkfs.ext4").args(["-q", "-F", "-O", "journal_dev", "-b", "4096"]).arg(&journal).arg("16M"),
    );
    match Filesystem::open(&journal, Options::default()) {
        Err(e @ Error::Unsupported { .. }) => assert!(e.to_string().contains("external journal device"), "{e}"),
        other => panic!("journal_dev: expected Unsupported, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn unknown_ro_compat_feature_opens_read_only() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = make_image(dir.path());
    edit_superblock(&image, |sb| sb.s_feature_ro_compat |= 1 << 29);
    let fs = Filesystem::open(&image, Options::default()).expect("read-only open works");
    assert!(fs.is_read_only());
    assert!(fs.lookup_path(b"/lost+found").is_ok());
    let err = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).err().unwrap();
    assert!(matches!(err, Error::Unsupported { .. }) && err.to_string().contains("read-only"), "{err}");
}

#[test]
fn writable_open_recovers_and_clears_needs_recovery() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = make_image(dir.path());
    // The flag with an empty log: recovery replays nothing and clears the flag.
    edit_superblock(&image, |sb| sb.s_feature_incompat |= INCOMPAT_RECOVER);
    assert!(oracle::dumpe2fs_field(&image, "Filesystem features").unwrap().contains("needs_recovery"));
    let fs = Filesystem::open(&image, Options { read_only: false, ..Options::default() }).unwrap();
    assert!(!fs.is_read_only());
    drop(fs);
    assert!(!oracle::dumpe2fs_field(&image, "Filesystem features").unwrap().contains("needs_recovery"));
    oracle::assert_e2fsck_clean(&image);
}
