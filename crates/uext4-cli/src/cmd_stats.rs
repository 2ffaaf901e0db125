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
    let inline_max = inline_capacity(g.inode_size);
    let mut dir_entries = Histogram::default();
    let mut file_sizes = Histogram::default();
    let (mut files, mut dirs, mut inline_files, mut inline_dirs) = (0u64, 0u64, 0u64, 0u64);
    let (mut held_files, mut held_dirs) = (0u64, 0u64);
    fs.walk(ROOT_INO, &mut |_path, st| {
        match st.file_type {
            FileType::Regular => {
                files += 1;
                file_sizes.add(st.size);
                // The kernel makes a file inline at its first write when it fits;
                // an empty file is never written, so never inline.
                if st.size > 0 && st.size as usize <= inline_max {
                    inline_files += 1;
                }
            }
            FileType::Directory => {
                dirs += 1;
                let entries = fs.read_dir(st.ino)?;
                let names: Vec<_> = entries.iter().filter(|e| e.name != b"." && e.name != b"..").collect();
                dir_entries.add(names.len() as u64);
                if dir_fits_inline(names.iter().map(|e| e.name.len()), inline_max) {
                    inline_dirs += 1;
                }
            }
            _ => {}
        }
        if st.flags & uext4::format::inode::EXT4_INLINE_DATA_FL != 0 {
            match st.file_type {
                FileType::Directory => held_dirs += 1,
                _ => held_files += 1,
            }
        }
        Ok(())
    })?;
    dir_entries.print("directory size (entries, not counting . and ..)", "ents");
    println!();
    file_sizes.print("file size (bytes)", "bytes");
    println!();
    println!(
        "Inode size {} bytes: up to {inline_max} bytes fit inline (the kernel's rules: 60 in i_block, the rest in system.data)",
        g.inode_size
    );
    let pct = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            100.0 * a as f64 / b as f64
        }
    };
    println!(
        "  files that would fit inline:       {inline_files} of {files} ({:.1}%); inline in this image: {held_files}",
        pct(inline_files, files)
    );
    println!(
        "  directories that would fit inline: {inline_dirs} of {dirs} ({:.1}%); inline in this image: {held_dirs}",
        pct(inline_dirs, dirs)
    );
    if !g.has_inline_data {
        println!("  (this image has no inline_data feature: nothing is kept inline)");
    }
    Ok(())
}

/// The bytes a new inode of `inode_size` holds inline, as the kernel's
/// `ext4_get_max_inline_size` counts them for an inode with no other in-body
/// attribute: 60 in i_block plus the body after the 32 extra bytes, less the
/// xattr magic (4), the system.data entry (20) and the list's terminator (4).
/// 128-byte inodes have no body: nothing inline.
fn inline_capacity(inode_size: usize) -> usize {
    if inode_size <= 128 + 32 + 4 {
        return 0;
    }
    let region = inode_size - 128 - 32 - 4;
    match region.checked_sub(4 + 20) {
        Some(free) => 60 + (free & !3),
        None => 0,
    }
}

/// Whether a directory of names of these lengths, created in this order, stays
/// inline under the kernel's rules (`ext4_try_add_inline_entry`): each name goes
/// into the 56 bytes of i_block after the parent when it has room, else into the
/// system.data run (all the capacity beyond i_block).
fn dir_fits_inline(name_lens: impl Iterator<Item = usize>, capacity: usize) -> bool {
    if capacity < 60 {
        return false;
    }
    let (mut i_block, mut value) = (56usize, capacity - 60);
    for len in name_lens {
        let need = rec_len_for(len);
        if need <= i_block {
            i_block -= need;
        } else if need <= value {
            value -= need;
        } else {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_and_directories_follow_the_kernel() {
        assert_eq!((inline_capacity(128), inline_capacity(256), inline_capacity(512)), (0, 128, 384));
        // Two-byte names: 4 in i_block, 5 in system.data's 68 bytes.
        assert!(dir_fits_inline(std::iter::repeat_n(2, 9), 128));
        assert!(!dir_fits_inline(std::iter::repeat_n(2, 10), 128));
        assert!(dir_fits_inline(std::iter::empty(), 128));
        assert!(!dir_fits_inline(std::iter::empty(), 0));
    }
}
