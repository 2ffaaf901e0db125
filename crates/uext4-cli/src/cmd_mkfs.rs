//! `uext4 mkfs IMAGE --size 1G [...]`: make a new ext4 filesystem.

use std::path::PathBuf;
use uext4::mkfs::{mkfs, MkfsOptions};
pub use uext4::tunables::parse_size;
use uext4::{Error, Filesystem, Options, Result};

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
    /// Filesystem UUID: 8-4-4-4-12 hex digits, `random` (the default), `time` (random
    /// here too) or `clear` (all zero), as mkfs.ext4 -U
    #[arg(short = 'U', value_parser = parse_uuid)]
    pub uuid: Option<Uuid>,
    /// Extended options, comma-separated: hash_seed=UUID (the directory hash seed, as
    /// mkfs.ext4 -E hash_seed=)
    #[arg(short = 'E', value_delimiter = ',')]
    pub extended: Vec<String>,
    /// Fill the new filesystem from this host directory, as mkfs.ext4 -d: written home
    /// directly (no journal traffic), in name order, times from SOURCE_DATE_EPOCH when set
    #[arg(short = 'd')]
    pub root_dir: Option<PathBuf>,
    /// Print nothing on success
    #[arg(short = 'q')]
    pub quiet: bool,
}

/// A UUID as mkfs.ext4 takes it; None: a random one.
#[derive(Clone, Copy, Debug)]
pub struct Uuid(Option<[u8; 16]>);

pub fn parse_uuid(s: &str) -> std::result::Result<Uuid, String> {
    match s {
        "random" | "time" => return Ok(Uuid(None)),
        "clear" | "null" => return Ok(Uuid(Some([0; 16]))),
        _ => {}
    }
    let hex: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
    let groups: Vec<usize> = s.split('-').map(str::len).collect();
    if hex.len() != 32 || groups != [8, 4, 4, 4, 12] {
        return Err(format!("'{s}' is not a UUID (8-4-4-4-12 hex digits, random, time or clear)"));
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).map_err(|_| format!("'{s}' is not a UUID"))?;
        out[i] = u8::from_str_radix(text, 16).map_err(|_| format!("'{s}' is not a UUID (bad hex digit)"))?;
    }
    Ok(Uuid(Some(out)))
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
    let mut hash_seed = None;
    for option in a.extended.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        match option.split_once('=') {
            Some(("hash_seed", value)) => hash_seed = parse_uuid(value).map_err(Error::Invalid)?.0,
            _ => return Err(Error::unsupported(format!("mkfs extended option '{option}' (only hash_seed=UUID)"))),
        }
    }
    let opts = MkfsOptions {
        size,
        region,
        uuid: a.uuid.and_then(|u| u.0),
        hash_seed,
        block_size: a.block_size,
        inode_size: a.inode_size,
        inodes: a.inodes,
        label: a.label,
        features: a.features,
        ..MkfsOptions::default()
    };
    let sb = mkfs(&a.image, &opts)?;
    if let Some(dir) = &a.root_dir {
        let fs = Filesystem::open(&a.image, Options { bypass_journal: true, ..crate::target::options(false) })?;
        crate::cmd_put::populate(&fs, dir)?;
        fs.sync()?;
    }
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
