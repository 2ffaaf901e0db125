//! Populating an image from a host tree: uext4 (mkfs + cp -r) against
//! `mkfs.ext4 -d` and the kernel (mkfs.ext4, loop mount, cp -a, umount), on images
//! of the same size with mke2fs 1.47's default features. Runs are interleaved
//! (A B C A B C ...) so machine drift hits every target alike; the report gives
//! medians, spread and each target's time relative to uext4's. Every image is
//! checked with e2fsck -fn afterwards (outside the timing).
//!
//! uext4 is measured three ways: `uext4 mkfs -d` (written home directly, as
//! mkfs.ext4 -d writes), the same under SOURCE_DATE_EPOCH with a fixed UUID and
//! hash seed (the reproducible mode), and `uext4 mkfs` + `uext4 cp -r` (through
//! the journal). `--src DIR` populates from an existing tree (e.g. /usr/include)
//! instead of a generated one.
//!
//! Usage: populate [--files N] [--total-mb N] [--src DIR] [--size MB] [--runs N] [--uext4 PATH] [--work DIR]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned()).unwrap_or_else(|| default.to_string())
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `files` files of varied small sizes adding up to about `total` bytes, 1,000 to a directory.
fn make_tree(root: &Path, files: usize, total: u64) {
    let avg = total / files as u64;
    for i in 0..files {
        let dir = root.join(format!("d{:04}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        let len = (avg / 2 + (i as u64 * 7919) % avg.max(1)) as usize;
        let body: Vec<u8> = (0..len).map(|k| (k as u64 ^ i as u64) as u8).collect();
        std::fs::write(dir.join(format!("file-{i:06}")), body).unwrap();
    }
}

/// A named way to populate the image.
type Target<'a> = (&'static str, Box<dyn Fn() + 'a>);

fn main() {
    let files: usize = arg("--files", "100000").parse().unwrap();
    let total_mb: u64 = arg("--total-mb", "1024").parse().unwrap();
    let runs: usize = arg("--runs", "3").parse().unwrap();
    let uext4 = PathBuf::from(arg("--uext4", "target/release/uext4"));
    let work = PathBuf::from(arg("--work", &std::env::temp_dir().join("uext4-bench-populate").display().to_string()));
    let given = arg("--src", "");
    let size = format!("{}M", arg("--size", &(total_mb * 3).to_string()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let src = if given.is_empty() {
        let src = work.join("src");
        eprintln!("making a host tree of {files} files, {total_mb} MiB ...");
        make_tree(&src, files, total_mb << 20);
        src
    } else {
        PathBuf::from(given)
    };
    run(&mut Command::new("sync"));
    let image = work.join("fs.img");
    let mnt = work.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    // uext4's mkfs picks 4 KiB blocks at this size; mkfs.ext4 is told the same.
    let uext4_mkfs_d = |reproducible: bool| {
        let mut cmd = Command::new(&uext4);
        cmd.args(["mkfs", "-q"]).arg(&image).args(["--size", &size]);
        if reproducible {
            cmd.env("SOURCE_DATE_EPOCH", "1700000000").args([
                "-U",
                "0f0e0d0c-0b0a-4908-8706-050403020100",
                "-E",
                "hash_seed=11111111-2222-4333-8444-555555555555",
            ]);
        }
        run(cmd.arg("-d").arg(&src));
    };
    let targets: [Target; 5] = [
        ("uext4 mkfs -d", Box::new(|| uext4_mkfs_d(false))),
        ("uext4 mkfs -d (SOURCE_DATE_EPOCH, -U, hash_seed)", Box::new(|| uext4_mkfs_d(true))),
        (
            "uext4 (mkfs + cp -r)",
            Box::new(|| {
                run(Command::new(&uext4).args(["mkfs", "-q"]).arg(&image).args(["--size", &size]));
                let mut cmd = Command::new(&uext4);
                cmd.args(["cp", "-r"]);
                for e in std::fs::read_dir(&src).unwrap() {
                    cmd.arg(e.unwrap().path());
                }
                run(cmd.arg(format!("{}:/", image.display())));
            }),
        ),
        (
            "mkfs.ext4 -d",
            Box::new(|| {
                run(Command::new("mkfs.ext4")
                    .args(["-q", "-F", "-b", "4096", "-O", "^resize_inode", "-d"])
                    .arg(&src)
                    .arg(&image)
                    .arg(&size));
            }),
        ),
        (
            "kernel (mkfs, mount, cp -a, umount)",
            Box::new(|| {
                run(Command::new("mkfs.ext4")
                    .args(["-q", "-F", "-b", "4096", "-O", "^resize_inode"])
                    .arg(&image)
                    .arg(&size));
                run(Command::new("mount").arg("-o").arg("loop").arg(&image).arg(&mnt));
                run(Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(&mnt));
                run(Command::new("umount").arg(&mnt));
            }),
        ),
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    for round in 0..runs {
        for (t, (name, go)) in targets.iter().enumerate() {
            let _ = std::fs::remove_file(&image);
            run(&mut Command::new("sync"));
            let start = Instant::now();
            go();
            let secs = start.elapsed().as_secs_f64();
            run(Command::new("e2fsck").arg("-fn").arg(&image));
            eprintln!("round {round}: {name}: {secs:.2} s");
            samples[t].push(secs);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let base = median(&samples[0]);
    println!("| target | median s | min..max s | time / uext4 mkfs -d's |");
    println!("|---|---|---|---|");
    for (t, (name, _)) in targets.iter().enumerate() {
        let s = &samples[t];
        let (lo, hi) = (s.iter().cloned().fold(f64::MAX, f64::min), s.iter().cloned().fold(0.0, f64::max));
        println!("| {name} | {:.2} | {lo:.2}..{hi:.2} | {:.2}x |", median(s), median(s) / base);
    }
    let _ = std::fs::remove_dir_all(&work);
}
