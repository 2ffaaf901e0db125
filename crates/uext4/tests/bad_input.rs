//! Bad input: corrupt or hostile images must end in a clear error (`Corrupt` or
//! `Unsupported`), never a panic, a hang or unbounded memory.
//!
//! * the e2fsprogs damaged-image corpus (../shared/corpus/e2fsprogs), every image
//!   opened and walked with and without checksum verification;
//! * systematic damage to images made here without root (`mkfs.ext4 -d`): bytes
//!   flipped in every kind of metadata block, truncation, looping and out-of-range
//!   extent trees, broken directory entries and absurd counts;
//! * a deterministic mini fuzz: seeded random mutations of small images through the
//!   same open-and-walk routine as the cargo-fuzz target (`uext4::fuzzing`).

mod common_bad;
mod oracle;

use common_bad::*;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uext4::dev::MemDevice;
use uext4::format::inode::EXT4_INLINE_DATA_FL;
use uext4::fuzzing::{self, Budget};
use uext4::{Filesystem, Options, ROOT_INO};

/// Time one corpus image may take (open and walk, both checksum modes).
const CORPUS_IMAGE_LIMIT: Duration = Duration::from_secs(20);
/// Time one damaged fixture may take.
const TRIAL_LIMIT: Duration = Duration::from_secs(10);
/// Peak memory the whole test binary may reach.
const PEAK_RSS_LIMIT_MIB: u64 = 3 * 1024;

/// ../shared/corpus/e2fsprogs beside the checkout, or $UEXT4_E2FSPROGS_CORPUS (for
/// checkouts elsewhere, such as worktrees).
fn corpus_dir() -> PathBuf {
    match std::env::var_os("UEXT4_E2FSPROGS_CORPUS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/e2fsprogs"),
    }
}

#[derive(Default)]
struct Tally {
    opened_clean: u32,
    opened_with_errors: u32,
    open_corrupt: u32,
    open_unsupported: u32,
}

impl Tally {
    fn add(&mut self, o: &Outcome) {
        match o {
            Outcome::Opened(r) if r.errors() == 0 => self.opened_clean += 1,
            Outcome::Opened(_) => self.opened_with_errors += 1,
            Outcome::OpenCorrupt(_) => self.open_corrupt += 1,
            Outcome::OpenUnsupported(_) | Outcome::OpenOther(_) => self.open_unsupported += 1,
        }
    }
}

#[test]
fn e2fsprogs_corpus_never_panics_or_hangs() {
    let dir = corpus_dir();
    let mut images: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.ends_with(".img.gz") || n.ends_with(".img.bz2")
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    if !skip_unless(!images.is_empty(), &format!("the e2fsprogs image corpus is not at {}", dir.display())) {
        return;
    }
    let need_bzip2 = images.iter().any(|p| p.to_string_lossy().ends_with(".bz2"));
    if need_bzip2 && !have_tool("bzip2") {
        // Four of the images; the rest (gzip) still run. CI must have bzip2.
        assert!(!oracles_required(), "UEXT4_REQUIRE_ORACLES=1 but bzip2 is not installed");
        eprintln!("bzip2 is not installed: skipping the .img.bz2 images");
        images.retain(|p| !p.to_string_lossy().ends_with(".bz2"));
    }
    images.sort();
    let tmp = tempfile::tempdir().unwrap();
    let mut tallies = [Tally::default(), Tally::default()];
    let mut failures = Vec::new();
    let mut slowest = (Duration::ZERO, String::new());
    eprintln!("{:<40} {:<9} outcome", "image", "checksums");
    for src in &images {
        let path = decompress(src, tmp.path());
        let name = src.file_name().unwrap().to_string_lossy().to_string();
        let start = Instant::now();
        let p = path.clone();
        let result = bounded(CORPUS_IMAGE_LIMIT, move || {
            [false, true].map(|ignore| {
                let opts = Options { ignore_checksums: ignore, ..Options::default() };
                Outcome::of(Filesystem::open(&p, opts).map(|fs| fuzzing::walk_everything(&fs, &Budget::thorough())))
            })
        });
        let took = start.elapsed();
        if took > slowest.0 {
            slowest = (took, name.clone());
        }
        match result {
            Ok(outcomes) => {
                for (i, o) in outcomes.iter().enumerate() {
                    let mode = if i == 0 { "verified" } else { "ignored" };
                    eprintln!("{name:<40} {mode:<9} {}", o.short());
                    tallies[i].add(o);
                    if let Some(bug) = o.bug() {
                        failures.push(format!("{name} (checksums {mode}): {bug}"));
                    }
                }
            }
            Err(e) => {
                eprintln!("{name:<40} {e}");
                failures.push(format!("{name}: {e}"));
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    eprintln!("\n{} images; slowest {} in {:?}", images.len(), slowest.1, slowest.0);
    eprintln!("{:<20} {:>8} {:>12} {:>13} {:>12}", "checksums", "clean", "walk errors", "open corrupt", "unsupported");
    for (i, t) in tallies.iter().enumerate() {
        eprintln!(
            "{:<20} {:>8} {:>12} {:>13} {:>12}",
            if i == 0 { "verified" } else { "ignored" },
            t.opened_clean,
            t.opened_with_errors,
            t.open_corrupt,
            t.open_unsupported
        );
    }
    if let Some(peak) = peak_rss_mib() {
        eprintln!("peak RSS {peak} MiB");
        assert!(peak < PEAK_RSS_LIMIT_MIB, "peak memory {peak} MiB");
    }
    assert!(failures.is_empty(), "{} corpus failures:\n{}", failures.len(), failures.join("\n"));
}

// ---------------------------------------------------------------------------
// Systematic damage: bytes flipped in every kind of metadata block

/// Flips tried per kind of metadata block, per shape and checksum mode.
const FLIPS_PER_KIND: usize = 150;

/// Words one of which an error about damage to `kind` should contain.
fn words_for(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Superblock => &["superblock", "magic"],
        Kind::GroupDescriptors => &["group descriptor"],
        Kind::InodeTable => &["inode checksum", "inode", "i_extra_isize"],
        Kind::ExtentIndex | Kind::ExtentLeaf => &["extent"],
        Kind::DirLeaf => &["directory"],
        Kind::HtreeRoot | Kind::HtreeNode => &["htree", "directory"],
        Kind::XattrBlock => &["xattr"],
        Kind::IndirectBlock | Kind::JournalSuperblock => &[],
    }
}

/// Whether damage to `kind` must be caught, given the image's checksum features.
fn must_detect(kind: Kind, metadata_csum: bool, gdt_csum: bool) -> bool {
    match kind {
        Kind::GroupDescriptors => metadata_csum || gdt_csum,
        Kind::IndirectBlock | Kind::JournalSuperblock => false,
        _ => metadata_csum,
    }
}

/// A byte offset inside `meta`'s ranges (relative to its block), chosen by `rng`.
fn pick_offset(meta: &Meta, rng: &mut Rng) -> usize {
    let total: usize = meta.ranges.iter().map(|(a, b)| b - a).sum();
    let mut r = rng.below(total as u64) as usize;
    for &(a, b) in &meta.ranges {
        if r < b - a {
            return a + r;
        }
        r -= b - a;
    }
    unreachable!()
}

fn flip_metadata(shape: Shape) {
    if !require_e2fsprogs() {
        return;
    }
    let base = fixture(shape);
    let budget = trial_budget();
    for ignore in [false, true] {
        let clean = try_image(base.clone(), ignore, &budget, TRIAL_LIMIT).unwrap();
        assert!(
            clean.is_clean(),
            "{} (ignore_checksums {ignore}) is not clean to start with: {}",
            shape.name(),
            clean.short()
        );
    }
    let map = metadata_map(&base);
    let ro_compat = uext4::format::bytes::le32(&base, 1024 + 0x64);
    let (metadata_csum, gdt_csum) = (ro_compat & 0x400 != 0, ro_compat & 0x10 != 0);
    let bs = block_size_of(&base);
    let mut rng = Rng::new(0xF11B + shape as u64);
    let mut failures = Vec::new();
    eprintln!("{}: {:<18} {:>6} {:>7} {:>9} {:>9}", shape.name(), "kind", "blocks", "trials", "detected", "must");
    let mut kinds: Vec<Kind> = map.iter().map(|m| m.kind).collect();
    kinds.sort();
    kinds.dedup();
    for kind in kinds {
        let blocks: Vec<&Meta> = map.iter().filter(|m| m.kind == kind && !m.ranges.is_empty()).collect();
        if blocks.is_empty() {
            continue;
        }
        let must = must_detect(kind, metadata_csum, gdt_csum);
        let (mut trials, mut detected) = (0, 0);
        for i in 0..FLIPS_PER_KIND {
            let meta = blocks[i % blocks.len()];
            let off = pick_offset(meta, &mut rng);
            // Half the flips invert the byte, half set a random nonzero pattern.
            let x = if i % 2 == 0 { 0xFF } else { rng.below(255) as u8 + 1 };
            let at = meta.block as usize * bs + off;
            let mut img = base.clone();
            img[at] ^= x;
            if kind == Kind::JournalSuperblock {
                // The journal is read only when it needs recovery: say it does.
                img[1024 + 0x60] |= 0x4;
                fix_superblock_csum(&mut img);
            }
            // Clearing ro_compat bits may switch metadata_csum off: no checksum then.
            let exempt = kind == Kind::Superblock && (0x64..0x68).contains(&(at - 1024));
            for ignore in [false, true] {
                let what = format!(
                    "{} {kind:?} block {} byte {off} ^= {x:#04x}, ignore_checksums {ignore}",
                    shape.name(),
                    meta.block
                );
                let o = match try_image(img.clone(), ignore, &budget, TRIAL_LIMIT) {
                    Ok(o) => o,
                    Err(e) => {
                        failures.push(format!("{what}: {e}"));
                        continue;
                    }
                };
                if let Some(bug) = o.bug() {
                    failures.push(format!("{what}: {bug}"));
                }
                if ignore {
                    continue;
                }
                trials += 1;
                if !o.is_clean() {
                    detected += 1;
                }
                if must && !exempt {
                    let named = words_for(kind).iter().any(|w| o.mentions(&[w])) || o.mentions(&["checksum"]);
                    if o.is_clean() {
                        failures.push(format!("{what}: damage not detected"));
                    } else if !named && !matches!(o, Outcome::OpenUnsupported(_)) {
                        failures.push(format!("{what}: error does not name the damage: {}", o.short()));
                    }
                }
            }
        }
        eprintln!(
            "{}: {:<18} {:>6} {:>7} {:>9} {:>9}",
            shape.name(),
            format!("{kind:?}"),
            blocks.len(),
            trials,
            detected,
            must
        );
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn flipped_metadata_bytes_csum_image() {
    flip_metadata(Shape::Csum);
}

#[test]
fn flipped_metadata_bytes_inline_data_image() {
    flip_metadata(Shape::InlineData);
}

#[test]
fn flipped_metadata_bytes_indirect_map_image() {
    flip_metadata(Shape::NoExtent);
}

#[test]
fn flipped_metadata_bytes_no_csum_image() {
    flip_metadata(Shape::NoCsum);
}

// ---------------------------------------------------------------------------
// Targeted damage

/// Opens and walks `image` in both checksum modes; returns the verified outcome.
/// Any panic, hang or error of the wrong kind fails the test.
fn both_modes(what: &str, image: &[u8]) -> (Outcome, Outcome) {
    let run = |ignore: bool| {
        let o = try_image(image.to_vec(), ignore, &trial_budget(), TRIAL_LIMIT)
            .unwrap_or_else(|e| panic!("{what} (ignore_checksums {ignore}): {e}"));
        if let Some(bug) = o.bug() {
            panic!("{what} (ignore_checksums {ignore}): {bug}");
        }
        eprintln!("{what} (ignore_checksums {ignore}): {}", o.short());
        o
    };
    (run(false), run(true))
}

fn assert_corrupt_mentioning(what: &str, o: &Outcome, words: &[&str]) {
    assert!(!o.is_clean(), "{what}: damage not detected: {}", o.short());
    assert!(
        o.mentions(words) && !matches!(o, Outcome::OpenOther(_)),
        "{what}: expected an error mentioning {words:?}, got {:?}",
        o.messages()
    );
}

#[test]
fn truncated_images_are_corrupt_and_say_so() {
    if !require_e2fsprogs() {
        return;
    }
    for shape in [Shape::Csum, Shape::NoExtent] {
        let base = fixture(shape);
        let bs = block_size_of(&base);
        let len = base.len();
        for cut in [0, 100, 1024, 1500, 2047, 2048, 3 * bs, 64 * bs, len / 4, len / 2, len - bs, len - 1] {
            let what = format!("{} cut to {cut} bytes", shape.name());
            let (v, i) = both_modes(&what, &base[..cut]);
            for o in [v, i] {
                assert!(matches!(o, Outcome::OpenCorrupt(_)), "{what}: {}", o.short());
                assert_corrupt_mentioning(&what, &o, &["truncated"]);
            }
        }
    }
}

/// The extent index block of /sparse (a depth-2 tree) and the inode's seed.
fn sparse_index(image: &[u8]) -> (u32, u64, u32) {
    let ino = ino_of(image, "/sparse");
    let map = metadata_map(image);
    let m = map
        .iter()
        .find(|m| m.kind == Kind::ExtentIndex && m.ino == Some(ino))
        .expect("/sparse has an extent index block");
    (ino, m.block, inode_seed(image, ino))
}

#[test]
fn looping_extent_trees_are_corrupt() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::bytes::put_le32;
    use uext4::format::extent::set_block_checksum;
    let base = fixture(Shape::Csum);
    let (ino, idx, seed) = sparse_index(&base);
    // The index block's first entry points back at the index block itself.
    let mut img = base.clone();
    {
        let b = block_mut(&mut img, idx);
        put_le32(b, 12 + 4, idx as u32);
        set_block_checksum(b, seed);
    }
    let (v, i) = both_modes("extent index pointing at itself", &img);
    for o in [&v, &i] {
        assert_corrupt_mentioning("extent index pointing at itself", o, &["extent", "depth"]);
    }
    // ...and also claims the depth of its parent, so the loop looks consistent
    // from above: the depth must still go down at every step.
    {
        let b = block_mut(&mut img, idx);
        b[6] = 2;
        set_block_checksum(b, seed);
    }
    let (v, i) = both_modes("extent index pointing at itself at its parent's depth", &img);
    for o in [&v, &i] {
        assert_corrupt_mentioning("extent loop at the parent's depth", o, &["extent", "depth"]);
    }
    // The root (in the inode) pointing at a leaf while claiming two levels below it.
    let mut img = base.clone();
    let leaf = metadata_map(&base).iter().find(|m| m.kind == Kind::ExtentLeaf && m.ino == Some(ino)).unwrap().block;
    edit_inode(&mut img, ino, |slot| put_le32(slot, 0x28 + 12 + 4, leaf as u32));
    let (v, _) = both_modes("extent root skipping a level", &img);
    assert_corrupt_mentioning("extent root skipping a level", &v, &["extent", "depth"]);
}

#[test]
fn a_size_past_the_largest_file_is_corrupt() {
    if !require_e2fsprogs() {
        return;
    }
    // As the kernel's ext4_iget ("bad i_size value"): a walk to such a size
    // (copy-out's SEEK_DATA) never ended before.
    for shape in [Shape::Csum, Shape::NoCsum] {
        let base = fixture(shape);
        let ino = ino_of(&base, "/medium");
        let what = format!("{} i_size of 2^48 - 1", shape.name());
        let mut img = base.clone();
        edit_inode(&mut img, ino, |s| {
            s[0x04..0x08].copy_from_slice(&u32::MAX.to_le_bytes());
            s[0x6c..0x70].copy_from_slice(&0xffffu32.to_le_bytes());
        });
        let (v, i) = both_modes(&what, &img);
        assert_corrupt_mentioning(&what, &i, &["past the largest file size"]);
        // With checksums verified the edit may be caught as a checksum first.
        assert!(!v.is_clean(), "{what}: not detected");
    }
}

/// A root that is not a directory refuses the open, as the kernel refuses the
/// mount ("corrupt root inode"); before, `ls IMG:/` printed an empty line and
/// the mount came up with an unreadable root.
#[test]
fn a_root_that_is_not_a_directory_refuses_the_open() {
    if !require_e2fsprogs() {
        return;
    }
    for shape in [Shape::Csum, Shape::NoCsum] {
        let mut img = fixture(shape);
        let what = format!("{} root made a regular file", shape.name());
        edit_inode(&mut img, 2, |s| s[0..2].copy_from_slice(&0o100644u16.to_le_bytes()));
        let (_, i) = both_modes(&what, &img);
        assert_corrupt_mentioning(&what, &i, &["root is not a directory"]);
    }
}

#[test]
fn extents_past_the_end_are_corrupt() {
    if !require_e2fsprogs() {
        return;
    }
    for shape in [Shape::Csum, Shape::NoCsum] {
        let base = fixture(shape);
        let ino = ino_of(&base, "/medium");
        let blocks = (base.len() / block_size_of(&base)) as u32;
        // /medium is one contiguous extent in the inode: entry 0 of the root.
        let start = 0x28 + 12;
        // (case, byte offset in the inode, value, width in bytes)
        let cases = [
            ("starting past the end", start + 8, blocks + 5, 4),
            ("running past the end", start + 8, blocks - 3, 4),
            ("with a huge high start", start + 6, 0xFFFF, 2),
            ("starting at block 0", start + 8, 0, 4),
        ];
        for (name, at, value, width) in cases {
            let what = format!("{} extent {name}", shape.name());
            let mut img = base.clone();
            edit_inode(&mut img, ino, |s| s[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]));
            let (v, i) = both_modes(&what, &img);
            if name != "starting at block 0" || block_size_of(&base) == 1024 {
                for o in [&v, &i] {
                    assert_corrupt_mentioning(&what, o, &["outside the filesystem"]);
                }
            }
        }
    }
}

#[test]
fn broken_directory_entries_are_corrupt() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::bytes::put_le16;
    use uext4::format::dirent::set_tail;
    let base = fixture(Shape::Csum);
    let bs = block_size_of(&base);
    let dir = ino_of(&base, "/a");
    let seed = inode_seed(&base, dir);
    let block = metadata_map(&base).iter().find(|m| m.kind == Kind::DirLeaf && m.ino == Some(dir)).unwrap().block;
    // "." is 12 bytes; ".." follows at offset 12, then "b".
    let cases: [(&str, usize, u16, &[&str]); 5] = [
        ("rec_len running past the block", 12, (2 * bs) as u16, &["rec_len", "past the end"]),
        ("rec_len of zero", 12, 0, &["rec_len", "smaller"]),
        ("rec_len not a multiple of 4", 12, 14, &["rec_len", "multiple of 4"]),
        ("rec_len too small for the name", 0, 8, &["rec_len"]),
        ("last rec_len 4 past the block", 24, (bs - 24 + 4) as u16, &["rec_len", "past the end"]),
    ];
    for (name, off, rec_len, words) in cases {
        let mut img = base.clone();
        let b = block_mut(&mut img, block);
        put_le16(b, off + 4, rec_len);
        set_tail(b, seed);
        let (v, i) = both_modes(name, &img);
        for o in [&v, &i] {
            assert_corrupt_mentioning(name, o, words);
        }
    }
    // A name longer than its entry ("..", 12 bytes), and an entry naming an inode past the count.
    let mut img = base.clone();
    let b = block_mut(&mut img, block);
    b[12 + 6] = 5;
    set_tail(b, seed);
    let (v, _) = both_modes("name_len past its entry", &img);
    assert_corrupt_mentioning("name_len past its entry", &v, &["rec_len", "name"]);
    let mut img = base.clone();
    let b = block_mut(&mut img, block);
    b[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    set_tail(b, seed);
    let (v, _) = both_modes("entry naming inode 2^32-1", &img);
    assert_corrupt_mentioning("entry naming inode 2^32-1", &v, &["inode", "beyond"]);
}

/// Edits superblock fields with `f` (raw bytes 1024..2048) and fixes the checksum.
fn with_superblock(base: &[u8], f: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut img = base.to_vec();
    f(&mut img[1024..2048]);
    fix_superblock_csum(&mut img);
    img
}

#[test]
fn absurd_superblock_counts_are_corrupt_without_huge_allocations() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::bytes::put_le32;
    let base = fixture(Shape::Csum);
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        ("s_inodes_count 2^32-1", with_superblock(&base, |s| put_le32(s, 0x0, u32::MAX)), &["inode count"]),
        ("s_blocks_count 2^32-1", with_superblock(&base, |s| put_le32(s, 0x4, u32::MAX)), &["superblock"]),
        ("s_blocks_count 2^48 (64bit)", with_superblock(&base, |s| put_le32(s, 0x150, 0xFFFF)), &["superblock"]),
        ("s_inodes_per_group 2^32-1", with_superblock(&base, |s| put_le32(s, 0x28, u32::MAX)), &["inodes per group"]),
        ("s_inodes_per_group 0", with_superblock(&base, |s| put_le32(s, 0x28, 0)), &["inodes per group"]),
        ("s_blocks_per_group 0", with_superblock(&base, |s| put_le32(s, 0x20, 0)), &["per group"]),
        (
            // One block per group: 6144 groups, whose descriptors run into garbage.
            "s_blocks_per_group 1",
            with_superblock(&base, |s| {
                put_le32(s, 0x20, 1);
                put_le32(s, 0x24, 1);
                put_le32(s, 0x28, 1);
                put_le32(s, 0x0, 6143);
            }),
            &["group"],
        ),
        ("s_log_block_size 40", with_superblock(&base, |s| put_le32(s, 0x18, 40)), &["block size"]),
        (
            "s_inode_size 4",
            with_superblock(&base, |s| s[0x58..0x5A].copy_from_slice(&4u16.to_le_bytes())),
            &["inode size"],
        ),
        (
            "s_desc_size 3",
            with_superblock(&base, |s| s[0xFE..0x100].copy_from_slice(&3u16.to_le_bytes())),
            &["descriptor size"],
        ),
        (
            // Blocks times block size overflows 64 bits: 2^32-1 groups of 2^19 64 KiB blocks.
            "byte size overflowing 64 bits",
            with_superblock(&base, |s| {
                put_le32(s, 0x18, 6);
                put_le32(s, 0x1C, 6);
                put_le32(s, 0x14, 0);
                put_le32(s, 0x20, 1 << 19);
                put_le32(s, 0x24, 1 << 19);
                put_le32(s, 0x28, 1);
                put_le32(s, 0x0, u32::MAX);
                put_le32(s, 0x4, 0xFFF8_0000);
                put_le32(s, 0x150, 0x0007_FFFF);
            }),
            &["truncated"],
        ),
    ];
    for (what, img, words) in cases {
        let start = Instant::now();
        let (v, i) = both_modes(what, &img);
        assert!(start.elapsed() < Duration::from_secs(5), "{what} took {:?}", start.elapsed());
        for o in [&v, &i] {
            assert_corrupt_mentioning(what, o, words);
        }
    }
}

#[test]
fn absurd_inode_and_node_counts_are_corrupt_without_huge_allocations() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::bytes::{put_le16, put_le32};
    use uext4::format::extent::set_block_checksum;
    let base = fixture(Shape::Csum);
    let medium = ino_of(&base, "/medium");
    let deep = ino_of(&base, "/deep");
    let a = ino_of(&base, "/a");
    // /attrs has xattrs only where the host has setfattr.
    let attrs = Filesystem::open_device(Arc::new(MemDevice::new(base.clone())), opts(true))
        .unwrap()
        .lookup_path(b"/attrs")
        .ok();
    let (_, idx, seed) = sparse_index(&base);
    let mut cases: Vec<(String, Vec<u8>, Vec<&str>)> = Vec::new();
    let mut edit = |what: &str, ino: u32, words: Vec<&'static str>, f: &dyn Fn(&mut [u8])| {
        let mut img = base.clone();
        edit_inode(&mut img, ino, f);
        cases.push((what.to_string(), img, words));
    };
    edit("root eh_entries > eh_max", medium, vec!["extent", "entries"], &|s| put_le16(s, 0x28 + 2, 5));
    edit("root eh_max beyond i_block", medium, vec!["extent", "max"], &|s| put_le16(s, 0x28 + 4, 200));
    edit("root eh_depth 40", medium, vec!["extent", "depth"], &|s| put_le16(s, 0x28 + 6, 40));
    // Directory sizes: 2^40 bytes, and 2^40 + 1 (not a whole number of blocks).
    for (dir, name) in [(a, "small"), (deep, "htree")] {
        edit(&format!("{name} directory of 2^40 bytes"), dir, vec!["directory"], &|s| {
            put_le32(s, 0x4, 0);
            put_le32(s, 0x6C, 1 << 8);
        });
        edit(&format!("{name} directory of 2^40+1 bytes"), dir, vec!["directory", "size"], &|s| {
            put_le32(s, 0x4, 1);
            put_le32(s, 0x6C, 1 << 8);
        });
    }
    // A regular file of 2^63 bytes, mostly holes: reads must stay bounded.
    edit("file of 2^63 bytes", medium, vec![], &|s| put_le32(s, 0x6C, 1 << 31));
    edit("symlink of 2^32+3 bytes", ino_of(&base, "/long-link"), vec!["symlink"], &|s| put_le32(s, 0x6C, 1));
    edit("xattr block pointer past the end", medium, vec!["xattr", "outside"], &|s| put_le32(s, 0x68, 0xFFFF_0000));
    if let Some(attrs) = attrs {
        // The first in-inode xattr (after the 128 + i_extra_isize bytes and the
        // magic) claims a 4 GiB value.
        edit("in-inode e_value_size 2^32-1", attrs, vec!["xattr", "value"], &|s| {
            let first = 128 + u16::from_le_bytes([s[0x80], s[0x81]]) as usize + 4;
            put_le32(s, first + 8, u32::MAX);
        });
    }
    // Extent index block whose eh_entries exceeds eh_max.
    let mut img = base.clone();
    {
        let b = block_mut(&mut img, idx);
        put_le16(b, 2, 0xFFFF);
        set_block_checksum(b, seed);
    }
    cases.push(("index block eh_entries 65535".into(), img, vec!["extent", "entries"]));
    // An xattr block entry whose value claims 4 GiB.
    let xb = metadata_map(&base).iter().find(|m| m.kind == Kind::XattrBlock).map(|m| m.block);
    if let Some(xb) = xb {
        let mut img = base.clone();
        let b = block_mut(&mut img, xb);
        put_le32(b, 32 + 8, u32::MAX);
        uext4::format::xattr::set_block_checksum(b, xb, uext4_fs_seed(&base));
        cases.push(("xattr e_value_size 2^32-1".into(), img, vec!["xattr", "value"]));
    }
    for (what, img, words) in cases {
        let start = Instant::now();
        let (v, i) = both_modes(&what, &img);
        assert!(start.elapsed() < Duration::from_secs(8), "{what} took {:?}", start.elapsed());
        if !words.is_empty() {
            for o in [&v, &i] {
                assert_corrupt_mentioning(&what, o, &words);
            }
        }
    }
}

fn uext4_fs_seed(image: &[u8]) -> u32 {
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(image.to_vec())), opts(true)).unwrap();
    fs.geometry().csum_seed
}

#[test]
fn directory_loops_end_walks_quickly() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::dirent::{set_tail, DirEntryIter};
    let base = fixture(Shape::Csum);
    let bs = block_size_of(&base);
    let a = ino_of(&base, "/a");
    // Two entries of /a/b/c/d point back at /a, two of /big at the root: every
    // pass round a loop doubles the paths a naive walk would follow.
    let map = metadata_map(&base);
    let mut img = base.clone();
    for (dir, target, count) in [("/a/b/c/d", a, 1), ("/big", 2, 2), ("/a/b", a, 1)] {
        let ino = ino_of(&base, dir);
        let seed = inode_seed(&base, ino);
        let mut left = count;
        for m in map.iter().filter(|m| m.kind == Kind::DirLeaf && m.ino == Some(ino)) {
            let b = block_mut(&mut img, m.block);
            let offsets: Vec<usize> = DirEntryIter::new(b, bs, true, u32::MAX, "test")
                .filter_map(|e| e.ok())
                .filter(|e| e.inode != 0 && e.name != b"." && e.name != b"..")
                .map(|e| e.offset)
                .take(left)
                .collect();
            for off in &offsets {
                b[*off..*off + 4].copy_from_slice(&target.to_le_bytes());
                b[*off + 7] = 2; // file type: directory
            }
            set_tail(b, seed);
            left -= offsets.len();
            if left == 0 {
                break;
            }
        }
    }
    let (v, i) = both_modes("directory loops", &img);
    for o in [&v, &i] {
        assert!(o.mentions(&["directory", "loop"]), "{}", o.short());
    }
    // The public walk on its own must end, with an error naming the loop.
    let done = bounded(TRIAL_LIMIT, move || {
        let fs = Filesystem::open_device(Arc::new(MemDevice::new(img)), opts(false)).unwrap();
        let mut n = 0u64;
        let r = fs.walk(uext4::ROOT_INO, &mut |_, _| {
            n += 1;
            Ok(())
        });
        (r.map_err(|e| e.to_string()), n)
    })
    .unwrap_or_else(|e| panic!("walk of a looping tree: {e}"));
    eprintln!("walk of a looping tree: {:?} after {} entries", done.0, done.1);
    let err = done.0.expect_err("a looping tree is corrupt");
    assert!(err.contains("directory") && err.contains("loop"), "{err}");
    assert!(done.1 < 20_000, "the walk followed the loop {} times", done.1);
}

#[test]
fn directory_larger_than_the_filesystem_is_corrupt_quickly() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::dirent::set_tail;
    use uext4::format::extent::{set_block_checksum, Extent, ExtentHeader, ExtentIndex, ExtentNode, EXT4_EXT_MAGIC};
    let mut img = fixture(Shape::Csum);
    let bs = block_size_of(&img);
    let dir = ino_of(&img, "/a");
    let seed = inode_seed(&img, dir);
    // The journal's blocks (not needed: nothing to recover) become valid empty
    // directory blocks, mapped again and again by a two-level extent tree: a
    // directory of millions of blocks in a 6 MiB image.
    let (jstart, jlen) = {
        let fs = Filesystem::open_device(Arc::new(MemDevice::new(img.clone())), opts(true)).unwrap();
        let j = fs.superblock().s_journal_inum;
        let inode = fs.inode(j).unwrap();
        // Its longest contiguous run.
        fs.file_mappings(j, &inode)
            .unwrap()
            .into_iter()
            .filter_map(|m| match m.kind {
                uext4::extent::MapKind::Mapped(p) => Some((p, m.len)),
                _ => None,
            })
            .max_by_key(|&(_, len)| len)
            .unwrap()
    };
    let per = uext4::format::extent::max_entries_in_block(bs);
    let data = jlen - per as u64 - 2;
    assert!(data > 100, "journal of {jlen} blocks is too small");
    for b in jstart..jstart + data {
        let blk = block_mut(&mut img, b);
        blk.fill(0);
        blk[4..6].copy_from_slice(&((bs - 12) as u16).to_le_bytes());
        set_tail(blk, seed);
    }
    let header = |entries: u16, max: u16, depth: u16| ExtentHeader {
        eh_magic: EXT4_EXT_MAGIC,
        eh_entries: entries,
        eh_max: max,
        eh_depth: depth,
        eh_generation: 0,
    };
    let index_block = jstart + data;
    let leaf0 = index_block + 1;
    let mut index = Vec::new();
    for i in 0..per as u64 {
        let leaf = leaf0 + i;
        let extents = (0..per as u64)
            .map(|j| Extent {
                ee_block: ((i * per as u64 + j) * data) as u32,
                len: data as u32,
                unwritten: false,
                start: jstart,
            })
            .collect();
        let blk = block_mut(&mut img, leaf);
        blk.fill(0);
        ExtentNode::Leaf(header(per, per, 0), extents).write(blk);
        set_block_checksum(blk, seed);
        index.push(ExtentIndex { ei_block: (i * per as u64 * data) as u32, leaf });
    }
    let blk = block_mut(&mut img, index_block);
    blk.fill(0);
    ExtentNode::Index(header(per, per, 1), index).write(blk);
    set_block_checksum(blk, seed);
    let size = per as u64 * per as u64 * data * bs as u64;
    edit_inode(&mut img, dir, |s| {
        let mut root = [0u8; 60];
        ExtentNode::Index(header(1, 4, 2), vec![ExtentIndex { ei_block: 0, leaf: index_block }]).write(&mut root);
        s[0x28..0x64].copy_from_slice(&root);
        s[0x4..0x8].copy_from_slice(&(size as u32).to_le_bytes());
        s[0x6C..0x70].copy_from_slice(&((size >> 32) as u32).to_le_bytes());
    });
    let start = Instant::now();
    let (v, i) = both_modes(&format!("directory of {} blocks", size / bs as u64), &img);
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    for o in [&v, &i] {
        assert_corrupt_mentioning("huge directory", o, &["directory", "size"]);
    }
}

#[test]
fn reads_past_inline_data_never_panic() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::bytes::put_le32;
    let base = fixture(Shape::InlineData);
    let small = ino_of(&base, "/small");
    let mut img = base.clone();
    // A 10-byte inline file that claims 100000 bytes: the kernel makes such
    // files (truncated up before their first write) and e2fsck accepts them;
    // past the stored bytes they read as zeros.
    edit_inode(&mut img, small, |s| put_le32(s, 0x4, 100_000));
    let (v, _) = both_modes("inline file longer than its data", &img);
    assert!(v.bug().is_none());
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(img)), opts(false)).unwrap();
    let mut buf = [0u8; 64];
    for off in [0u64, 50, 59, 60, 61, 500, 99_990, 100_000, 1 << 40] {
        let n = fs.read(small, off, &mut buf).unwrap_or_else(|e| panic!("read at {off}: {e}"));
        assert_eq!(n as u64, 64.min(100_000u64.saturating_sub(off)), "read at {off}");
    }
    assert_eq!(fs.read_all(small).unwrap().len(), 100_000);
}

/// The offset in an inode slot of its in-body `system.data` entry.
fn system_data_entry(slot: &[u8]) -> usize {
    use uext4::format::bytes::le16;
    let mut e = 128 + le16(slot, 0x80) as usize + 4;
    while slot[e..e + 4] != [0; 4] {
        let name_len = slot[e] as usize;
        if slot[e + 1] == 7 && &slot[e + 16..e + 16 + name_len] == b"data" {
            return e;
        }
        e += (16 + name_len + 3) & !3;
    }
    panic!("no system.data entry")
}

/// Hostile inline inodes (issue 19): a system.data value longer than the inode
/// body (file and directory), directory
/// entries running past the end of their run, a directory size that is not its
/// inline size, the inline flag without system.data. Each gives Corrupt when read
/// and when changed, never a panic, and a refused change adds nothing e2fsck sees.
#[test]
fn hostile_inline_inodes_are_corrupt() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::bytes::{put_le16, put_le32};
    let base = fixture(Shape::InlineData);
    let file = ino_of(&base, "/inline-size");
    let dir = ino_of(&base, "/a/b/c/d");
    {
        let fs = Filesystem::open_device(Arc::new(MemDevice::new(base.clone())), opts(false)).unwrap();
        for ino in [file, dir] {
            assert_ne!(fs.stat(ino).unwrap().flags & EXT4_INLINE_DATA_FL, 0, "inode {ino} is not inline");
        }
    }
    type Edit = Box<dyn Fn(&mut [u8])>;
    let cases: Vec<(&str, u32, Edit)> = vec![
        (
            "file system.data longer than the body",
            file,
            Box::new(|s| {
                let e = system_data_entry(s);
                put_le32(s, e + 8, 400);
            }),
        ),
        (
            "directory system.data longer than the body",
            dir,
            Box::new(|s| {
                let e = system_data_entry(s);
                put_le16(s, e + 2, 20);
                put_le32(s, e + 8, 300);
            }),
        ),
        ("directory entry running past i_block", dir, Box::new(|s| put_le16(s, 0x28 + 4 + 4, 100))),
        ("directory size not its inline size", dir, Box::new(|s| put_le32(s, 0x4, 100))),
        ("directory size past the capacity", dir, Box::new(|s| put_le32(s, 0x4, 4096))),
        (
            "inline flag without system.data",
            file,
            Box::new(|s| {
                let e = system_data_entry(s);
                s[e + 1] = 1; // now user.data
            }),
        ),
        (
            "inline directory without system.data",
            dir,
            Box::new(|s| {
                let e = system_data_entry(s);
                s[e + 1] = 1;
            }),
        ),
    ];
    for (what, ino, edit) in cases {
        let mut img = base.clone();
        edit_inode(&mut img, ino, |s| edit(s));
        let (v, w) = both_modes(what, &img);
        assert!(v.bug().is_none() && w.bug().is_none(), "{what}: {}", v.short());
        let fs = Filesystem::open_device(Arc::new(MemDevice::new(img.clone())), opts(false)).unwrap();
        let read = if ino == file { fs.read_all(ino).map(|_| ()) } else { fs.read_dir(ino).map(|_| ()) };
        assert!(is_corrupt_mentioning(&read, &[]), "{what}: reading gave {read:?}");
        drop(fs);
        if ino == file {
            let path = "/inline-size";
            assert_write_refused(what, &img, &[], &|fs| {
                fs.write(fs.lookup_path(path.as_bytes())?, 0, b"x").map(|_| ())
            });
            assert_write_refused(what, &img, &[], &|fs| {
                fs.write(fs.lookup_path(path.as_bytes())?, 120, b"xyzxyz").map(|_| ())
            });
            assert_write_refused(what, &img, &[], &|fs| {
                fs.setattr(fs.lookup_path(path.as_bytes())?, &uext4::SetAttr { size: Some(3), ..Default::default() })
                    .map(|_| ())
            });
        } else {
            assert_write_refused(what, &img, &[], &|fs| {
                fs.create(fs.lookup_path(b"/a/b/c/d")?, b"new", 0o644, ROOT_OWNER).map(|_| ())
            });
            assert_write_refused(what, &img, &[], &|fs| fs.unlink(fs.lookup_path(b"/a/b/c/d")?, b"leaf"));
            assert_write_refused(what, &img, &[], &|fs| {
                fs.rename(ROOT_INO, b"small", fs.lookup_path(b"/a/b/c/d")?, b"moved", 0)
            });
        }
    }
}

// ---------------------------------------------------------------------------
// Mini fuzz: the cargo-fuzz target's routine over seeded random mutations

/// The number in environment variable `name`, or `default`.
fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Mutated images tried (override with UEXT4_MINI_FUZZ_CASES).
const MINI_FUZZ_CASES: u64 = 5_000;

#[test]
fn mini_fuzz_seeded_mutations() {
    if !require_e2fsprogs() {
        return;
    }
    let cases = env_u64("UEXT4_MINI_FUZZ_CASES", MINI_FUZZ_CASES);
    let seeds = small_fixtures();
    let maps: Vec<Vec<Meta>> = seeds.iter().map(|(_, img)| metadata_map(img)).collect();
    let mut rng = Rng::new(0x5EED_F022);
    let mut tallies = [Tally::default(), Tally::default()];
    let mut failures = Vec::new();
    let start = Instant::now();
    for case in 0..cases {
        let which = rng.below(seeds.len() as u64) as usize;
        let (shape, seed) = &seeds[which];
        let bs = block_size_of(seed);
        // 1 to 8 edits, most of them aimed at the bytes of a metadata block.
        let mut data = Vec::new();
        for _ in 0..1 + rng.below(8) {
            let off = if rng.below(10) < 8 {
                let m = &maps[which][rng.below(maps[which].len() as u64) as usize];
                m.block as usize * bs + pick_offset(m, &mut rng)
            } else {
                rng.below(seed.len() as u64) as usize
            };
            data.extend_from_slice(&(off as u32).to_le_bytes());
            data.push(rng.next() as u8);
            data.push(rng.next() as u8);
        }
        let img = fuzzing::mutate(seed, &data);
        let result = bounded(TRIAL_LIMIT, move || {
            [false, true]
                .map(|ignore| Outcome::of(fuzzing::open_and_walk_bytes(img.clone(), opts(ignore), &Budget::fuzz())))
        });
        let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
        match result {
            Ok(outcomes) => {
                for (i, o) in outcomes.iter().enumerate() {
                    tallies[i].add(o);
                    if let Some(bug) = o.bug() {
                        failures.push(format!(
                            "case {case} ({} seed, edits {hex}), ignore_checksums {}: {bug}",
                            shape.name(),
                            i == 1
                        ));
                    }
                }
            }
            Err(e) => failures.push(format!("case {case} ({} seed, edits {hex}): {e}", shape.name())),
        }
    }
    eprintln!("mini fuzz: {cases} mutated images in {:?}", start.elapsed());
    eprintln!("{:<20} {:>8} {:>12} {:>13} {:>12}", "checksums", "clean", "walk errors", "open corrupt", "unsupported");
    for (i, t) in tallies.iter().enumerate() {
        eprintln!(
            "{:<20} {:>8} {:>12} {:>13} {:>12}",
            if i == 0 { "verified" } else { "ignored" },
            t.opened_clean,
            t.opened_with_errors,
            t.open_corrupt,
            t.open_unsupported
        );
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn hostile_htree_indexes_are_corrupt() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::bytes::{put_le16, put_le32};
    use uext4::format::htree::set_checksum;
    let base = fixture(Shape::Csum);
    let deep = ino_of(&base, "/deep");
    let seed = inode_seed(&base, deep);
    let map = metadata_map(&base);
    let root = map.iter().find(|m| m.kind == Kind::HtreeRoot && m.ino == Some(deep)).unwrap().block;
    let name = format!("n0007-{}", "x".repeat(200));
    // dx_root: info at 0x18 (hash version +4, levels +6), then limit, count, block 0, entries.
    fn set_all_blocks(b: &mut [u8], to: u32) {
        let count = u16::from_le_bytes([b[0x22], b[0x23]]) as usize;
        for i in 0..count {
            put_le32(b, 0x24 + 8 * i, to);
        }
    }
    type Edit<'a> = &'a dyn Fn(&mut [u8]);
    let cases: [(&str, Edit, &[&str]); 5] = [
        ("three indirect levels without largedir", &|b| b[0x18 + 6] = 3, &["htree", "levels"]),
        ("hash version 99", &|b| b[0x18 + 4] = 99, &["hash version"]),
        ("count above limit", &|b| put_le16(b, 0x22, 200), &["htree", "count"]),
        // Every entry, not just one: the probed name's route depends on the random hash seed.
        ("entry past the directory", &|b| set_all_blocks(b, 1 << 20), &["htree", "points at"]),
        ("entry pointing at the root itself", &|b| set_all_blocks(b, 0), &["htree", "points at"]),
    ];
    for (what, f, words) in cases {
        let mut img = base.clone();
        let b = block_mut(&mut img, root);
        f(b);
        // The count/limit stay in place; rewrite the checksum unless they no longer fit.
        let _ = set_checksum(b, 0x20, seed);
        let (v, i) = both_modes(what, &img);
        for o in [&v, &i] {
            assert!(!o.is_clean(), "{what}: not detected");
        }
        // Lookups must say what is wrong with the index.
        let fs = Filesystem::open_device(Arc::new(MemDevice::new(img)), opts(true)).unwrap();
        let err = fs.lookup(deep, name.as_bytes()).expect_err(what);
        let msg = err.to_string();
        assert!(matches!(err, uext4::Error::Corrupt { .. }), "{what}: {msg}");
        assert!(words.iter().all(|w| msg.contains(w)), "{what}: {msg} should mention {words:?}");
    }
}

// ---------------------------------------------------------------------------
// Writes on hostile images: refused before any damage

/// Opens `image` read-write in memory; the device stays readable after the
/// filesystem is dropped (and has written back).
fn open_rw(image: &[u8]) -> (Arc<MemDevice>, uext4::Result<Filesystem>) {
    let dev = Arc::new(MemDevice::new(image.to_vec()));
    let fs = Filesystem::open_device(dev.clone(), Options { read_only: false, ..opts(false) });
    (dev, fs)
}

fn is_corrupt_mentioning(r: &uext4::Result<()>, words: &[&str]) -> bool {
    match r {
        Err(e @ uext4::Error::Corrupt { .. }) => {
            let m = e.to_string().to_lowercase();
            e.errno() == 117 && words.iter().all(|w| m.contains(&w.to_lowercase()))
        }
        _ => false,
    }
}

/// Opens `image` read-write and runs `op`: the open or the operation must be refused
/// as Corrupt (EUCLEAN) with a message holding `words`, and afterwards `e2fsck -fn`
/// must find nothing it did not find before. A refused open must not have written
/// a byte.
fn assert_write_refused(what: &str, image: &[u8], words: &[&str], op: &dyn Fn(&Filesystem) -> uext4::Result<()>) {
    let before = e2fsck_problems(image);
    let (dev, fs) = open_rw(image);
    match fs {
        Err(e) => {
            let r = Err(e);
            assert!(is_corrupt_mentioning(&r, words), "{what}: open refused with {r:?}, not Corrupt naming {words:?}");
            assert!(dev.contents() == image, "{what}: the refused open changed the image");
        }
        Ok(fs) => {
            let r = op(&fs);
            assert!(is_corrupt_mentioning(&r, words), "{what}: got {r:?}, not Corrupt naming {words:?}");
            drop(fs);
        }
    }
    let after = e2fsck_problems(&dev.contents());
    let new = new_problems(&before, &after);
    assert!(new.is_empty(), "{what}: e2fsck -fn finds new problems after the refusal: {new:?}");
}

/// Rewrites group `g`'s descriptor (with its checksum) after `f` changed it.
fn with_group_desc(base: &[u8], g: u32, f: impl FnOnce(&mut uext4::format::group_desc::GroupDesc)) -> Vec<u8> {
    let fs = Filesystem::open_device(Arc::new(MemDevice::new(base.to_vec())), opts(true)).unwrap();
    let (block, off) = Filesystem::group_desc_location(&fs.superblock(), g);
    let (ds, csum, bs) = (fs.geometry().desc_size, fs.geometry().gd_csum, fs.geometry().block_size);
    let mut gd = fs.group_desc(g).unwrap();
    drop(fs);
    f(&mut gd);
    let mut img = base.to_vec();
    let at = block as usize * bs + off;
    gd.write(&mut img[at..at + ds], ds, g, csum);
    img
}

fn lookup_in_root(fs: &Filesystem, name: &str) -> uext4::Result<u32> {
    fs.lookup(ROOT_INO, name.as_bytes())?.ok_or_else(|| uext4::Error::NotFound(name.into()))
}

fn write_at(fs: &Filesystem, name: &str, offset: u64) -> uext4::Result<()> {
    fs.write(lookup_in_root(fs, name)?, offset, b"hostile").map(|_| ())
}

fn truncate(fs: &Filesystem, name: &str, size: u64) -> uext4::Result<()> {
    fs.setattr(lookup_in_root(fs, name)?, &uext4::SetAttr { size: Some(size), ..Default::default() }).map(|_| ())
}

const ROOT_OWNER: uext4::Owner = uext4::Owner { uid: 0, gid: 0 };

#[test]
fn hostile_extent_trees_refuse_writes_before_any_damage() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::bytes::{put_le16, put_le32};
    use uext4::format::extent::set_block_checksum;
    let base = fixture(Shape::Csum);
    let (_, idx, seed) = sparse_index(&base);
    let edit_index = |f: &dyn Fn(&mut [u8])| {
        let mut img = base.clone();
        let b = block_mut(&mut img, idx);
        f(b);
        set_block_checksum(b, seed);
        img
    };
    // The case that panicked at extent/write.rs:163: an index node without entries.
    let empty_index = edit_index(&|b| put_le16(b, 2, 0));
    for (op, f) in [
        ("write", &(|fs: &Filesystem| write_at(fs, "sparse", 0)) as &dyn Fn(&Filesystem) -> uext4::Result<()>),
        ("append", &|fs| write_at(fs, "sparse", 4 << 20)),
        ("truncate", &|fs| truncate(fs, "sparse", 5000)),
        ("unlink", &|fs| fs.unlink(ROOT_INO, b"sparse")),
    ] {
        assert_write_refused(&format!("{op} through an empty index node"), &empty_index, &["extent", "no entries"], f);
    }
    // The kernel's view of the same node: it refuses the tree too (its page reads
    // turn EFSCORRUPTED into EIO).
    if oracle::require_loop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty-index.img");
        std::fs::write(&path, &empty_index).unwrap();
        let mount = oracle::Mount::new(&path, "ro");
        let err = std::fs::read(mount.dir.join("sparse")).expect_err("the kernel refuses the tree");
        assert!(matches!(err.raw_os_error(), Some(5 | 117)), "the kernel's error: {err}");
    }
    let no_max = edit_index(&|b| put_le16(b, 4, 0));
    assert_write_refused("eh_max 0", &no_max, &["extent", "eh_max 0"], &|fs| write_at(fs, "sparse", 0));
    // The index node's first key disagrees with the root's entry for it.
    let key = edit_index(&|b| put_le32(b, 12, 1));
    assert_write_refused("first key off", &key, &["extent", "indexes it"], &|fs| truncate(fs, "sparse", 5000));
    // Two index entries naming the same child: freeing the tree would free it twice.
    let twice = edit_index(&|b| {
        let first_child = uext4::format::bytes::le32(b, 12 + 4);
        put_le32(b, 24 + 4, first_child);
    });
    assert_write_refused("child named twice", &twice, &["extent"], &|fs| fs.unlink(ROOT_INO, b"sparse"));

    // /medium's first extent moved onto group 0's inode table: a write there would
    // overwrite inodes.
    let medium = ino_of(&base, "/medium");
    let itable = {
        let fs = Filesystem::open_device(Arc::new(MemDevice::new(base.clone())), opts(true)).unwrap();
        fs.group_desc(0).unwrap().bg_inode_table
    };
    let mut on_itable = base.clone();
    edit_inode(&mut on_itable, medium, |s| put_le32(s, 0x28 + 12 + 8, itable as u32));
    assert_write_refused("extent on the inode table", &on_itable, &["extent", "metadata"], &|fs| {
        write_at(fs, "medium", 0)
    });
    let mut on_superblock = base.clone();
    edit_inode(&mut on_superblock, medium, |s| put_le32(s, 0x28 + 12 + 8, 1));
    assert_write_refused("extent on the superblock", &on_superblock, &["extent", "outside"], &|fs| {
        write_at(fs, "medium", 0)
    });
    // An extent of length 0.
    let mut zero_len = base.clone();
    edit_inode(&mut zero_len, medium, |s| put_le16(s, 0x28 + 12 + 4, 0));
    assert_write_refused("extent of length 0", &zero_len, &["extent", "length 0"], &|fs| truncate(fs, "medium", 10));
}

#[test]
fn hostile_xattr_blocks_refuse_writes_before_any_damage() {
    if !require_e2fsprogs() {
        return;
    }
    // A file with an xattr block, made by uext4 itself (the host may lack setfattr).
    let mut base = fixture(Shape::Csum);
    let (ino, block, csum_seed) = {
        let (dev, fs) = open_rw(&base);
        let fs = fs.unwrap();
        let st = fs.create(ROOT_INO, b"xb", 0o644, ROOT_OWNER).unwrap();
        fs.set_xattr(st.ino, b"user.big", &[b'v'; 700], 0).unwrap();
        let block = fs.inode(st.ino).unwrap().i_file_acl;
        let seed = fs.geometry().csum_seed;
        drop(fs);
        base = dev.contents();
        (st.ino, block, seed)
    };
    assert!(block != 0, "the 700-byte value went to an xattr block");
    assert!(e2fsck_problems(&base).is_empty(), "the base image is clean");
    let mut img = base.clone();
    {
        let b = block_mut(&mut img, block);
        uext4::format::bytes::put_le32(b, 8, 2); // h_blocks: the kernel allows only 1
        uext4::format::xattr::set_block_checksum(b, block, csum_seed);
    }
    assert_write_refused("setxattr", &img, &["xattr block", "blocks"], &|fs| fs.set_xattr(ino, b"user.other", b"1", 0));
    assert_write_refused("removexattr", &img, &["xattr block", "blocks"], &|fs| fs.remove_xattr(ino, b"user.big"));
    assert_write_refused("unlink", &img, &["xattr block", "blocks"], &|fs| fs.unlink(ROOT_INO, b"xb"));
    // An xattr block pointer aimed at a block bitmap.
    let bitmap = {
        let fs = Filesystem::open_device(Arc::new(MemDevice::new(base.clone())), opts(true)).unwrap();
        fs.group_desc(1).unwrap().bg_block_bitmap
    };
    let mut on_bitmap = base.clone();
    edit_inode(&mut on_bitmap, ino, |s| uext4::format::bytes::put_le32(s, 0x68, bitmap as u32));
    assert_write_refused("xattr block on a bitmap", &on_bitmap, &["xattr block", "metadata"], &|fs| {
        fs.set_xattr(ino, b"user.other", b"1", 0)
    });
}

#[test]
fn hostile_group_descriptors_refuse_writable_opens() {
    if !require_e2fsprogs() {
        return;
    }
    let base = fixture(Shape::Csum);
    let g0 = {
        let fs = Filesystem::open_device(Arc::new(MemDevice::new(base.clone())), opts(true)).unwrap();
        fs.group_desc(0).unwrap()
    };
    let ipg = u32::from_le_bytes(base[1024 + 0x28..1024 + 0x2C].try_into().unwrap());
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        // 1 KiB blocks: the superblock is block 1, the descriptors block 2.
        (
            "block bitmap on the superblock",
            with_group_desc(&base, 1, |gd| gd.bg_block_bitmap = 1),
            vec!["block bitmap", "overlaps"],
        ),
        (
            "inode bitmap on the descriptors",
            with_group_desc(&base, 2, |gd| gd.bg_inode_bitmap = 2),
            vec!["inode bitmap", "overlaps"],
        ),
        (
            "inode table over another group's",
            with_group_desc(&base, 1, |gd| gd.bg_inode_table = g0.bg_inode_table + 1),
            vec!["inode table", "overlaps"],
        ),
        (
            "two groups share a bitmap",
            with_group_desc(&base, 2, |gd| gd.bg_block_bitmap = g0.bg_inode_bitmap),
            vec!["bitmap", "overlaps"],
        ),
        (
            "itable_unused > inodes per group",
            with_group_desc(&base, 1, |gd| gd.bg_itable_unused = ipg + 1),
            vec!["unused", "group 1"],
        ),
        (
            "more free inodes than the group has",
            with_group_desc(&base, 0, |gd| gd.bg_free_inodes_count = ipg + 5),
            vec!["free inodes", "group 0"],
        ),
        (
            "more free blocks than the group has",
            with_group_desc(&base, 2, |gd| gd.bg_free_blocks_count = 5000),
            vec!["free blocks", "group 2"],
        ),
    ];
    for (what, img, words) in &cases {
        assert_write_refused(what, img, words, &|_| Ok(()));
        // Read-only opens still work, as the kernel still mounts these read-only.
        let ro = Filesystem::open_device(Arc::new(MemDevice::new(img.clone())), opts(false));
        assert!(ro.is_ok(), "{what}: read-only open: {:?}", ro.err());
    }
    // Free counts the bitmap does not back (groups 0 and 1): as the kernel's mballoc
    // does, the allocator leaves such a group alone and allocates elsewhere; the
    // counts never underflow and nothing new is wrong.
    let overcount = (0..2).fold(base.clone(), |img, g| with_group_desc(&img, g, |gd| gd.bg_free_blocks_count += 1));
    let before = e2fsck_problems(&overcount);
    let (dev, fs) = open_rw(&overcount);
    let fs = fs.unwrap();
    for i in 0..3 {
        let d = fs.mkdir(ROOT_INO, format!("d{i}").as_bytes(), 0o755, ROOT_OWNER).unwrap();
        let f = fs.create(d.ino, b"f", 0o644, ROOT_OWNER).unwrap();
        fs.write(f.ino, 0, &[7u8; 5000]).unwrap();
    }
    let untouched = |img: &[u8], g: u32| {
        let fs = Filesystem::open_device(Arc::new(MemDevice::new(img.to_vec())), opts(true)).unwrap();
        fs.group_desc(g).unwrap().bg_free_blocks_count
    };
    drop(fs);
    let after_image = dev.contents();
    for g in 0..2 {
        assert_eq!(untouched(&after_image, g), untouched(&overcount, g), "group {g} was allocated from");
    }
    let new = new_problems(&before, &e2fsck_problems(&after_image));
    assert!(new.is_empty(), "free count above the bitmap: new problems {new:?}");
}

#[test]
fn superblock_group_count_overflow_is_corrupt() {
    if !require_e2fsprogs() {
        return;
    }
    use uext4::format::bytes::put_le32;
    // 8 blocks per group and 2^64-1 blocks: 2^61 groups, times 2^8 or more inodes
    // each, overflows 64 bits.
    let img = with_superblock(&fixture(Shape::Csum), |sb| {
        put_le32(sb, 0x4, u32::MAX);
        put_le32(sb, 0x150, u32::MAX);
        put_le32(sb, 0x20, 8);
        put_le32(sb, 0x24, 8);
    });
    for read_only in [true, false] {
        let r = Filesystem::open_device(Arc::new(MemDevice::new(img.clone())), Options { read_only, ..opts(false) });
        let r = r.map(|_| ());
        assert!(is_corrupt_mentioning(&r, &["inode count"]), "read_only {read_only}: {r:?}");
    }
}

#[test]
fn deleted_inode_named_by_a_directory_is_corrupt_and_never_freed() {
    if !require_e2fsprogs() {
        return;
    }
    let base = fixture(Shape::Csum);
    let small = ino_of(&base, "/small");
    let mut img = base.clone();
    edit_inode(&mut img, small, |s| uext4::format::bytes::put_le16(s, 0x1A, 0));
    // Read-only: refused as the kernel's lookup refuses it, and nothing written.
    let dev = Arc::new(MemDevice::new(img.clone()));
    let fs = Filesystem::open_device(dev.clone(), opts(false)).unwrap();
    for r in [fs.lookup(ROOT_INO, b"small").map(|_| ()), fs.lookup_path(b"/small").map(|_| ())] {
        assert!(is_corrupt_mentioning(&r, &["deleted inode", &small.to_string()]), "read-only lookup: {r:?}");
    }
    drop(fs);
    assert!(dev.contents() == img, "a read-only open wrote to the image");
    // The kernel's lookup gives the same errno (EUCLEAN) on a read-only mount.
    if oracle::require_loop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deleted.img");
        std::fs::write(&path, &img).unwrap();
        let mount = oracle::Mount::new(&path, "ro");
        let err = std::fs::symlink_metadata(mount.dir.join("small")).expect_err("the kernel refuses the lookup");
        assert_eq!(err.raw_os_error(), Some(117), "the kernel's errno: {err}");
        drop(mount);
        assert!(std::fs::read(&path).unwrap() == img, "the read-only mount changed the image");
    }
    // Read-write: no operation through the name may use or free the inode.
    assert_write_refused("unlink", &img, &["deleted inode"], &|fs| fs.unlink(ROOT_INO, b"small"));
    assert_write_refused("write", &img, &["deleted inode"], &|fs| write_at(fs, "small", 0));
    assert_write_refused("create over it", &img, &["deleted inode"], &|fs| {
        fs.create(ROOT_INO, b"small", 0o644, ROOT_OWNER).map(|_| ())
    });
    assert_write_refused("rename it", &img, &["deleted inode"], &|fs| {
        fs.rename(ROOT_INO, b"small", ROOT_INO, b"moved", 0)
    });
}

// ---------------------------------------------------------------------------
// Writes on the e2fsprogs corpus and on the write fuzz target's findings

/// What a writable open and the corpus write script did to one image.
enum WriteOutcome {
    /// The writable open was refused (the image is checked unchanged).
    Refused(String),
    /// Opened, but only read-only (a feature uext4 does not write).
    ReadOnly(String),
    /// The script ran; its report.
    Ran(fuzzing::ScriptReport),
}

/// Opens `image` read-write in memory and runs `script` on it, on a watchdog thread.
/// Returns the outcome and the image as left.
fn write_trial(
    image: Vec<u8>,
    limit: Duration,
    script: fn(&Filesystem) -> fuzzing::ScriptReport,
) -> Result<(WriteOutcome, Vec<u8>), String> {
    bounded(limit, move || {
        let (dev, fs) = open_rw(&image);
        let outcome = match fs {
            Err(e @ (uext4::Error::Corrupt { .. } | uext4::Error::Unsupported { .. })) => {
                WriteOutcome::Refused(e.to_string())
            }
            Err(e) => return Err(format!("writable open failed with an unexpected error kind: {e:?}")),
            Ok(fs) if fs.is_read_only() => WriteOutcome::ReadOnly(fs.read_only_reason().to_string()),
            Ok(fs) => WriteOutcome::Ran(script(&fs)),
        };
        let after = dev.contents();
        // A journal that needs recovery is replayed first, as the kernel's mount
        // does; that replay stays even if the open then refuses.
        let needs_recovery = uext4::format::bytes::le32(&image, 1024 + 0x60) & 0x4 != 0;
        let refused = matches!(outcome, WriteOutcome::Refused(_) | WriteOutcome::ReadOnly(_));
        if refused && !needs_recovery && after != image {
            return Err("a refused or read-only open changed the image".into());
        }
        Ok((outcome, after))
    })?
}

/// Time one corpus image may take for the write trial.
const CORPUS_WRITE_LIMIT: Duration = Duration::from_secs(30);
/// Time one e2fsck -fn run may take on a corpus image (it takes milliseconds, but
/// loops forever on f_illitable_flexbg, whose inode table it cannot move with -n).
const E2FSCK_LIMIT_SECS: u32 = 20;

#[test]
fn e2fsprogs_corpus_writes_never_make_an_image_worse() {
    if !require_e2fsprogs() {
        return;
    }
    let dir = corpus_dir();
    let mut images: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    images.retain(|p| {
        let n = p.file_name().unwrap().to_string_lossy();
        n.ends_with(".img.gz") || (n.ends_with(".img.bz2") && have_tool("bzip2"))
    });
    if !skip_unless(!images.is_empty(), &format!("the e2fsprogs image corpus is not at {}", dir.display())) {
        return;
    }
    images.sort();
    let tmp = tempfile::tempdir().unwrap();
    let mut tally = CorpusTally::default();
    let mut upgraded = 0;
    for src in &images {
        let path = decompress(src, tmp.path());
        let name = src.file_name().unwrap().to_string_lossy().to_string();
        let image = std::fs::read(&path).unwrap();
        judge_corpus_write(&name, image.clone(), &mut tally);
        // An ext2/ext3 image upgraded as users upgrade them: its old files stay
        // block-mapped while new ones get extents, so every write meets both
        // (issue 15: 27 of 35 such images were left worse before block maps
        // were written). tune2fs refuses some damaged images; those are skipped.
        let extents = uext4::format::bytes::le32(&image, 1024 + 0x60) & 0x40 != 0;
        let upgrade = std::process::Command::new("tune2fs").args(["-O", "extent"]).arg(&path).output();
        if !extents && upgrade.is_ok_and(|o| o.status.success()) {
            upgraded += 1;
            judge_corpus_write(&format!("{name} +extent"), std::fs::read(&path).unwrap(), &mut tally);
        }
        let _ = std::fs::remove_file(&path);
    }
    let CorpusTally { refused, read_only, clean, stopped, skipped, failures } = tally;
    eprintln!(
        "\n{} images and {upgraded} of them upgraded with tune2fs -O extent: {refused} refused, {read_only} \
         read-only, {clean} written cleanly, {stopped} stopped by an error, {skipped} skipped (e2fsck -fn does not \
         finish)",
        images.len()
    );
    assert!(upgraded >= 40, "only {upgraded} ext2/ext3 corpus images took tune2fs -O extent");
    assert!(failures.is_empty(), "{} corpus write failures:\n{}", failures.len(), failures.join("\n"));
}

#[derive(Default)]
struct CorpusTally {
    refused: usize,
    read_only: usize,
    clean: usize,
    stopped: usize,
    skipped: usize,
    failures: Vec<String>,
}

/// Runs the corpus write script on `image` and judges it: a refusal, a
/// read-only open, or writes after which e2fsck -fn finds nothing new (or
/// nothing the kernel's own writes would not also make it find).
fn judge_corpus_write(name: &str, image: Vec<u8>, tally: &mut CorpusTally) {
    // An image whose journal needs recovery is judged against its replayed self:
    // a writable open replays it first (as the kernel's mount does), and some
    // corpus journals replay damage on purpose (j_recover_csum2_64bit's bitmaps;
    // the kernel's replay gives the same e2fsck report).
    let needs_recovery = uext4::format::bytes::le32(&image, 1024 + 0x60) & 0x4 != 0;
    let baseline = match needs_recovery {
        true => match write_trial(image.clone(), CORPUS_WRITE_LIMIT, |_| fuzzing::ScriptReport::default()) {
            Ok((_, replayed)) => replayed,
            Err(e) => {
                tally.failures.push(format!("{name}: {e}"));
                return;
            }
        },
        false => image.clone(),
    };
    let Some(before) = e2fsck_problems_within(&baseline, E2FSCK_LIMIT_SECS) else {
        eprintln!("{name:<40} skipped: e2fsck -fn does not finish on it");
        tally.skipped += 1;
        return;
    };
    let (outcome, after) = match write_trial(image, CORPUS_WRITE_LIMIT, fuzzing::corpus_write_script) {
        Ok(v) => v,
        Err(e) => {
            tally.failures.push(format!("{name}: {e}"));
            return;
        }
    };
    let summary = match &outcome {
        WriteOutcome::Refused(m) => {
            tally.refused += 1;
            format!("refused: {m}")
        }
        WriteOutcome::ReadOnly(m) => {
            tally.read_only += 1;
            format!("read-only: {m}")
        }
        WriteOutcome::Ran(r) => {
            if r.other > 0 {
                tally.failures.push(format!("{name}: unexpected error kinds: {:?}", r.messages));
            }
            if r.clean() {
                tally.clean += 1;
            } else {
                tally.stopped += 1;
            }
            format!("{} ok, {} refused, {} corrupt {:?}", r.ok, r.refused, r.corrupt, r.messages.first())
        }
    };
    eprintln!("{name:<40} {summary}");
    if let WriteOutcome::Ran(_) = outcome {
        match e2fsck_problems_within(&after, E2FSCK_LIMIT_SECS) {
            Some(after) => {
                let new = new_problems(&before, &after);
                match new.is_empty() {
                    true => {}
                    false if kernel_also_worsens(name, &baseline, &before) => {
                        eprintln!("{name:<40} new problems after uext4's writes: {new:?}")
                    }
                    false => tally.failures.push(format!("{name}: e2fsck -fn finds new problems: {new:?}")),
                }
            }
            None => tally.failures.push(format!("{name}: e2fsck -fn no longer finishes after the writes")),
        }
    }
}

/// Whether the kernel, given the same image, also leaves e2fsck reporting new
/// problems after the corpus script's first steps alone: mkdir /uext4-new and a
/// 20,000-byte file in it (loop mount, as root). Some damage surfaces with any new
/// name or block, whoever adds it: a bitmap calling free the blocks (or inode table
/// block) that a damaged inode's map already uses, or an e2fsck that crashes on a
/// damaged htree once the root changes. No writer can leave such an image as it
/// was, so it is judged against the kernel and uext4's new problems are reported
/// beside the kernel's. Without root there is no such judge, and they fail.
fn kernel_also_worsens(name: &str, image: &[u8], before: &std::collections::BTreeSet<String>) -> bool {
    if !oracle::can_loop_mount() {
        return false;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kernel.img");
    std::fs::write(&path, image).unwrap();
    {
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let mounted = std::process::Command::new("mount").arg("-o").arg("loop").arg(&path).arg(&mnt).output().unwrap();
        if !mounted.status.success() {
            return false;
        }
        let m = oracle::Mount::adopt(mnt.clone());
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let _ =
            std::fs::create_dir(mnt.join("uext4-new")).and_then(|_| std::fs::write(mnt.join("uext4-new/file"), &data));
        m.unmount();
    }
    let Some(after) = e2fsck_problems_within(&std::fs::read(&path).unwrap(), E2FSCK_LIMIT_SECS) else {
        return false;
    };
    let kernel_new = new_problems(before, &after);
    if !kernel_new.is_empty() {
        eprintln!("{name:<40} the kernel's mkdir and write make new problems too: {kernel_new:?}");
    }
    !kernel_new.is_empty()
}

/// Where the write fuzz target's findings are kept (minimized inputs).
fn kept_write_inputs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/kept/write_script")
}

/// The write fuzz target's seed images, as `fuzz/make_seeds.sh` makes them (in the
/// returned directory): their paths and bytes, in name order.
fn fuzz_seed_images() -> (tempfile::TempDir, Vec<PathBuf>, Vec<Vec<u8>>) {
    let seed_dir = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/make_seeds.sh");
    run(std::process::Command::new(&script).env("UEXT4_SEEDS_OUT", seed_dir.path()));
    let mut paths: Vec<PathBuf> = std::fs::read_dir(seed_dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    let images = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    (seed_dir, paths, images)
}

/// Replays every kept input of the `write_script` fuzz target on the seed images
/// `fuzz/make_seeds.sh` makes, with the check the fuzz loop leaves out: whenever
/// the script succeeded, `e2fsck -fn` finds nothing it did not find before.
#[test]
fn write_fuzz_findings_replay_soundly() {
    if !require_e2fsprogs() || !skip_unless(have_tool("python3"), "python3 (for fuzz/make_seeds.sh) is missing") {
        return;
    }
    let (_seed_dir, _, seeds) = fuzz_seed_images();
    assert_eq!(seeds.len(), 4, "make_seeds.sh makes four seed images");
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(kept_write_inputs()).unwrap().map(|e| e.unwrap().path()).collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "no kept inputs in {}", kept_write_inputs().display());
    let (mut refused, mut clean, mut stopped) = (0, 0, 0);
    let mut failures = Vec::new();
    for input in &inputs {
        let name = input.file_name().unwrap().to_string_lossy().to_string();
        let image = fuzzing::image_for(&seeds, &std::fs::read(input).unwrap());
        let before = e2fsck_problems(&image);
        let (outcome, after) = match write_trial(image, TRIAL_LIMIT, fuzzing::write_script) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        match outcome {
            WriteOutcome::Refused(_) | WriteOutcome::ReadOnly(_) => refused += 1,
            WriteOutcome::Ran(r) if r.other > 0 => failures.push(format!("{name}: unexpected errors {:?}", r.messages)),
            WriteOutcome::Ran(r) if r.clean() => {
                clean += 1;
                let new = new_problems(&before, &e2fsck_problems(&after));
                if !new.is_empty() {
                    failures.push(format!("{name}: script succeeded, e2fsck -fn finds new problems: {new:?}"));
                }
            }
            WriteOutcome::Ran(_) => stopped += 1,
        }
    }
    eprintln!("{} kept inputs: {refused} refused, {clean} succeeded, {stopped} stopped by Corrupt", inputs.len());
    assert!(failures.is_empty(), "{} replay failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn unknown_hash_version_and_short_directories_refuse_writes() {
    if !require_e2fsprogs() {
        return;
    }
    let base = fixture(Shape::Csum);
    // New indexes would take it, and e2fsck calls it unsupported.
    let img = with_superblock(&base, |sb| sb[0xFC] = 4);
    assert_write_refused("s_def_hash_version 4", &img, &["hash version 4"], &|_| Ok(()));
    // A directory of size 0 lists nothing but still holds its entries: rmdir must not
    // take it for empty (the kernel's ext4_empty_dir calls it corrupt).
    let mut img = base.clone();
    edit_inode(&mut img, ino_of(&base, "/big"), |s| uext4::format::bytes::put_le32(s, 0x4, 0));
    assert_write_refused("rmdir of a 0-byte directory", &img, &["shorter than one block"], &|fs| {
        fs.rmdir(ROOT_INO, b"big")
    });
}

/// Mutated seed images the seeded write fuzz tries (override with
/// UEXT4_MINI_WRITE_FUZZ_CASES; each case runs e2fsck -fn twice).
const MINI_WRITE_FUZZ_CASES: u64 = 1_000;

/// The write fuzz target's check with e2fsck in the loop, on seeded mutations
/// aimed at metadata (as `mini_fuzz_seeded_mutations` aims them): the script
/// must never panic, hang or meet an error kind no damaged image should cause,
/// and when every step of it succeeded, e2fsck -fn must find nothing new. The
/// libFuzzer run (fuzz/README.md) explores far more, but without e2fsck.
/// UEXT4_MINI_WRITE_FUZZ_FIRST=N starts at case N (to replay one, with CASES=1);
/// UEXT4_MINI_WRITE_FUZZ_KEEP=DIR keeps each image before and after the script.
#[test]
fn mini_write_fuzz_seeded_mutations() {
    if !require_e2fsprogs() || !skip_unless(have_tool("python3"), "python3 (for fuzz/make_seeds.sh) is missing") {
        return;
    }
    let cases = env_u64("UEXT4_MINI_WRITE_FUZZ_CASES", MINI_WRITE_FUZZ_CASES);
    let (_seed_dir, seed_paths, seeds) = fuzz_seed_images();
    let maps: Vec<Vec<Meta>> = seeds.iter().map(|img| metadata_map(img)).collect();
    let first = env_u64("UEXT4_MINI_WRITE_FUZZ_FIRST", 0);
    let keep_dir = std::env::var_os("UEXT4_MINI_WRITE_FUZZ_KEEP");
    let mut rng = Rng::new(0x5EED_3717);
    let (mut refused, mut clean, mut stopped, mut unjudged) = (0, 0, 0, 0);
    let mut failures = Vec::new();
    let start = Instant::now();
    for case in 0..first + cases {
        let which = rng.below(seeds.len() as u64) as usize;
        let seed = &seeds[which];
        let bs = block_size_of(seed);
        let mut data = Vec::new();
        for _ in 0..1 + rng.below(4) {
            let m = &maps[which][rng.below(maps[which].len() as u64) as usize];
            let off = m.block as usize * bs + pick_offset(m, &mut rng);
            data.extend_from_slice(&(off as u32).to_le_bytes());
            data.push(rng.next() as u8);
            data.push(rng.next() as u8);
        }
        if case < first {
            continue;
        }
        let image = fuzzing::mutate(seed, &data);
        let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
        let label = format!("case {case} (seed {}, edits {hex})", seed_paths[which].display());
        // An e2fsck that gave up part-way has not listed every problem the
        // damage makes, so nothing can be called new after the script.
        let Some(before) = e2fsck_problems_within(&image, 60).filter(|p| !p.contains("e2fsck: aborted")) else {
            unjudged += 1;
            continue;
        };
        let keep = |suffix: &str, bytes: &[u8]| {
            if let Some(dir) = &keep_dir {
                std::fs::write(PathBuf::from(dir).join(format!("case-{case}{suffix}.img")), bytes).unwrap();
            }
        };
        keep("", &image);
        let (outcome, after) = match write_trial(image, TRIAL_LIMIT, fuzzing::write_script) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{label}: {e}"));
                continue;
            }
        };
        match outcome {
            WriteOutcome::Refused(_) | WriteOutcome::ReadOnly(_) => refused += 1,
            WriteOutcome::Ran(r) if r.other > 0 => {
                failures.push(format!("{label}: unexpected errors {:?}", r.messages))
            }
            WriteOutcome::Ran(r) if r.clean() => {
                clean += 1;
                keep("-after", &after);
                match e2fsck_problems_within(&after, 60) {
                    Some(after_problems) => {
                        let new = new_problems(&before, &after_problems);
                        if !new.is_empty() {
                            failures.push(format!("{label}: script succeeded, e2fsck -fn finds new problems: {new:?}"));
                        }
                    }
                    None => failures.push(format!("{label}: e2fsck -fn no longer finishes")),
                }
            }
            WriteOutcome::Ran(_) => stopped += 1,
        }
    }
    eprintln!(
        "mini write fuzz: {cases} cases in {:?}: {refused} refused, {clean} succeeded, {stopped} stopped by Corrupt, \
         {unjudged} not judged (e2fsck -fn gives up on the damaged image)",
        start.elapsed()
    );
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
