//! `uext4 stats IMAGE`: fsstats-style histograms (the inline-data proposal's
//! measurements): directory sizes in entries, file sizes in bytes, and how many
//! files and directories would fit inline with this image's inode size.

use crate::target::{open_ro, OpenArgs};
use std::path::PathBuf;
use uext4::format::dirent::rec_len_for;
use uext4::{FileType, Result, ROOT_INO};

#[derive(clap::Args)]
pub struct StatsArgs {
    /// The image file or block device
    image: PathBuf,
    #[command(flatten)]
    open: OpenArgs,
}

/// Power-of-two buckets: bucket k holds values in [2^(k-1), 2^k), bucket 0 holds 0.
#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

impl Histogram {
    fn add(&mut self, v: u64) {
        let k = if v == 0 { 0 } else { 64 - v.leading_zeros() as usize };
        if self.counts.len() <= k {
            self.counts.resize(k + 1, 0);
        }
        self.counts[k] += 1;
        self.total += 1;
    }

    fn print(&self, title: &str, unit: &str) {
        println!("{title}");
        println!("  {:>22} {:>10} {:>8} {:>8}", format!("range ({unit})"), "count", "%", "cum %");
        let mut cum = 0;
        for (k, &c) in self.counts.iter().enumerate() {
            if c == 0 {
                continue;
            }
            cum += c;
            let range = if k == 0 { "0".to_string() } else { format!("{}-{}", 1u64 << (k - 1), (1u64 << k) - 1) };
            let pct = 100.0 * c as f64 / self.total as f64;
            let cpct = 100.0 * cum as f64 / self.total as f64;
            println!("  {range:>22} {c:>10} {pct:>7.2}% {cpct:>7.2}%");
        }
        println!("  {:>22} {:>10}", "total", self.total);
    }
}

pub fn run(a: StatsArgs) -> Result<()> {
    let fs = open_ro(&a.image, &a.open)?;
    let g = fs.geometry().clone();
    // Inline capacity: 60 bytes of i_block plus what the xattr area can give the
    // system.data value (header 4 + entry 20 + terminator 4 bytes of overhead).
    let ibody = g.inode_size.saturating_sub(128 + 32);
    let xattr_room = ibody.saturating_sub(4 + 20 + 4);
    let inline_max = if g.inode_size > 128 { 60 + xattr_room } else { 60 };
    let mut dir_entries = Histogram::default();
    let mut file_sizes = Histogram::default();
    let (mut files, mut dirs, mut inline_files, mut inline_dirs, mut already_inline) = (0u64, 0u64, 0u64, 0u64, 0u64);
    fs.walk(ROOT_INO, &mut |_path, st| {
        match st.file_type {
            FileType::Regular => {
                files += 1;
                file_sizes.add(st.size);
                if st.size as usize <= inline_max {
                    inline_files += 1;
                }
            }
            FileType::Directory => {
                dirs += 1;
                let entries = fs.read_dir(st.ino)?;
                let names: Vec<_> = entries.iter().filter(|e| e.name != b"." && e.name != b"..").collect();
                dir_entries.add(names.len() as u64);
                // An inline directory keeps a 4-byte parent pointer and packed entries.
                let need: usize = 4 + names.iter().map(|e| rec_len_for(e.name.len())).sum::<usize>();
                if need <= inline_max {
                    inline_dirs += 1;
                }
            }
            _ => {}
        }
        if st.flags & uext4::format::inode::EXT4_INLINE_DATA_FL != 0 {
            already_inline += 1;
        }
        Ok(())
    })?;
    dir_entries.print("Directory sizes (entries, excluding . and ..)", "entries");
    println!();
    file_sizes.print("File sizes", "bytes");
    println!();
    println!("Inode size {} bytes: up to {inline_max} bytes fit inline", g.inode_size);
    let pct = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            100.0 * a as f64 / b as f64
        }
    };
    println!("  files that would fit inline:       {inline_files} of {files} ({:.1}%)", pct(inline_files, files));
    println!("  directories that would fit inline: {inline_dirs} of {dirs} ({:.1}%)", pct(inline_dirs, dirs));
    println!("  inodes already inline:             {already_inline}");
    Ok(())
}
