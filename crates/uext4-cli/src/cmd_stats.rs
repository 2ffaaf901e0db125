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

/// fsstats' histogram: buckets [0-1], [2-3], [4-7], ... with, per bucket, how many
/// items fall in it and how much of the total value (entries, bytes) they hold.
#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sums: Vec<u64>,
    total: u64,
    sum: u64,
    min: Option<u64>,
    max: u64,
}

impl Histogram {
    fn add(&mut self, v: u64) {
        let k = if v <= 1 { 0 } else { 63 - v.leading_zeros() as usize };
        if self.counts.len() <= k {
            self.counts.resize(k + 1, 0);
            self.sums.resize(k + 1, 0);
        }
        self.counts[k] += 1;
        self.sums[k] += v;
        self.total += 1;
        self.sum += v;
        self.min = Some(self.min.map_or(v, |m| m.min(v)));
        self.max = self.max.max(v);
    }

    fn print(&self, title: &str, unit: &str) {
        println!("{title}: range, count of items in range, % of items, cumulative %, total {unit} in range, % of {unit}, cumulative %");
        let avg = if self.total == 0 { 0.0 } else { self.sum as f64 / self.total as f64 };
        println!("  count={} avg={avg:.2} {unit}", self.total);
        println!("  min={} {unit} max={} {unit}", self.min.unwrap_or(0), self.max);
        let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
        let width = (64 - self.max.max(1).leading_zeros() as usize).div_ceil(3) + 1;
        let (mut cum, mut cum_sum) = (0, 0);
        for (k, (&c, &s)) in self.counts.iter().zip(&self.sums).enumerate() {
            if c == 0 {
                continue;
            }
            cum += c;
            cum_sum += s;
            let (lo, hi) = if k == 0 { (0, 1) } else { (1u64 << k, (1u64 << (k + 1)) - 1) };
            println!(
                "  [{lo:>w$}-{hi:>w$} {unit}]: {c:>8} ({:>6.2}%) ({:>6.2}% cumulative) {s:>14} {unit} ({:>6.2}%) ({:>6.2}% cumulative)",
                pct(c, self.total),
                pct(cum, self.total),
                pct(s, self.sum),
                pct(cum_sum, self.sum),
                w = width * 3 / 2
            );
        }
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
    dir_entries.print("directory size (entries, not counting . and ..)", "ents");
    println!();
    file_sizes.print("file size (bytes)", "bytes");
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
