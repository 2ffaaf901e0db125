//! `uext4 mkfs IMAGE --size 1G [...]`: make a new ext4 filesystem.

use std::path::PathBuf;
use uext4::mkfs::{mkfs, MkfsOptions};
use uext4::{Error, Result};

#[derive(clap::Args)]
pub struct MkfsArgs {
    /// Image file to create (overwritten if it exists) or block device
    pub image: PathBuf,
    /// Size, with an optional K, M, G or T suffix (powers of 1024); 8M to 1T.
    /// Optional with --offset or --partition: the rest of the image, or the partition
    #[arg(long, short = 's', value_parser = parse_size)]
    pub size: Option<u64>,
    /// Block size in bytes (default: 1024 below 512 MiB, else 4096, as mke2fs)
    #[arg(short = 'b')]
    pub block_size: Option<u32>,
    /// Inode size in bytes
    #[arg(short = 'I', default_value_t = 256)]
    pub inode_size: u16,
    /// Number of inodes (default: one per 16 KiB, or per 4 KiB below 512 MiB)
    #[arg(short = 'N')]
    pub inodes: Option<u64>,
    /// Volume label (up to 16 bytes)
    #[arg(short = 'L', default_value = "")]
    pub label: String,
    /// Features to add or, with ^, remove, comma-separated (e.g. inline_data,^has_journal)
    #[arg(short = 'O')]
    pub features: Vec<String>,
    /// Print nothing on success
    #[arg(short = 'q')]
    pub quiet: bool,
}

pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix '{c}' (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size '{s}' is too large"))
}

pub fn run(a: MkfsArgs) -> Result<()> {
    if a.image.as_os_str().is_empty() {
        return Err(Error::Invalid("no image path given".into()));
    }
    let region = crate::target::region();
    let size = match (a.size, region) {
        (Some(size), _) => size,
        (None, uext4::dev::Region::Whole) => return Err(Error::Invalid("--size is required".into())),
        (None, _) => 0,
    };
    let opts = MkfsOptions {
        size,
        region,
        block_size: a.block_size,
        inode_size: a.inode_size,
        inodes: a.inodes,
        label: a.label,
        features: a.features,
        ..MkfsOptions::default()
    };
    let sb = mkfs(&a.image, &opts)?;
    if !a.quiet {
        println!(
            "{}: {} blocks of {} bytes, {} inodes, {} groups; features: {}",
            a.image.display(),
            sb.s_blocks_count,
            sb.block_size(),
            sb.s_inodes_count,
            sb.group_count(),
            sb.feature_names().join(" ")
        );
    }
    Ok(())
}
