//! `IMAGE:/path` arguments, opening images for the subcommands, and resolving an
//! operand inside an opened image.
//!
//! Every command resolves its operands with `resolve`, the way the kernel's path walk
//! does: components before the last are followed (symlinks included) and must be
//! directories, the last is looked up but not followed (unless the operand ends
//! in '/', which follows a final symlink to a directory), and whether it is a name,
//! `.`, `..` or the root is kept, so each command can refuse what it cannot act on
//! (`rm -r IMG:/.`) before it changes anything, which `check_then_apply` makes
//! true byte for byte.

use crate::show::{CliResult, Failure};
use std::path::PathBuf;
use uext4::{Error, FileType, Filesystem, Options, Result, ROOT_INO};

/// ext4's longest name; a longer component fails as the kernel's lookup fails.
const NAME_MAX: usize = 255;

/// An image and a path inside it.
#[derive(Clone, Debug)]
pub struct Target {
    pub image: PathBuf,
    pub path: Vec<u8>,
}

impl Target {
    /// Splits `IMAGE:/path` at the last ':' followed by '/'; a bare IMAGE means
    /// "/", and `IMAGE:path` (IMAGE existing, the whole argument not) "/path".
    pub fn parse(arg: &str) -> std::result::Result<Target, String> {
        match arg.rfind(":/") {
            Some(i) => Ok(Target { image: PathBuf::from(&arg[..i]), path: arg.as_bytes()[i + 1..].to_vec() }),
            None if arg.ends_with(':') => {
                Ok(Target { image: PathBuf::from(&arg[..arg.len() - 1]), path: b"/".to_vec() })
            }
            // IMAGE:path without the leading '/' (as scp takes a path): relative to
            // the root, when IMAGE exists and the whole argument does not (an
            // image's own name may hold a ':').
            None => match relative_operand(arg) {
                Some(i) => {
                    let path = [b"/".as_slice(), &arg.as_bytes()[i + 1..]].concat();
                    Ok(Target { image: PathBuf::from(&arg[..i]), path })
                }
                None => Ok(Target { image: PathBuf::from(arg), path: b"/".to_vec() }),
            },
        }
    }

    /// Whether `arg` names a path in an image (`IMAGE:/path`, `IMAGE:`, or
    /// `IMAGE:path` for an existing IMAGE) rather than a host path.
    pub fn names_image(arg: &str) -> bool {
        arg.contains(":/") || arg.ends_with(':') || relative_operand(arg).is_some()
    }

    pub fn shown(&self) -> String {
        format!("{}:{}", self.image.display(), String::from_utf8_lossy(&self.path))
    }

    /// What the last component is, from the text alone (nothing is looked up).
    pub fn last(&self) -> Last {
        match self.path.split(|&c| c == b'/').rfind(|c| !c.is_empty()) {
            None => Last::Root,
            Some(b".") => Last::Dot,
            Some(b"..") => Last::DotDot,
            Some(name) => Last::Name(name.to_vec()),
        }
    }

    /// The same image with `suffix` appended to the path.
    pub fn with_suffix(&self, suffix: &[u8]) -> Target {
        let mut path = self.path.clone();
        path.extend_from_slice(suffix);
        Target { image: self.image.clone(), path }
    }

    /// The operand quoted for a message.
    pub fn quoted(&self) -> String {
        crate::show::quoted(&self.shown())
    }
}

/// Where the ':' of `IMAGE:path` is, for a path without its leading '/' (as scp
/// takes one): when IMAGE exists and the whole argument does not (an image's
/// own name may hold a ':').
fn relative_operand(arg: &str) -> Option<usize> {
    let i = arg.rfind(':')?;
    (!std::path::Path::new(arg).exists() && std::path::Path::new(&arg[..i]).exists()).then_some(i)
}

/// What an operand's last component is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Last {
    /// The operand is the root itself (`IMG:/`, `IMG:`, `IMG://`).
    Root,
    Dot,
    DotDot,
    Name(Vec<u8>),
}

/// An operand resolved in an open image.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The directory the last component is looked up in (the root for the root).
    pub dir: u32,
    pub last: Last,
    /// The inode the operand names (a final symlink not followed); None if absent.
    pub ino: Option<u32>,
    /// The operand ends in '/': it must be a directory (or a symlink to one).
    pub trailing_slash: bool,
    /// The last component is a symlink that the trailing '/' followed: `ino`
    /// is the directory it leads to, while `entry()` is still the link's own
    /// name, which the kernel will not unlink, rmdir or rename through the
    /// slash (ENOTDIR).
    pub through_symlink: bool,
}

impl Resolved {
    /// The directory entry the operand names, if its last component is a plain name:
    /// the only kind of operand an entry can be made, removed or renamed at.
    pub fn entry(&self) -> Option<(u32, &[u8])> {
        match &self.last {
            Last::Name(n) => Some((self.dir, n)),
            _ => None,
        }
    }

    /// ENOTDIR for an operand whose trailing '/' went through a symlink: what
    /// the kernel's unlink, rmdir and rename answer for such a path.
    pub fn refuse_through_symlink(&self, t: &Target) -> Result<()> {
        match self.through_symlink {
            true => Err(Error::NotADirectory(t.shown())),
            false => Ok(()),
        }
    }

    /// The existing inode, or ENOENT naming the operand.
    pub fn existing(&self, t: &Target) -> Result<u32> {
        self.ino.ok_or_else(|| Error::NotFound(t.shown()))
    }
}

/// Resolves `t` in `fs` as the kernel's path walk would (see the module comment).
/// Fails only when a component before the last is missing or not a directory, or a
/// component is longer than ext4 allows; a missing last component is `ino: None`.
pub fn resolve(fs: &Filesystem, t: &Target) -> Result<Resolved> {
    let comps: Vec<&[u8]> = t.path.split(|&c| c == b'/').filter(|c| !c.is_empty()).collect();
    if let Some(long) = comps.iter().find(|c| c.len() > NAME_MAX) {
        return Err(Error::NameTooLong(format!("a name of {} bytes; ext4 allows {NAME_MAX}", long.len())));
    }
    let trailing_slash = t.path.len() > 1 && t.path.ends_with(b"/");
    let Some((_, dirs)) = comps.split_last() else {
        return Ok(Resolved {
            dir: ROOT_INO,
            last: Last::Root,
            ino: Some(ROOT_INO),
            trailing_slash: false,
            through_symlink: false,
        });
    };
    // A final "." makes lookup_path follow a symlink naming the directory itself.
    let mut dir_path = b"/".to_vec();
    for d in dirs {
        dir_path.extend_from_slice(d);
        dir_path.push(b'/');
    }
    dir_path.push(b'.');
    let dir = fs.lookup_path(&dir_path)?;
    if fs.stat(dir)?.file_type != FileType::Directory {
        return Err(Error::NotADirectory("a path component is not a directory".into()));
    }
    let (last, ino) = match Target::last(t) {
        Last::Root | Last::Dot => (Last::Dot, Some(dir)),
        Last::DotDot => {
            let parent = fs.lookup(dir, b"..")?;
            let parent = parent.ok_or_else(|| Error::corrupt("no '..' entry", format!("directory inode {dir}")))?;
            (Last::DotDot, Some(parent))
        }
        Last::Name(name) => {
            let ino = fs.lookup(dir, &name)?;
            (Last::Name(name), ino)
        }
    };
    let mut resolved = Resolved { dir, last, ino, trailing_slash, through_symlink: false };
    if let (true, Some(ino)) = (trailing_slash, ino) {
        match fs.stat(ino)?.file_type {
            FileType::Directory => {}
            // The trailing '/' follows a final symlink, as the kernel's walk
            // does: to a directory, or ENOTDIR, ENOENT (dangling) or ELOOP.
            FileType::Symlink => {
                let mut path = t.path.clone();
                while path.last() == Some(&b'/') {
                    path.pop();
                }
                path.extend_from_slice(b"/.");
                let target = fs.lookup_path(&path).map_err(|e| match e {
                    Error::NotADirectory(_) => Error::NotADirectory(t.shown()),
                    e => e,
                })?;
                if fs.stat(target)?.file_type != FileType::Directory {
                    return Err(Error::NotADirectory(t.shown()));
                }
                resolved.ino = Some(target);
                resolved.through_symlink = true;
            }
            _ => return Err(Error::NotADirectory(t.shown())),
        }
    }
    Ok(resolved)
}

/// Where in every image operand the filesystem lies (`--offset`, `--partition`):
/// set once from the command line before any image is opened.
static REGION: std::sync::OnceLock<uext4::dev::Region> = std::sync::OnceLock::new();

pub fn set_region(region: uext4::dev::Region) {
    let _ = REGION.set(region);
}

/// The region `--offset` or `--partition` named (the whole image otherwise).
pub fn region() -> uext4::dev::Region {
    REGION.get().copied().unwrap_or_default()
}

/// Writable opens bypass the journal (`cp --reproducible`): set before any open.
static BYPASS_JOURNAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn set_bypass_journal() {
    BYPASS_JOURNAL.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Options for opening an image given on the command line.
pub fn options(read_only: bool) -> Options {
    let bypass_journal = BYPASS_JOURNAL.load(std::sync::atomic::Ordering::Relaxed);
    Options { read_only, region: region(), bypass_journal, ..Options::default() }
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
        Options { ignore_checksums: args.ignore_checksums, cache_mb: args.cache_mb, ..options(true) },
    )?;
    warn_if_in_use(image, &fs);
    Ok(fs)
}

pub fn warn_if_in_use(image: &std::path::Path, fs: &Filesystem) {
    if let Some(who) = fs.in_use() {
        eprintln!("uext4: warning: {} is in use by {who}; what is read may be stale", image.display());
    }
}

/// The inode `t` names with a final symlink followed, as cat, chmod, chown,
/// truncate and the xattr commands act on it.
pub fn follow(fs: &Filesystem, t: &Target, r: &Resolved) -> Result<u32> {
    let ino = r.existing(t)?;
    if fs.stat(ino)?.file_type != FileType::Symlink {
        return Ok(ino);
    }
    // lookup_path follows every symlink but the last: a "." after it makes it one.
    fs.lookup_path(&t.with_suffix(b"/.").path)
}

/// The directory `t` names, following a final symlink (as mv, ln and cp decide
/// whether to go "into" their last operand); None if it is not one or is absent.
pub fn dir_behind(fs: &Filesystem, t: &Target, r: &Resolved) -> Result<Option<u32>> {
    if r.ino.is_none() {
        return Ok(None);
    }
    match follow(fs, t, r) {
        Ok(ino) if fs.stat(ino)?.file_type == FileType::Directory => Ok(Some(ino)),
        Ok(_) | Err(Error::NotFound(_)) | Err(Error::NotADirectory(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn same_image(command: &str, targets: &[&Target]) -> CliResult<()> {
    if targets.windows(2).any(|w| w[0].image != w[1].image) {
        return Err(Failure::refused(format!("{command}: all paths must be in the same image")));
    }
    Ok(())
}

/// Whether a command's body only checks (on a read-only open) or also acts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Check,
    Apply,
}

/// Runs `body` on a read-only open of the one image every target names, where it
/// checks every operand and returns before changing anything, then, if that
/// passed, on a writable open, where it acts; then syncs.
pub fn check_then_apply(
    command: &str,
    targets: &[&Target],
    body: impl Fn(&Filesystem, Pass) -> CliResult<()>,
) -> CliResult<()> {
    same_image(command, targets)?;
    let image = &targets[0].image;
    let opened = |e: Error| Failure::refused(format!("{command}: {e}"));
    // A mounted image's disk copy may lag what its holder serves, so the check
    // pass would judge stale state: who holds it is the first refusal.
    uext4::dev::check_unused(image, region()).map_err(opened)?;
    let fs = Filesystem::open(image, options(true)).map_err(opened)?;
    body(&fs, Pass::Check)?;
    drop(fs);
    let fs = open_rw(image).map_err(opened)?;
    if let Err(failure) = body(&fs, Pass::Apply) {
        // Closing a writable open writes (the journal superblock, at least): skip
        // that when the library refused before anything changed. Otherwise what
        // was done is written back whole, as it is consistent.
        if failure.untouched {
            fs.abandon();
        }
        return Err(failure);
    }
    fs.sync()?;
    Ok(())
}

/// Opens an image writable for the editing commands.
/// Says so when the image's last writer stopped without unmounting (a
/// killed daemon, a crash): the committed changes it left in the journal
/// have just been written home, as the kernel's mount logs "recovery complete".
pub fn open_rw(image: &std::path::Path) -> Result<Filesystem> {
    let fs = Filesystem::open(image, options(false))?;
    if fs.replayed_journal_blocks() > 0 {
        eprintln!(
            "uext4: {} was not unmounted cleanly: its journal was recovered ({} blocks written home)",
            image.display(),
            fs.replayed_journal_blocks()
        );
    }
    Ok(fs)
}

pub fn parse_target(s: &str) -> std::result::Result<Target, String> {
    Target::parse(s)
}
