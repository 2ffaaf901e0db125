//! `uext4 demo`: the main job on a fresh machine.
//!
//! Makes an image with uext4's mkfs in a temporary directory and checks it with
//! e2fsck; fills it from a generated tree with uext4's own write path and checks it
//! again (e2fsck, and the kernel's view through a read-only loop mount when root);
//! then reads everything back with uext4 — walk, htree lookup, extraction — and
//! compares the extracted tree with the source byte for byte. Each step prints what
//! it did; any difference or e2fsck complaint fails the demo.

use crate::cmd_cp::{self, CpArgs};
use crate::target::{OpenArgs, Target};
use std::fs;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use uext4::mkfs::{mkfs, MkfsOptions};
use uext4::{Error, FileType, Filesystem, Options, Result, ROOT_INO};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Keep the temporary directory instead of deleting it
    #[arg(long)]
    keep: bool,
    /// Image size
    #[arg(long, default_value = "256M", value_parser = crate::cmd_mkfs::parse_size)]
    size: u64,
}

fn step(msg: &str) {
    println!("==> {msg}");
    let _ = std::io::stdout().flush();
}

fn tool(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}"))))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(Error::Invalid(format!("{what} failed ({}): {}", out.status, text.trim())));
    }
    Ok(text)
}

fn e2fsck(image: &Path) -> Result<()> {
    let out = tool(Command::new("e2fsck").arg("-fn").arg(image), "e2fsck -fn")?;
    let summary = out.lines().find(|l| l.contains(" files (")).unwrap_or("").trim();
    println!("    e2fsck -fn: clean ({summary})");
    Ok(())
}

/// A small tree with the shapes worth showing: a big directory (an htree), a deep
/// path, a large and a sparse file, symlinks, a hard link.
fn make_source_tree(root: &Path) -> Result<u64> {
    let mut files = 0;
    fs::create_dir_all(root.join("src/deep/a/b/c/d/e/f"))?;
    let big_dir = root.join("many");
    fs::create_dir(&big_dir)?;
    for i in 0..3000 {
        fs::write(big_dir.join(format!("entry-{i:05}-with-a-longer-name")), format!("file number {i}\n"))?;
        files += 1;
    }
    for i in 0..50 {
        let body: String = (0..i * 97).map(|k| char::from(b'a' + (k % 26) as u8)).collect();
        fs::write(root.join(format!("src/file{i}.txt")), body)?;
        files += 1;
    }
    fs::write(root.join("src/deep/a/b/c/d/e/f/leaf"), b"at the bottom\n")?;
    let blob: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    fs::write(root.join("blob.bin"), &blob)?;
    let sparse = fs::File::create(root.join("sparse.img"))?;
    sparse.set_len(64 << 20)?;
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(b"middle", 32 << 20)?;
    symlink("src/file3.txt", root.join("short-link"))?;
    symlink("x".repeat(300), root.join("long-link"))?;
    fs::hard_link(root.join("src/file7.txt"), root.join("hard-link"))?;
    Ok(files + 6)
}

/// Compares two host trees: names, types, sizes, contents, symlink targets.
fn compare_trees(a: &Path, b: &Path) -> Result<u64> {
    let mut n = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let (pa, pb) = (a.join(&rel), b.join(&rel));
        let (ma, mb) = (fs::symlink_metadata(&pa)?, fs::symlink_metadata(&pb)?);
        let differ = |what: &str| Err(Error::Invalid(format!("{}: {what} differs from the source", rel.display())));
        if ma.file_type() != mb.file_type() {
            return differ("type");
        }
        n += 1;
        if ma.is_dir() {
            let mut names_a: Vec<_> =
                fs::read_dir(&pa)?.map(|e| e.map(|e| e.file_name())).collect::<std::io::Result<_>>()?;
            // lost+found exists only on the image side.
            let mut names_b: Vec<_> = fs::read_dir(&pb)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<std::io::Result<Vec<_>>>()?
                .into_iter()
                .filter(|n| !(rel.as_os_str().is_empty() && n == "lost+found"))
                .collect();
            names_a.sort();
            names_b.sort();
            if names_a != names_b {
                return differ("directory listing");
            }
            stack.extend(names_a.into_iter().map(|name| rel.join(name)));
        } else if ma.file_type().is_symlink() {
            if fs::read_link(&pa)? != fs::read_link(&pb)? {
                return differ("symlink target");
            }
        } else if ma.len() != mb.len() || fs::read(&pa)? != fs::read(&pb)? {
            return differ("content");
        }
    }
    Ok(n)
}

pub fn run(a: DemoArgs) -> Result<()> {
    let dir = tempfile_dir()?;
    let result = run_in(&dir, &a);
    if a.keep {
        println!("kept {}", dir.display());
    } else {
        let _ = fs::remove_dir_all(&dir);
    }
    result
}

fn tempfile_dir() -> Result<PathBuf> {
    let base = std::env::temp_dir();
    for i in 0..1000u32 {
        let d = base.join(format!("uext4-demo-{}-{i}", std::process::id()));
        if fs::create_dir(&d).is_ok() {
            return Ok(d);
        }
    }
    Err(Error::Invalid("cannot create a temporary directory".into()))
}

fn run_in(dir: &Path, a: &DemoArgs) -> Result<()> {
    let image = dir.join("demo.img");
    let source = dir.join("source");
    step(&format!("uext4 mkfs {} --size {}M", image.display(), a.size >> 20));
    let sb = mkfs(&image, &MkfsOptions { size: a.size, label: "uext4-demo".into(), ..MkfsOptions::default() })?;
    println!(
        "    {} blocks of {} bytes, {} inodes in {} groups; features: {}",
        sb.s_blocks_count,
        sb.block_size(),
        sb.s_inodes_count,
        sb.group_count(),
        sb.feature_names().join(" ")
    );
    e2fsck(&image)?;

    step("generating a source tree");
    let count = make_source_tree(&source)?;
    println!("    {count} files, a 3,000-entry directory, an 8 MiB file, a 64 MiB sparse file, symlinks, a hard link");

    step("filling it with uext4 itself (uext4 cp -r source/. demo.img:/)");
    let started = std::time::Instant::now();
    let sources: Vec<PathBuf> = {
        let mut v: Vec<PathBuf> =
            fs::read_dir(&source)?.map(|e| e.map(|e| e.path())).collect::<std::io::Result<_>>()?;
        v.sort();
        v
    };
    crate::cmd_put::copy_in(&sources, &Target { image: image.clone(), path: b"/".to_vec() }, true, 1)
        .map_err(|f| Error::Invalid(f.to_string()))?;
    println!("    copied in {:.2} s", started.elapsed().as_secs_f64());
    e2fsck(&image)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        step("checking it through the kernel (loop mount read-only, compare with the source)");
        let mnt = dir.join("mnt");
        fs::create_dir_all(&mnt)?;
        tool(Command::new("mount").arg("-o").arg("ro,loop").arg(&image).arg(&mnt), "mount")?;
        let compared = compare_trees(&source, &mnt).map(|n| n - 1);
        let unmounted = tool(Command::new("umount").arg(&mnt), "umount");
        println!("    {} paths identical as the kernel sees them", compared?);
        unmounted?;
    } else {
        println!("    (not root: skipping the kernel check)");
    }

    step("reading it back with uext4");
    let fs = Filesystem::open(&image, Options::default())?;
    let (mut files, mut dirs, mut bytes) = (0u64, 0u64, 0u64);
    fs.walk(ROOT_INO, &mut |_, st| {
        match st.file_type {
            FileType::Directory => dirs += 1,
            _ => {
                files += 1;
                bytes += st.size;
            }
        }
        Ok(())
    })?;
    println!("    walked {dirs} directories and {files} other inodes, {bytes} bytes of file data");
    let many = fs.lookup_path(b"/many")?;
    let found = fs.lookup(many, b"entry-01234-with-a-longer-name")?.is_some();
    println!("    htree lookup in /many: {}", if found { "found entry-01234" } else { "MISSING" });
    let cache = fs.cache().stats();
    println!(
        "    buffer cache: {} hits, {} misses, {} checksums verified (each block once)",
        cache.hits, cache.misses, cache.checksum_verifications
    );
    drop(fs);

    step("uext4 cp -r demo.img:/ extracted/ and comparing with the source");
    let out = dir.join("extracted");
    fs::create_dir(&out)?;
    cmd_cp::run(CpArgs::new(Target { image: image.clone(), path: b"/".to_vec() }, out.clone(), OpenArgs::default()))
        .map_err(|f| Error::Invalid(f.to_string()))?;
    // lost+found exists only in the image.
    fs::remove_dir(out.join("lost+found"))?;
    let compared = compare_trees(&source, &out)?;
    println!("    {compared} paths identical");
    step("done: uext4 made and filled an image that e2fsck and the kernel accept, and read back exactly what was put in it");
    Ok(())
}
