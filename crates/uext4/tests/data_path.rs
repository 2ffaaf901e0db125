//! The data path under writes into preallocated space (issue 14, seed 001),
//! judged by e2fsck, debugfs and the kernel:
//! - the two recipes (a write into space preallocated past the end of
//!   file) leave the same extents as the kernel's and e2fsck silent;
//! - every way a write converts unwritten blocks (zeroed whole, head or tail
//!   zeroed, split in three, handed to a written neighbour, past EOF, runs
//!   mixing holes, unwritten and written blocks) at zero-out lengths 0, 7 and
//!   256, over blocks that hold stale 0xEE bytes: the kernel reads zeros in every
//!   byte never written;
//! - a mixed random workload of two threads (create, write, truncate, fallocate
//!   with keep-size, punch, zero range, rename, link, unlink, fsync) checked
//!   against a model, ending with e2fsck -fn silent and the kernel reading back
//!   the model's bytes.

mod oracle;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use uext4::extent::MapKind;
use uext4::format::extent::ExtentHeader;
use uext4::space::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE};
use uext4::{Error, Filesystem, Options, Owner, SetAttr, ROOT_INO};

const ROOT: Owner = Owner { uid: 0, gid: 0 };
const BS: u64 = 4096;

fn mkfs(image: &Path, size: &str) {
    oracle::run(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(image).arg(size));
}

fn open_rw(image: &Path, zeroout: u32) -> Filesystem {
    Filesystem::open(image, Options { read_only: false, extent_zeroout_len: zeroout, ..Options::default() }).unwrap()
}

/// The leaf extents of `path` as debugfs `ex` prints them: (first, last, unwritten).
fn extents(image: &Path, path: &str) -> Vec<(u64, u64, bool)> {
    let out = oracle::run(Command::new("debugfs").arg("-R").arg(format!("ex {path}")).arg(image));
    let mut leaves = Vec::new();
    for line in out.lines().skip_while(|l| !l.starts_with("Level")).skip(1) {
        let t: Vec<&str> = line.split(|c: char| c == '/' || c.is_whitespace()).filter(|t| !t.is_empty()).collect();
        // level/depth entry/entries first - last pfirst - plast len [Uninit]
        if t.len() >= 11 && t[0] == t[1] {
            leaves.push((t[4].parse().unwrap(), t[6].parse().unwrap(), t.get(11) == Some(&"Uninit")));
        }
    }
    leaves
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `len` random bytes (from `seed`) at `at` through uext4 and into `model`.
fn write_into_model(fs: &Filesystem, ino: u32, model: &mut Vec<u8>, at: u64, len: usize, seed: u64) {
    let data = random_bytes(seed, len);
    assert_eq!(fs.write(ino, at, &data).unwrap(), len);
    if model.len() < at as usize + len {
        model.resize(at as usize + len, 0);
    }
    model[at as usize..at as usize + len].copy_from_slice(&data);
}

/// uext4 reads exactly `model` from `ino`.
fn assert_reads_model(fs: &Filesystem, ino: u32, model: &[u8], what: &str) {
    let got = fs.read_all(ino).unwrap();
    assert_eq!(got.len(), model.len(), "{what}: size");
    assert!(got == *model, "{what}: uext4 reads other bytes");
}

/// A recipe as (kernel commands on MNT/f) and the same steps through uext4.
struct Recipe {
    shell: &'static str,
    steps: &'static [Step],
}

enum Step {
    Write { block: u64, blocks: u64 },
    FallocateKeepSize { block: u64, blocks: u64 },
}

/// The recipes: the kernel's extents and uext4's must agree, and e2fsck
/// must be silent on both (before the fix uext4 marked the whole preallocated
/// range written past i_size).
#[test]
fn writes_into_space_preallocated_past_eof_leave_the_kernels_extents() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    const ONE_BLOCK_EXTENTS: &[Step] = &[
        Step::Write { block: 0, blocks: 1 },
        Step::Write { block: 2, blocks: 1 },
        Step::Write { block: 4, blocks: 1 },
        Step::Write { block: 6, blocks: 1 },
        Step::Write { block: 8, blocks: 1 },
        Step::Write { block: 10, blocks: 1 },
        Step::Write { block: 12, blocks: 1 },
        Step::Write { block: 14, blocks: 1 },
        Step::FallocateKeepSize { block: 15, blocks: 100 },
        Step::Write { block: 16, blocks: 1 },
    ];
    let recipes = [
        Recipe {
            shell: "dd if=/dev/urandom of=$F bs=4096 count=1 status=none; sync; \
                    fallocate -n -o 0 -l 1048576 $F; \
                    dd if=/dev/urandom of=$F bs=4096 count=1 seek=2 conv=notrunc status=none",
            steps: &[
                Step::Write { block: 0, blocks: 1 },
                Step::FallocateKeepSize { block: 0, blocks: 256 },
                Step::Write { block: 2, blocks: 1 },
            ],
        },
        Recipe {
            shell: "for b in 0 2 4 6 8 10 12 14; do \
                      dd if=/dev/urandom of=$F bs=4096 count=1 seek=$b conv=notrunc status=none; sync; done; \
                    fallocate -n -o $((15*4096)) -l $((100*4096)) $F; \
                    dd if=/dev/urandom of=$F bs=4096 count=1 seek=16 conv=notrunc status=none",
            steps: ONE_BLOCK_EXTENTS,
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    for (n, recipe) in recipes.iter().enumerate() {
        for zeroout in [0u32, 7, 256] {
            let kernel_image = dir.path().join("kernel.img");
            mkfs(&kernel_image, "64M");
            {
                let m = oracle::Mount::new(&kernel_image, "");
                let f = m.dir.join("f");
                oracle::run(Command::new("sh").arg("-c").arg(recipe.shell).env("F", &f));
            }
            oracle::assert_e2fsck_clean(&kernel_image);
            let image = dir.path().join("uext4.img");
            mkfs(&image, "64M");
            let mut expect = Vec::new();
            {
                let fs = open_rw(&image, zeroout);
                let ino = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
                for (i, step) in recipe.steps.iter().enumerate() {
                    match *step {
                        Step::Write { block, blocks } => {
                            let data = random_bytes(i as u64 + 1, (blocks * BS) as usize);
                            assert_eq!(fs.write(ino, block * BS, &data).unwrap(), data.len());
                            let end = ((block + blocks) * BS) as usize;
                            if expect.len() < end {
                                expect.resize(end, 0);
                            }
                            expect[(block * BS) as usize..end].copy_from_slice(&data);
                        }
                        Step::FallocateKeepSize { block, blocks } => {
                            fs.fallocate(ino, block * BS, blocks * BS, FALLOC_FL_KEEP_SIZE).unwrap()
                        }
                    }
                }
                fs.sync().unwrap();
            }
            oracle::assert_e2fsck_clean(&image);
            let ours = extents(&image, "f");
            let theirs = extents(&kernel_image, "f");
            assert_eq!(ours, theirs, "recipe {n}, zero-out length {zeroout}: uext4's extents and the kernel's");
            let m = oracle::Mount::new(&image, "ro");
            assert!(std::fs::read(m.dir.join("f")).unwrap() == expect, "recipe {n}: the kernel reads other bytes");
        }
    }
}

/// A fresh image whose free blocks (as dumpe2fs lists them per group) all hold
/// 0xEE: whatever uext4 preallocates sits over stale bytes.
fn stale_image(image: &Path) {
    use std::os::unix::fs::FileExt;
    mkfs(image, "128M");
    let listing = oracle::run(Command::new("dumpe2fs").arg(image));
    let f = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    let junk = vec![0xEEu8; 1 << 20];
    let mut stale = 0;
    for ranges in listing.lines().filter_map(|l| l.strip_prefix("  Free blocks: ")) {
        for range in ranges.split(", ").filter(|r| !r.is_empty()) {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            let (first, last): (u64, u64) = (first.parse().unwrap(), last.parse().unwrap());
            let mut at = first * BS;
            while at < (last + 1) * BS {
                let n = ((last + 1) * BS - at).min(junk.len() as u64) as usize;
                f.write_at(&junk[..n], at).unwrap();
                at += n as u64;
            }
            stale += last + 1 - first;
        }
    }
    assert!(stale > 20_000, "dumpe2fs listed only {stale} free blocks");
}

/// (file name, fallocate (offset, length, mode), writes (offset, length)).
type Case<'a> = (&'a str, (u64, u64, u32), &'a [(u64, usize)]);

/// Every conversion case of extent/zeroout.rs, over stale bytes: whatever a
/// write did not cover reads as zeros through the kernel.
#[test]
fn converted_unwritten_space_never_shows_stale_bytes() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for zeroout in [0u32, 7, 256] {
        let image = dir.path().join(format!("stale{zeroout}.img"));
        stale_image(&image);
        let mut files: Vec<(&str, Vec<u8>)> = Vec::new();
        {
            let fs = open_rw(&image, zeroout);
            let cases: &[Case] = &[
                ("small-whole", (0, 10 * BS, 0), &[(3 * BS + 5, 100)]),
                ("tail", (0, 100 * BS, 0), &[(95 * BS + 17, 3000)]),
                ("head", (0, 100 * BS, 0), &[(3 * BS, 4096)]),
                ("middle", (0, 400 * BS, 0), &[(200 * BS + 1, 2 * BS as usize)]),
                ("left-handoff", (0, 300 * BS, 0), &[(0, 5 * BS as usize), (5 * BS, 7 * BS as usize + 3)]),
                (
                    "right-handoff",
                    (0, 300 * BS, 0),
                    &[(295 * BS, 5 * BS as usize), (290 * BS + 9, 5 * BS as usize - 9)],
                ),
                ("past-eof", (0, 256 * BS, FALLOC_FL_KEEP_SIZE), &[(0, 10), (2 * BS + 1, 50), (100 * BS, 1)]),
                ("runs", (40 * BS, 60 * BS, 0), &[(10 * BS + 7, 50), (30 * BS + 3, 100 * BS as usize)]),
                (
                    "scattered",
                    (0, 2000 * BS, FALLOC_FL_KEEP_SIZE),
                    &[
                        (1500 * BS + 5, 9000),
                        (3 * BS, 1),
                        (700 * BS, 8192),
                        (1999 * BS + 4000, 96),
                        (1000 * BS, 1 << 20),
                    ],
                ),
            ];
            for (name, (off, len, mode), writes) in cases {
                let ino = fs.create(ROOT_INO, name.as_bytes(), 0o644, ROOT).unwrap().ino;
                fs.fallocate(ino, *off, *len, *mode).unwrap();
                // The test means something only if the preallocated blocks hold stale bytes.
                let inode = fs.inode(ino).unwrap();
                let m = fs.map_blocks(ino, &inode, off / BS, len / BS).unwrap();
                let MapKind::Unwritten(p) = m.kind else { panic!("{name}: fallocate left {m:?}") };
                let mut raw = vec![0u8; BS as usize];
                fs.cache().device().read_at(p * BS, &mut raw).unwrap();
                assert!(raw.iter().all(|&b| b == 0xEE), "{name}: the preallocated block {p} holds no stale bytes");
                let mut model = vec![0u8; if mode & FALLOC_FL_KEEP_SIZE == 0 { (off + len) as usize } else { 0 }];
                for (i, &(at, n)) in writes.iter().enumerate() {
                    let data = random_bytes(at ^ i as u64, n);
                    assert_eq!(fs.write(ino, at, &data).unwrap(), n, "{name}");
                    let end = at as usize + n;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[at as usize..end].copy_from_slice(&data);
                }
                assert!(fs.read_all(ino).unwrap() == model, "{name}, zero-out {zeroout}: uext4 reads other bytes");
                files.push((name, model));
            }
            fs.sync().unwrap();
        }
        oracle::assert_e2fsck_clean(&image);
        let m = oracle::Mount::new(&image, "ro");
        for (name, model) in &files {
            let got = std::fs::read(m.dir.join(name)).unwrap();
            assert_eq!(got.len(), model.len(), "{name}, zero-out {zeroout}: size");
            if let Some(i) = (0..got.len()).find(|&i| got[i] != model[i]) {
                panic!(
                    "{name}, zero-out {zeroout}: the kernel reads {:#x} at byte {i}, the model {:#x}",
                    got[i], model[i]
                );
            }
        }
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One worker's view: its directory's names and the bytes of its files.
#[derive(Default)]
struct WorkerModel {
    names: BTreeMap<String, u32>,
    data: BTreeMap<u32, Vec<u8>>,
}

const NAMES: u64 = 8;
const SPAN: u64 = 2 << 20;

/// Runs `ops` random operations in `dir`, continuing `model` (and its random
/// sequence, `rng`) from an earlier phase.
fn worker(fs: &Filesystem, dir: u32, rng: &mut Rng, model: &mut WorkerModel, ops: usize) {
    let seed = rng.0;
    for step in 0..ops {
        let name = format!("f{}", rng.below(NAMES));
        let ino = model.names.get(&name).copied();
        let what = rng.below(100);
        let ctx = || format!("seed {seed:#x} step {step}: {what} on {name}");
        let range = |rng: &mut Rng| {
            // Block-aligned half the time, as preallocations and database pages are.
            let mut off = rng.below(SPAN);
            let most = if rng.below(4) == 0 { 256 << 10 } else { 20_000 };
            let mut len = 1 + rng.below(most);
            if rng.below(2) == 0 {
                off -= off % BS;
                len = len.div_ceil(BS) * BS;
            }
            (off, len)
        };
        match (what, ino) {
            (_, None) => {
                let st = fs.create(dir, name.as_bytes(), 0o644, ROOT).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                model.names.insert(name, st.ino);
                model.data.insert(st.ino, Vec::new());
            }
            (0..=34, Some(ino)) => {
                let (mut off, mut len) = range(rng);
                // Short appends, half the time: the pattern preallocation serves (a
                // log), which meets keep-size space past the end of file.
                if rng.below(2) == 0 {
                    off = model.data[&ino].len() as u64;
                    len = 1 + rng.below(3 * BS);
                }
                let bytes = random_bytes(rng.next(), len as usize);
                assert_eq!(fs.write(ino, off, &bytes).unwrap_or_else(|e| panic!("{}: {e}", ctx())), bytes.len());
                let d = model.data.get_mut(&ino).unwrap();
                if d.len() < (off + len) as usize {
                    d.resize((off + len) as usize, 0);
                }
                d[off as usize..(off + len) as usize].copy_from_slice(&bytes);
            }
            (35..=44, Some(ino)) => {
                let (mut off, mut len) = range(rng);
                // Space ahead of the end of file, half the time, as a log preallocates.
                if rng.below(2) == 0 {
                    off = model.data[&ino].len() as u64;
                    len = 1 + rng.below(1 << 20);
                }
                let mode = if rng.below(4) == 0 { 0 } else { FALLOC_FL_KEEP_SIZE };
                fs.fallocate(ino, off, len, mode).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                let d = model.data.get_mut(&ino).unwrap();
                if mode == 0 && d.len() < (off + len) as usize {
                    d.resize((off + len) as usize, 0);
                }
            }
            (45..=51, Some(ino)) => {
                let (off, len) = range(rng);
                fs.fallocate(ino, off, len, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                let d = model.data.get_mut(&ino).unwrap();
                let end = ((off + len) as usize).min(d.len());
                if (off as usize) < end {
                    d[off as usize..end].fill(0);
                }
            }
            (52..=57, Some(ino)) => {
                let (off, len) = range(rng);
                let keep = rng.below(2) == 0;
                let mode = FALLOC_FL_ZERO_RANGE | if keep { FALLOC_FL_KEEP_SIZE } else { 0 };
                fs.fallocate(ino, off, len, mode).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                let d = model.data.get_mut(&ino).unwrap();
                if !keep && d.len() < (off + len) as usize {
                    d.resize((off + len) as usize, 0);
                }
                let end = ((off + len) as usize).min(d.len());
                if (off as usize) < end {
                    d[off as usize..end].fill(0);
                }
            }
            (58..=66, Some(ino)) => {
                let size = rng.below(SPAN + (64 << 10));
                fs.setattr(ino, &SetAttr { size: Some(size), ..SetAttr::default() })
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                model.data.get_mut(&ino).unwrap().resize(size as usize, 0);
            }
            (67..=73, Some(_)) => {
                let to = format!("f{}", rng.below(NAMES));
                fs.rename(dir, name.as_bytes(), dir, to.as_bytes(), 0).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                // rename(2) between two links of one inode changes nothing.
                if model.names.get(&to) != Some(&model.names[&name]) {
                    let moved = model.names.remove(&name).unwrap();
                    model.names.insert(to, moved);
                }
            }
            (74..=79, Some(ino)) => {
                let to = format!("f{}", rng.below(NAMES));
                match fs.link(ino, dir, to.as_bytes()) {
                    Ok(_) => {
                        assert!(!model.names.contains_key(&to), "{}: linked over {to}", ctx());
                        model.names.insert(to, ino);
                    }
                    Err(Error::Exists(_)) => assert!(model.names.contains_key(&to), "{}: {to} missing", ctx()),
                    Err(e) => panic!("{}: link: {e}", ctx()),
                }
            }
            (80..=86, Some(_)) => {
                fs.unlink(dir, name.as_bytes()).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                let gone = model.names.remove(&name).unwrap();
                if !model.names.values().any(|&i| i == gone) {
                    model.data.remove(&gone);
                }
            }
            (87..=92, Some(ino)) => fs.fsync(ino).unwrap_or_else(|e| panic!("{}: {e}", ctx())),
            (_, Some(ino)) => {
                let got = fs.read_all(ino).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                let want = &model.data[&ino];
                assert_eq!(got.len(), want.len(), "{}: size", ctx());
                if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                    panic!("{}: uext4 reads {:#x} at byte {i}, the model {:#x}", ctx(), got[i], want[i]);
                }
            }
        }
    }
}

/// Two threads, each in its own directory, share the allocator, the journal and
/// the trees' blocks; at zero-out lengths 0, 7 and 256.
#[test]
fn two_workers_mixed_data_workload_matches_the_model() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    const PHASES: usize = 6;
    const OPS_PER_PHASE: usize = 500;
    let dir = tempfile::tempdir().unwrap();
    for (round, zeroout) in [0u32, 7, 256].into_iter().enumerate() {
        let image = dir.path().join("mixed.img");
        stale_image(&image);
        let mut workers: Vec<(u32, Rng, WorkerModel)> = Vec::new();
        {
            let fs = open_rw(&image, zeroout);
            for w in 0..2u64 {
                let d = fs.mkdir(ROOT_INO, format!("w{w}").as_bytes(), 0o755, ROOT).unwrap().ino;
                let seed = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(round as u64 * 2 + w + 1);
                workers.push((d, Rng(seed), WorkerModel::default()));
            }
        }
        // Phases end with the filesystem closed and e2fsck's verdict, so damage
        // a later truncate would hide is seen where it happens.
        for phase in 0..PHASES {
            let fs = Arc::new(open_rw(&image, zeroout));
            workers = std::thread::scope(|scope| {
                let running: Vec<_> = workers
                    .into_iter()
                    .map(|(d, mut rng, mut model)| {
                        let fs = fs.clone();
                        scope.spawn(move || {
                            worker(&fs, d, &mut rng, &mut model, OPS_PER_PHASE);
                            (d, rng, model)
                        })
                    })
                    .collect();
                running.into_iter().map(|h| h.join().unwrap()).collect()
            });
            fs.sync().unwrap();
            drop(fs);
            eprintln!("zero-out {zeroout}, phase {phase}: e2fsck");
            oracle::assert_e2fsck_clean(&image);
        }
        let models: Vec<&WorkerModel> = workers.iter().map(|(_, _, m)| m).collect();
        let m = oracle::Mount::new(&image, "ro");
        for (w, model) in models.iter().enumerate() {
            let d = m.dir.join(format!("w{w}"));
            let mut on_disk: Vec<String> =
                std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            on_disk.sort();
            assert_eq!(on_disk, model.names.keys().cloned().collect::<Vec<_>>(), "zero-out {zeroout}: names in w{w}");
            for (name, ino) in &model.names {
                let got = std::fs::read(d.join(name)).unwrap();
                let want = &model.data[ino];
                assert_eq!(got.len(), want.len(), "zero-out {zeroout}: size of w{w}/{name}");
                if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                    panic!(
                        "zero-out {zeroout}: the kernel reads {:#x} at byte {i} of w{w}/{name}, the model {:#x}",
                        got[i], want[i]
                    );
                }
            }
        }
    }
}

/// Punches and truncates edit a deep tree in place (remove_range): ranges
/// inside one extent (a split), across leaves, whole leaves (freed and unlinked
/// from their parent, up to an empty tree), with writes between, a sync part-way
/// (which packs the thinned tree), and every step read back against the model.
#[test]
fn punch_and_truncate_edit_a_deep_tree_in_place() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("deep.img");
    mkfs(&image, "256M");
    let mut model = vec![0u8; 0];
    let write = write_into_model;
    {
        let fs = open_rw(&image, 0);
        let ino = fs.create(ROOT_INO, b"deep", 0o644, ROOT).unwrap().ino;
        // Every other block: 3,000 one-block extents, a tree of depth 2.
        for b in 0..3000u64 {
            write(&fs, ino, &mut model, 2 * b * BS, BS as usize, b + 1);
        }
        fs.sync().unwrap();
        let depth = |fs: &Filesystem| ExtentHeader::parse(&fs.inode(ino).unwrap().i_block).eh_depth;
        assert_eq!(depth(&fs), 2, "3,000 extents make a tree of depth 2");
        let punch = |fs: &Filesystem, model: &mut Vec<u8>, first: u64, blocks: u64| {
            fs.fallocate(ino, first * BS, blocks * BS, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).unwrap();
            let end = (((first + blocks) * BS) as usize).min(model.len());
            if ((first * BS) as usize) < end {
                model[(first * BS) as usize..end].fill(0);
            }
        };
        let check = |fs: &Filesystem, model: &Vec<u8>, what: &str| {
            let got = fs.read_all(ino).unwrap();
            assert_eq!(got.len(), model.len(), "{what}: size");
            assert!(got == *model, "{what}: uext4 reads other bytes");
        };
        let mut rng = Rng(0xdee9);
        for step in 0..60u64 {
            match step % 6 {
                // Inside one extent: a write makes a long one, the punch splits it.
                0 => {
                    let b = rng.below(5000);
                    write(&fs, ino, &mut model, b * BS, 16 * BS as usize, step + 10_000);
                    punch(&fs, &mut model, b + 5, 3);
                }
                // Across a few hundred blocks: whole leaves may go.
                1 | 2 => punch(&fs, &mut model, rng.below(6000), 1 + rng.below(900)),
                3 => {
                    let b = rng.below(6000);
                    write(&fs, ino, &mut model, b * BS + 100, 3 * BS as usize, step + 20_000);
                }
                4 => {
                    if step == 28 {
                        fs.sync().unwrap();
                    }
                    punch(&fs, &mut model, rng.below(6000), 1 + rng.below(40));
                }
                _ => {
                    // Truncate down, part of a block kept.
                    let size = (model.len() as u64 * 97 / 100).max(BS + 7);
                    fs.setattr(ino, &SetAttr { size: Some(size), ..SetAttr::default() }).unwrap();
                    model.resize(size as usize, 0);
                }
            }
            check(&fs, &model, &format!("step {step}"));
        }
        // Everything but the first block goes, leaf by leaf, then everything.
        punch(&fs, &mut model, 1, 1 << 20);
        check(&fs, &model, "punch to the end");
        // The last extent goes: an empty tree of depth 0 that takes writes again.
        punch(&fs, &mut model, 0, 1);
        assert_eq!(depth(&fs), 0, "an emptied tree is an empty root");
        check(&fs, &model, "punch of everything");
        write(&fs, ino, &mut model, 5 * BS, 10, 99);
        check(&fs, &model, "a write into the emptied tree");
        fs.sync().unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    assert!(std::fs::read(m.dir.join("deep")).unwrap() == model, "the kernel reads other bytes");
}

/// ZERO_RANGE over a tree of depth 2: written extents inside the range become
/// unwritten where they lie (a range inside one extent splits it in three, one
/// across leaves changes each, a whole 32,768-block extent becomes two unwritten
/// ones), each step read back against a model; debugfs shows the zeroed blocks
/// Uninit and still allocated; e2fsck -fn silent and the kernel reading the model.
#[test]
fn zero_range_marks_a_deep_tree_unwritten_in_place() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("zero.img");
    mkfs(&image, "1G");
    let mut model = vec![0u8; 0];
    let mut big_model = Vec::new();
    let write = write_into_model;
    let zero = |fs: &Filesystem, ino: u32, model: &mut Vec<u8>, at: u64, len: u64| {
        fs.fallocate(ino, at, len, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE).unwrap();
        let end = ((at + len) as usize).min(model.len());
        if (at as usize) < end {
            model[at as usize..end].fill(0);
        }
    };
    let check = assert_reads_model;
    let (free_before, free_after);
    {
        let fs = open_rw(&image, 0);
        // Written first, into an empty filesystem: at least one of its extents
        // is 32,768 blocks long.
        let big = fs.create(ROOT_INO, b"big", 0o644, ROOT).unwrap().ino;
        write(&fs, big, &mut big_model, 0, (3 * 32768 + 100) * BS as usize, 7);
        let ino = fs.create(ROOT_INO, b"deep", 0o644, ROOT).unwrap().ino;
        for b in 0..3000u64 {
            write(&fs, ino, &mut model, 2 * b * BS, BS as usize, b + 1);
        }
        fs.sync().unwrap();
        assert_eq!(ExtentHeader::parse(&fs.inode(ino).unwrap().i_block).eh_depth, 2);
        free_before = fs.statfs().free_blocks;
        let mut rng = Rng(0x2e60);
        for step in 0..60u64 {
            match step % 4 {
                // Inside one long extent: head, unwritten middle, tail.
                0 => {
                    let b = rng.below(5000);
                    write(&fs, ino, &mut model, b * BS, 16 * BS as usize, step + 10_000);
                    zero(&fs, ino, &mut model, (b + 5) * BS, 3 * BS);
                }
                // Across a few hundred blocks, edges inside blocks.
                1 | 2 => {
                    let at = rng.below(6000 * BS);
                    zero(&fs, ino, &mut model, at, 1 + rng.below(900 * BS));
                }
                _ => {
                    let at = rng.below(6000 * BS);
                    write(&fs, ino, &mut model, at, 3 * BS as usize + 11, step + 20_000);
                }
            }
            check(&fs, ino, &model, &format!("step {step}"));
        }
        // One extent of the longest written length, zeroed whole.
        let mut lblk = 0;
        let whole = loop {
            let m = fs.map_blocks(big, &fs.inode(big).unwrap(), lblk, 32768).unwrap();
            assert!(lblk < 3 * 32768, "no extent of 32,768 blocks in big");
            if matches!(m.kind, MapKind::Mapped(_)) && m.len == 32768 {
                break lblk;
            }
            lblk += m.len;
        };
        zero(&fs, big, &mut big_model, whole * BS, 32768 * BS);
        check(&fs, big, &big_model, "a 32,768-block extent zeroed");
        fs.sync().unwrap();
        free_after = fs.statfs().free_blocks;
    }
    // Zeroing frees nothing: only the writes into holes took blocks.
    assert!(free_after < free_before, "{free_before} free blocks before, {free_after} after");
    let big = extents(&image, "big");
    let uninit: u64 = big.iter().filter(|e| e.2).map(|e| e.1 - e.0 + 1).sum();
    assert_eq!(uninit, 32768, "debugfs's extents of big: {big:?}");
    assert!(big.iter().filter(|e| e.2).count() >= 2, "no unwritten extent is longer than 32,767: {big:?}");
    let deep = extents(&image, "deep");
    assert!(deep.iter().any(|e| e.2), "some of deep's extents are unwritten: {:?}", &deep[..10]);
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    assert!(std::fs::read(m.dir.join("deep")).unwrap() == model, "the kernel reads other bytes");
    assert!(std::fs::read(m.dir.join("big")).unwrap() == big_model, "the kernel reads other bytes of big");
}

/// ZERO_RANGE that would split a full leaf on a disk with no block left to
/// promise for the split: uext4 rebuilds the tree from the blocks the call was
/// promised instead, and the result is what the kernel reads and e2fsck
/// accepts.
#[test]
fn zero_range_on_a_full_disk_splits_no_leaf_it_cannot_pay_for() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("full.img");
    mkfs(&image, "256M");
    let mut model = Vec::new();
    {
        let fs = open_rw(&image, 0);
        let ino = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
        // 3,000 extents of three blocks, a hole after each: leaves packed full at sync.
        for k in 0..3000u64 {
            let data = random_bytes(k + 1, 3 * BS as usize);
            fs.write(ino, 4 * k * BS, &data).unwrap();
            model.resize((4 * k * BS) as usize, 0);
            model.extend_from_slice(&data);
        }
        fs.sync().unwrap();
        let filler = fs.create(ROOT_INO, b"filler", 0o644, ROOT).unwrap().ino;
        let avail = fs.statfs().available_blocks;
        fs.fallocate(filler, 0, (avail - 17) * BS, 0).unwrap();
        fs.sync().unwrap();
        let left = fs.statfs().available_blocks;
        assert!((16..20).contains(&left), "{left} blocks left to promise");
        // The middle block of an extent in the middle of the file: its leaf
        // gains two entries.
        let k = 1500u64;
        fs.fallocate(ino, (4 * k + 1) * BS, BS, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE).unwrap();
        model[((4 * k + 1) * BS) as usize..((4 * k + 2) * BS) as usize].fill(0);
        assert!(fs.read_all(ino).unwrap() == model, "uext4 reads other bytes");
        fs.sync().unwrap();
    }
    let uninit: Vec<_> = extents(&image, "f").into_iter().filter(|e| e.2).collect();
    assert_eq!(uninit, vec![(6001, 6001, true)], "the zeroed block is the one unwritten extent");
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    assert!(std::fs::read(m.dir.join("f")).unwrap() == model, "the kernel reads other bytes");
}

/// COLLAPSE_RANGE and INSERT_RANGE (file/shift.rs) over written, unwritten and
/// unmapped blocks, inside extents and at their edges, each step read back
/// against a model (bytes cut out, or zeros opened); the kernel's refusals
/// (unaligned, against the end of file) as errors; e2fsck -fn silent and the
/// kernel reading the model at the end.
#[test]
fn collapse_and_insert_range_move_the_rest_of_the_file() {
    use uext4::space::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE};
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("shift.img");
    stale_image(&image);
    let mut model: Vec<u8> = Vec::new();
    {
        let fs = open_rw(&image, 0);
        let ino = fs.create(ROOT_INO, b"f", 0o644, ROOT).unwrap().ino;
        // Two written blocks of every three, then preallocated space, then more data.
        for b in (0..300u64).step_by(3) {
            let data = random_bytes(b + 1, 2 * BS as usize);
            fs.write(ino, b * BS, &data).unwrap();
            model.resize(((b + 2) * BS) as usize, 0);
            model[(b * BS) as usize..((b + 2) * BS) as usize].copy_from_slice(&data);
        }
        fs.fallocate(ino, 300 * BS, 200 * BS, 0).unwrap();
        model.resize((500 * BS) as usize, 0);
        let tail = random_bytes(77, 10 * BS as usize + 123);
        fs.write(ino, 500 * BS, &tail).unwrap();
        model.extend_from_slice(&tail);
        let check = |fs: &Filesystem, model: &Vec<u8>, what: &str| {
            let got = fs.read_all(ino).unwrap();
            assert_eq!(got.len(), model.len(), "{what}: size");
            if let Some(i) = (0..got.len()).find(|&i| got[i] != model[i]) {
                panic!("{what}: uext4 reads {:#x} at byte {i}, the model {:#x}", got[i], model[i]);
            }
        };
        check(&fs, &model, "before");
        // (collapse?, first block, blocks)
        let steps: &[(bool, u64, u64)] = &[
            (true, 50, 10),    // across written extents and holes
            (false, 4, 7),     // inside a two-block extent: it splits
            (true, 0, 1),      // the first block
            (false, 0, 3),     // before everything
            (true, 320, 40),   // inside the preallocated space
            (false, 350, 100), // inside it again, a big hole opened
            (true, 100, 300),  // a large cut across kinds
            (false, 1, 1),
        ];
        for (n, &(collapse, first, blocks)) in steps.iter().enumerate() {
            let (off, len) = ((first * BS) as usize, (blocks * BS) as usize);
            let mode = if collapse { FALLOC_FL_COLLAPSE_RANGE } else { FALLOC_FL_INSERT_RANGE };
            fs.fallocate(ino, off as u64, len as u64, mode).unwrap_or_else(|e| panic!("step {n}: {e}"));
            if collapse {
                model.drain(off..off + len);
            } else {
                model.splice(off..off, std::iter::repeat_n(0u8, len));
            }
            check(&fs, &model, &format!("step {n}"));
        }
        // The kernel's refusals: unaligned, a collapse reaching EOF, an insert at EOF,
        // with other flags.
        let size = model.len() as u64;
        let refused = [
            (5, BS, FALLOC_FL_COLLAPSE_RANGE),
            (0, BS + 1, FALLOC_FL_INSERT_RANGE),
            (size.div_ceil(BS) * BS - BS, BS, FALLOC_FL_COLLAPSE_RANGE),
            (size.div_ceil(BS) * BS, BS, FALLOC_FL_INSERT_RANGE),
            (0, BS, FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_KEEP_SIZE),
        ];
        for (off, len, mode) in refused {
            match fs.fallocate(ino, off, len, mode) {
                Err(Error::Invalid(_)) => {}
                other => panic!("fallocate({off}, {len}, {mode:#x}) gave {other:?}, the kernel gives EINVAL"),
            }
        }
        check(&fs, &model, "after the refusals");
        fs.sync().unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    let m = oracle::Mount::new(&image, "ro");
    assert!(std::fs::read(m.dir.join("f")).unwrap() == model, "the kernel reads other bytes");
}

/// fsx-style on one file through the library, over stale 0xEE blocks: random
/// writes, reads, truncates, preallocations (keep-size or not), punches, zeroed
/// ranges, collapses and inserts, at zero-out lengths 0, 7 and 256, every read
/// checked against an in-memory copy; then e2fsck -fn and the kernel's read.
/// `UEXT4_FSX_OPS` sets the operations per length (default 200,000).
#[test]
fn fsx_with_collapse_and_insert_at_three_zero_out_lengths() {
    use uext4::space::{FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE};
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let ops: u64 = std::env::var("UEXT4_FSX_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
    const MAX: u64 = 4 << 20;
    let dir = tempfile::tempdir().unwrap();
    for zeroout in [0u32, 7, 256] {
        let image = dir.path().join("fsx.img");
        stale_image(&image);
        let mut model: Vec<u8> = Vec::new();
        let mut counts = [0u64; 9];
        {
            let fs = open_rw(&image, zeroout);
            let ino = fs.create(ROOT_INO, b"fsx", 0o644, ROOT).unwrap().ino;
            let mut rng = Rng(0x00f5_7a11 ^ zeroout as u64);
            for step in 0..ops {
                let ctx = || format!("zero-out {zeroout}, step {step}");
                let size = model.len() as u64;
                let off = rng.below(MAX);
                let most = if rng.below(8) == 0 { 256 << 10 } else { 16 << 10 };
                let len = 1 + rng.below(most);
                let op = rng.below(100) as usize;
                let kind = match op {
                    0..=29 => 0,
                    30..=49 => 1,
                    50..=56 => 2,
                    57..=66 => 3,
                    67..=74 => 4,
                    75..=81 => 5,
                    82..=88 => 6,
                    89..=95 => 7,
                    _ => 8,
                };
                match kind {
                    0 => {
                        let len = len.min(MAX - off);
                        let data = random_bytes(rng.next(), len as usize);
                        assert_eq!(fs.write(ino, off, &data).unwrap(), data.len(), "{}", ctx());
                        if model.len() < (off + len) as usize {
                            model.resize((off + len) as usize, 0);
                        }
                        model[off as usize..(off + len) as usize].copy_from_slice(&data);
                    }
                    1 => {
                        let at = if size == 0 { 0 } else { rng.below(size) };
                        let mut buf = vec![0u8; len as usize];
                        let n = fs.read(ino, at, &mut buf).unwrap();
                        let want = &model[(at as usize).min(model.len())..((at + len) as usize).min(model.len())];
                        assert_eq!(n, want.len(), "{}: read length", ctx());
                        if let Some(i) = (0..n).find(|&i| buf[i] != want[i]) {
                            panic!(
                                "{}: reads {:#x} at byte {}, the model {:#x}",
                                ctx(),
                                buf[i],
                                at as usize + i,
                                want[i]
                            );
                        }
                    }
                    2 => {
                        let to = rng.below(MAX);
                        fs.setattr(ino, &SetAttr { size: Some(to), ..SetAttr::default() }).unwrap();
                        model.resize(to as usize, 0);
                    }
                    3..=5 => {
                        let len = len.min(MAX - off);
                        let mode = match kind {
                            3 => {
                                if rng.below(2) == 0 {
                                    FALLOC_FL_KEEP_SIZE
                                } else {
                                    0
                                }
                            }
                            4 => FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                            _ => FALLOC_FL_ZERO_RANGE | if rng.below(2) == 0 { FALLOC_FL_KEEP_SIZE } else { 0 },
                        };
                        fs.fallocate(ino, off, len, mode).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                        if mode & FALLOC_FL_KEEP_SIZE == 0 && model.len() < (off + len) as usize {
                            model.resize((off + len) as usize, 0);
                        }
                        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 {
                            let end = ((off + len) as usize).min(model.len());
                            if (off as usize) < end {
                                model[off as usize..end].fill(0);
                            }
                        }
                    }
                    6 | 7 => {
                        // Block-aligned, inside the file (the kernel's limits).
                        let blocks = size / BS;
                        if blocks < 2 {
                            continue;
                        }
                        let first = rng.below(blocks - 1);
                        let n = 1 + rng.below((blocks - 1 - first).min(64));
                        let (o, l) = ((first * BS) as usize, (n * BS) as usize);
                        if kind == 6 {
                            if (o + l) as u64 >= size {
                                continue;
                            }
                            fs.fallocate(ino, o as u64, l as u64, FALLOC_FL_COLLAPSE_RANGE)
                                .unwrap_or_else(|e| panic!("{}: collapse: {e}", ctx()));
                            model.drain(o..o + l);
                        } else {
                            if size + l as u64 > MAX {
                                continue;
                            }
                            fs.fallocate(ino, o as u64, l as u64, FALLOC_FL_INSERT_RANGE)
                                .unwrap_or_else(|e| panic!("{}: insert: {e}", ctx()));
                            model.splice(o..o, std::iter::repeat_n(0u8, l));
                        }
                    }
                    _ => fs.fsync(ino).unwrap(),
                }
                // Shifts skipped for a file too small or too big are not counted.
                counts[kind] += 1;
                if step % 20_000 == 19_999 {
                    assert!(fs.read_all(ino).unwrap() == model, "{}: the whole file", ctx());
                }
            }
            fs.sync().unwrap();
        }
        eprintln!(
            "fsx zero-out {zeroout}: {ops} operations (write, read, truncate, fallocate, punch, zero, collapse, insert, fsync): {counts:?}"
        );
        oracle::assert_e2fsck_clean(&image);
        let m = oracle::Mount::new(&image, "ro");
        assert!(std::fs::read(m.dir.join("fsx")).unwrap() == model, "zero-out {zeroout}: the kernel reads other bytes");
    }
}

/// A write after many small files were deleted around the goal takes a run
/// that holds it whole, as the kernel's mballoc does, instead of crumbling into
/// the one-block holes they left: 3,000 one-block files, every third deleted,
/// then one 100,000-byte write (25 blocks) into a new file lies in one extent
/// in debugfs's view, and so does a 2-block file; e2fsck -fn silent.
#[test]
fn a_write_takes_a_run_that_fits_rather_than_the_holes_deleted_files_left() {
    if !oracle::require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    mkfs(&image, "256M");
    {
        let fs = open_rw(&image, 0);
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, ROOT).unwrap().ino;
        let mut files = Vec::new();
        for i in 0..3000 {
            let name = format!("f{i}");
            let ino = fs.create(d, name.as_bytes(), 0o644, ROOT).unwrap().ino;
            fs.write(ino, 0, &[7u8; 100]).unwrap();
            files.push(name);
        }
        fs.sync().unwrap();
        for name in files.iter().step_by(3) {
            fs.unlink(d, name.as_bytes()).unwrap();
        }
        fs.sync().unwrap();
        let big = fs.create(d, b"big", 0o644, ROOT).unwrap().ino;
        fs.write(big, 0, &random_bytes(1, 100_000)).unwrap();
        let small = fs.create(d, b"small", 0o644, ROOT).unwrap().ino;
        fs.write(small, 0, &random_bytes(2, 5000)).unwrap();
        fs.sync().unwrap();
    }
    oracle::assert_e2fsck_clean(&image);
    let big = extents(&image, "/d/big");
    assert_eq!(big.len(), 1, "debugfs's extents of a 25-block file: {big:?}");
    assert_eq!(big[0].1 - big[0].0 + 1, 25, "{big:?}");
    let small = extents(&image, "/d/small");
    assert_eq!(small.len(), 1, "debugfs's extents of a 2-block file: {small:?}");
}

/// A device that logs the byte offset of every write.
struct WriteLog {
    inner: uext4::dev::MemDevice,
    writes: std::sync::Mutex<Vec<u64>>,
}

impl uext4::dev::BlockDevice for WriteLog {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> uext4::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> uext4::Result<()> {
        self.writes.lock().unwrap().push(offset);
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> uext4::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn stats(&self) -> uext4::dev::IoStats {
        self.inner.stats()
    }
}

/// Small files' new blocks wait for the commit (cache/write_behind.rs): the
/// writes put nothing on the device; the commit sends every waiting block, in
/// block order, before its commit block; a read or overwrite of a waiting
/// block sees and keeps the latest bytes; and the kernel reads every file back.
/// Files written round-robin in eight directories, as seed 000's experiment
/// makes them, so that their blocks are not written in the order they came.
#[test]
fn small_files_new_blocks_go_to_the_device_sorted_before_their_commit() {
    if !oracle::require_e2fsprogs() || !oracle::require_loop() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("behind.img");
    mkfs(&image, "64M");
    let dev = Arc::new(WriteLog {
        inner: uext4::dev::MemDevice::new(std::fs::read(&image).unwrap()),
        writes: Default::default(),
    });
    let opts = Options { read_only: false, commit_interval_secs: 3600, ..Options::default() };
    let fs = Filesystem::open_device(dev.clone(), opts).unwrap();
    let dirs: Vec<u32> =
        (0..8).map(|d| fs.mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, ROOT).unwrap().ino).collect();
    let content = |d: usize, f: usize| random_bytes((d * 100 + f) as u64, 1000 + d * 300);
    let mut files = Vec::new();
    let before = dev.writes.lock().unwrap().len();
    for f in 0..4 {
        for (d, &dir) in dirs.iter().enumerate() {
            let ino = fs.create(dir, format!("f{f}").as_bytes(), 0o644, ROOT).unwrap().ino;
            assert_eq!(fs.write(ino, 0, &content(d, f)).unwrap(), content(d, f).len());
            files.push((d, f, ino));
        }
    }
    // Read into a local: a guard held while the assertion unwinds would
    // deadlock the close's writes.
    let after = dev.writes.lock().unwrap().len();
    assert_eq!(after, before, "32 small files' data waits (and no commit fell)");
    let blocks: BTreeMap<u64, u32> = files
        .iter()
        .map(|&(_, _, ino)| match fs.map_blocks(ino, &fs.inode(ino).unwrap(), 0, 1).unwrap().kind {
            MapKind::Mapped(p) => (p * BS, ino),
            other => panic!("inode {ino}: {other:?}"),
        })
        .collect();
    let last = files[files.len() - 1].2;
    fs.fsync(last).unwrap();
    let log = dev.writes.lock().unwrap()[before..].to_vec();
    let data: Vec<u64> = log.iter().copied().filter(|o| blocks.contains_key(o)).collect();
    assert_eq!(data.len(), 32, "each waiting block written once: {log:?}");
    assert!(data.windows(2).all(|w| w[0] < w[1]), "in block order: {data:?}");
    let last_data = log.iter().rposition(|o| blocks.contains_key(o)).unwrap();
    assert!(last_data + 1 < log.len(), "the commit block comes after the data: {log:?}");

    // Waiting again: an overwrite inside the block patches it, a read sees it.
    let (d, f, ino) = files[3];
    let mut want = content(d, f);
    want.extend(random_bytes(7, 4096 - want.len()));
    fs.write(ino, 0, &want).unwrap_or_else(|e| panic!("rewrite of d{d}/f{f}: {e}"));
    let grown = fs.create(dirs[0], b"grown", 0o644, ROOT).unwrap().ino;
    fs.write(grown, 0, &[1u8; 100]).unwrap();
    fs.write(grown, 50, &[2u8; 100]).unwrap();
    let mut back = vec![0u8; 150];
    assert_eq!(fs.read(grown, 0, &mut back).unwrap(), 150);
    assert_eq!((&back[..50], &back[50..]), (&[1u8; 50][..], &[2u8; 100][..]), "a read of a waiting block");
    fs.sync().unwrap();
    drop(fs);
    std::fs::write(&image, dev.inner.contents()).unwrap();
    oracle::assert_e2fsck_clean(&image);
    let mount = oracle::Mount::new(&image, "ro");
    for &(d, f, _) in &files {
        let got = std::fs::read(mount.dir.join(format!("d{d}/f{f}"))).unwrap();
        let want = if (d, f) == (files[3].0, files[3].1) { want.clone() } else { content(d, f) };
        assert!(got == want, "the kernel reads d{d}/f{f} back as written");
    }
    let grown = std::fs::read(mount.dir.join("d0/grown")).unwrap();
    assert_eq!(grown, [&[1u8; 50][..], &[2u8; 100][..]].concat());
    mount.unmount();
}
