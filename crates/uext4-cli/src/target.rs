//! `IMAGE:/path` arguments and opening images for the subcommands.

use std::path::PathBuf;
use uext4::{Filesystem, Options, Result};

/// An image and a path inside it.
#[derive(Clone, Debug)]
pub struct Target {
    pub image: PathBuf,
    pub path: Vec<u8>,
}

impl Target {
    /// Splits `IMAGE:/path` at the last ':' followed by '/'; a bare IMAGE means "/".
    pub fn parse(arg: &str) -> std::result::Result<Target, String> {
        match arg.rfind(":/") {
            Some(i) => Ok(Target { image: PathBuf::from(&arg[..i]), path: arg.as_bytes()[i + 1..].to_vec() }),
            None if arg.ends_with(':') => {
                Ok(Target { image: PathBuf::from(&arg[..arg.len() - 1]), path: b"/".to_vec() })
            }
            None => Ok(Target { image: PathBuf::from(arg), path: b"/".to_vec() }),
        }
    }

    pub fn shown(&self) -> String {
        format!("{}:{}", self.image.display(), String::from_utf8_lossy(&self.path))
    }
}

/// Options shared by the reading subcommands.
#[derive(clap::Args, Clone, Debug)]
pub struct OpenArgs {
    /// Read even when metadata checksums do not match
    #[arg(long)]
    pub ignore_checksums: bool,
    /// Buffer cache size in MiB
    #[arg(long, default_value_t = 256)]
    pub cache_mb: usize,
}

impl Default for OpenArgs {
    fn default() -> OpenArgs {
        OpenArgs { ignore_checksums: false, cache_mb: 256 }
    }
}

/// Opens an image read-only; one that a mount holds is read all the same, with a
/// warning on stderr (what is read may be stale or caught half-changed).
pub fn open_ro(image: &std::path::Path, args: &OpenArgs) -> Result<Filesystem> {
    let fs = Filesystem::open(
        image,
        Options {
            read_only: true,
            ignore_checksums: args.ignore_checksums,
            cache_mb: args.cache_mb,
            ..Options::default()
        },
    )?;
    warn_if_in_use(image, &fs);
    Ok(fs)
}

pub fn warn_if_in_use(image: &std::path::Path, fs: &Filesystem) {
    if let Some(who) = fs.in_use() {
        eprintln!("uext4: warning: {} is in use by {who}; what is read may be stale", image.display());
    }
}

pub fn parse_target(s: &str) -> std::result::Result<Target, String> {
    Target::parse(s)
}
