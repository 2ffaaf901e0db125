//! The fuzz target's input handling, kept apart from libFuzzer so it can be built
//! and run on any toolchain (`cargo run --bin open_and_walk -- FILE...` replays
//! inputs without libFuzzer's instrumentation).
//!
//! An input is either a whole image (at least 2 KiB with the ext4 magic where the
//! superblock keeps it), or a selector byte followed by 6-byte edit records that
//! `uext4::fuzzing::mutate` applies to seed image `selector % seeds`.

use std::path::PathBuf;
use std::sync::OnceLock;
use uext4::fuzzing::{self, Budget};
use uext4::{Error, Options};

/// Where `make_seeds.sh` leaves seed images (`UEXT4_FUZZ_SEEDS` overrides).
fn seed_dir() -> PathBuf {
    std::env::var_os("UEXT4_FUZZ_SEEDS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds"))
}

/// The seed images: every `*.img` in the seed directory, or if there is none a
/// small empty filesystem made by uext4's own mkfs.
pub fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(seed_dir())
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        paths.retain(|p| p.extension().is_some_and(|e| e == "img"));
        paths.sort();
        let mut v: Vec<Vec<u8>> = paths.iter().filter_map(|p| std::fs::read(p).ok()).collect();
        if v.is_empty() {
            eprintln!("uext4-fuzz: no seed images in {}; using an empty mkfs image", seed_dir().display());
            v.push(builtin_seed());
        }
        v
    })
}

fn builtin_seed() -> Vec<u8> {
    let opts = uext4::mkfs::MkfsOptions {
        size: 8 << 20,
        block_size: Some(1024),
        uuid: Some([7; 16]),
        hash_seed: Some([9; 16]),
        now: Some(1_700_000_000),
        ..Default::default()
    };
    let dev = uext4::dev::MemDevice::new(vec![0; opts.size as usize]);
    uext4::mkfs::make(&dev, &opts, true).expect("mkfs of the built-in seed");
    dev.into_inner()
}

/// The image an input stands for (see `uext4::fuzzing::image_for`).
pub fn image_for(data: &[u8]) -> Vec<u8> {
    fuzzing::image_for(seeds(), data)
}

/// Opens the image an input stands for and walks it, with and without checksum
/// verification. Errors are the expected outcome; only a panic, a hang or an
/// allocation beyond libFuzzer's limits is a finding.
pub fn run(data: &[u8]) {
    let image = image_for(data);
    let budget = Budget::fuzz();
    for ignore_checksums in [false, true] {
        let opts = Options { ignore_checksums, cache_mb: 4, inode_cache_entries: 1024, ..Options::default() };
        // Errors must be Corrupt or Unsupported: anything else is a bug.
        match fuzzing::open_and_walk_bytes(image.clone(), opts, &budget) {
            Ok(report) => assert!(report.other == 0, "unexpected error kind: {:?}", report.messages),
            Err(Error::Corrupt { .. } | Error::Unsupported { .. }) => {}
            Err(e) => panic!("open failed with an unexpected error kind: {e:?}"),
        }
    }
}

/// Opens the image an input stands for read-write and runs `fuzzing::write_script`
/// on it (in memory). Corrupt and ordinary refusals are expected outcomes; a panic,
/// a hang, an error of a kind no damaged image should cause, or a refused open that
/// changed the image is a finding. Whether a successful script left the image as
/// sound as it found it needs e2fsck, which is too slow for the loop: the replay
/// test `write_fuzz_findings_replay_soundly` in `crates/uext4/tests/bad_input.rs`
/// runs the kept inputs (`fuzz/kept/write_script/`) through it.
pub fn run_write(data: &[u8]) {
    let image = image_for(data);
    let opts = Options { cache_mb: 4, inode_cache_entries: 1024, ..Options::default() };
    let (result, after) = fuzzing::open_and_write_bytes(image.clone(), opts);
    match result {
        Ok(report) => assert!(report.other == 0, "unexpected error kind: {:?}", report.messages),
        Err(Error::Corrupt { .. } | Error::Unsupported { .. }) => {
            // A journal needing recovery is replayed first (as the kernel's mount
            // does), and stays replayed if the open then refuses.
            let needs_recovery = image.get(1024 + 0x60).is_some_and(|b| b & 0x4 != 0);
            assert!(needs_recovery || after == image, "a refused writable open changed the image")
        }
        Err(e) => panic!("open failed with an unexpected error kind: {e:?}"),
    }
}
