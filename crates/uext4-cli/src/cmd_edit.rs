//! Small changes inside an image: mkdir, rm, mv, ln, truncate, chmod, chown,
//! setfattr and getfattr. Each opens the image writable (getfattr read-only) once,
//! does its work through the library and syncs.

use crate::target::{parse_target, Target};
use uext4::{Error, FileType, Filesystem, Options, Owner, Result, SetAttr, ROOT_INO};

/// New inodes belong to whoever runs the command, as with the host's tools.
fn me() -> Owner {
    // SAFETY: geteuid and getegid have no preconditions.
    unsafe { Owner { uid: libc::geteuid(), gid: libc::getegid() } }
}

fn open_rw(t: &Target) -> Result<Filesystem> {
    Filesystem::open(&t.image, Options { read_only: false, ..Options::default() })
}

/// (parent inode, last name) of a path; the root has no parent.
fn split(fs: &Filesystem, t: &Target) -> Result<(u32, Vec<u8>)> {
    let path: Vec<&[u8]> = t.path.split(|&c| c == b'/').filter(|c| !c.is_empty()).collect();
    let Some((last, dirs)) = path.split_last() else {
        return Err(Error::Invalid(format!("{}: the root cannot be used here", t.shown())));
    };
    let mut parent_path = b"/".to_vec();
    parent_path.extend_from_slice(&dirs.join(&b'/'));
    Ok((fs.lookup_path(&parent_path)?, last.to_vec()))
}

fn same_image(targets: &[&Target]) -> Result<()> {
    if targets.windows(2).any(|w| w[0].image != w[1].image) {
        return Err(Error::Invalid("all paths must be in the same image".into()));
    }
    Ok(())
}

/// Opens the one image every target names, writable.
fn open_shared_image(targets: &[Target]) -> Result<Filesystem> {
    same_image(&targets.iter().collect::<Vec<_>>())?;
    open_rw(&targets[0])
}

fn parse_mode(s: &str) -> std::result::Result<u16, String> {
    u16::from_str_radix(s, 8).ok().filter(|m| *m <= 0o7777).ok_or_else(|| format!("'{s}' is not an octal mode"))
}

#[derive(clap::Args)]
pub struct MkdirArgs {
    /// Create missing parents; an existing directory is fine
    #[arg(short = 'p')]
    parents: bool,
    /// Permission bits, octal
    #[arg(short = 'm', default_value = "755", value_parser = parse_mode)]
    mode: u16,
    /// IMAGE:/path...
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

pub fn mkdir(a: MkdirArgs) -> Result<()> {
    let fs = open_shared_image(&a.targets)?;
    for t in &a.targets {
        if a.parents {
            let mut dir = ROOT_INO;
            for comp in t.path.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
                dir = match fs.lookup(dir, comp)? {
                    Some(ino) if fs.stat(ino)?.file_type == FileType::Directory => ino,
                    Some(_) => {
                        return Err(Error::Exists(format!("{}: a path component is not a directory", t.shown())))
                    }
                    None => fs.mkdir(dir, comp, a.mode, me())?.ino,
                };
            }
        } else {
            let (parent, name) = split(&fs, t)?;
            fs.mkdir(parent, &name, a.mode, me())?;
        }
    }
    fs.sync()
}

#[derive(clap::Args)]
pub struct RmArgs {
    /// Remove directories and their contents
    #[arg(short = 'r', short_alias = 'R')]
    recursive: bool,
    /// Ignore paths that do not exist
    #[arg(short = 'f')]
    force: bool,
    /// IMAGE:/path...
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

fn remove_tree(fs: &Filesystem, parent: u32, name: &[u8]) -> Result<()> {
    let ino = fs.lookup(parent, name)?.ok_or_else(|| Error::NotFound(String::from_utf8_lossy(name).into_owned()))?;
    if fs.stat(ino)?.file_type != FileType::Directory {
        return fs.unlink(parent, name);
    }
    for e in fs.read_dir(ino)? {
        if e.name != b"." && e.name != b".." {
            remove_tree(fs, ino, &e.name)?;
        }
    }
    fs.rmdir(parent, name)
}

pub fn rm(a: RmArgs) -> Result<()> {
    let fs = open_shared_image(&a.targets)?;
    for t in &a.targets {
        let (parent, name) = split(&fs, t)?;
        let result = match fs.lookup(parent, &name)? {
            None => Err(Error::NotFound(t.shown())),
            Some(ino) if fs.stat(ino)?.file_type == FileType::Directory => {
                if a.recursive {
                    remove_tree(&fs, parent, &name)
                } else {
                    Err(Error::Invalid(format!("{} is a directory (use -r)", t.shown())))
                }
            }
            Some(_) => fs.unlink(parent, &name),
        };
        match result {
            Err(Error::NotFound(_)) if a.force => {}
            r => r?,
        }
    }
    fs.sync()
}

#[derive(clap::Args)]
pub struct MvArgs {
    /// IMAGE:/from
    #[arg(value_parser = parse_target)]
    from: Target,
    /// IMAGE:/to (into it, if it is a directory)
    #[arg(value_parser = parse_target)]
    to: Target,
}

pub fn mv(a: MvArgs) -> Result<()> {
    same_image(&[&a.from, &a.to])?;
    let fs = open_rw(&a.from)?;
    let (src_dir, src_name) = split(&fs, &a.from)?;
    let (dst_dir, dst_name) = match fs.lookup_path(&a.to.path) {
        Ok(ino) if fs.stat(ino)?.file_type == FileType::Directory => (ino, src_name.clone()),
        _ => split(&fs, &a.to)?,
    };
    fs.rename(src_dir, &src_name, dst_dir, &dst_name, 0)?;
    fs.sync()
}

#[derive(clap::Args)]
pub struct LnArgs {
    /// Make a symbolic link holding TARGET as given
    #[arg(short = 's')]
    symbolic: bool,
    /// What to link to: a path in the same image (IMAGE:/x or /x), or a symlink's text
    target: String,
    /// IMAGE:/path of the new link
    #[arg(value_parser = parse_target)]
    link: Target,
}

pub fn ln(a: LnArgs) -> Result<()> {
    let fs = open_rw(&a.link)?;
    let (parent, name) = split(&fs, &a.link)?;
    if a.symbolic {
        fs.symlink(parent, &name, a.target.as_bytes(), me())?;
    } else {
        let path = match a.target.rfind(":/") {
            Some(i) => a.target[i + 1..].to_string(),
            None => a.target.clone(),
        };
        let ino = fs.lookup_path(path.as_bytes())?;
        fs.link(ino, parent, &name)?;
    }
    fs.sync()
}

#[derive(clap::Args)]
pub struct TruncateArgs {
    /// New size (K, M, G, T suffixes)
    #[arg(short = 's', value_parser = crate::cmd_mkfs::parse_size)]
    size: u64,
    /// IMAGE:/path...
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

pub fn truncate(a: TruncateArgs) -> Result<()> {
    let fs = open_shared_image(&a.targets)?;
    for t in &a.targets {
        let ino = fs.lookup_path(&t.path)?;
        fs.setattr(ino, &SetAttr { size: Some(a.size), ..Default::default() })?;
    }
    fs.sync()
}

#[derive(clap::Args)]
pub struct ChmodArgs {
    /// Octal mode
    #[arg(value_parser = parse_mode)]
    mode: u16,
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

pub fn chmod(a: ChmodArgs) -> Result<()> {
    let fs = open_shared_image(&a.targets)?;
    for t in &a.targets {
        fs.setattr(fs.lookup_path(&t.path)?, &SetAttr { perm: Some(a.mode), ..Default::default() })?;
    }
    fs.sync()
}

#[derive(clap::Args)]
pub struct ChownArgs {
    /// UID[:GID], numeric
    owner: String,
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

pub fn chown(a: ChownArgs) -> Result<()> {
    let bad = || Error::Invalid(format!("'{}' is not UID[:GID]", a.owner));
    let (uid, gid) = match a.owner.split_once(':') {
        Some((u, g)) => (Some(u.parse().map_err(|_| bad())?), Some(g.parse().map_err(|_| bad())?)),
        None => (Some(a.owner.parse().map_err(|_| bad())?), None),
    };
    let fs = open_shared_image(&a.targets)?;
    for t in &a.targets {
        fs.setattr(fs.lookup_path(&t.path)?, &SetAttr { uid, gid, ..Default::default() })?;
    }
    fs.sync()
}

#[derive(clap::Args)]
pub struct SetfattrArgs {
    /// Attribute name, e.g. user.comment
    #[arg(short = 'n')]
    name: Option<String>,
    /// Value (text)
    #[arg(short = 'v', default_value = "")]
    value: String,
    /// Remove the attribute with this name
    #[arg(short = 'x')]
    remove: Option<String>,
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

pub fn setfattr(a: SetfattrArgs) -> Result<()> {
    let fs = open_shared_image(&a.targets)?;
    for t in &a.targets {
        let ino = fs.lookup_path(&t.path)?;
        match (&a.name, &a.remove) {
            (Some(n), None) => fs.set_xattr(ino, n.as_bytes(), a.value.as_bytes(), 0)?,
            (None, Some(n)) => fs.remove_xattr(ino, n.as_bytes())?,
            _ => return Err(Error::Invalid("give exactly one of -n NAME or -x NAME".into())),
        }
    }
    fs.sync()
}

#[derive(clap::Args)]
pub struct GetfattrArgs {
    /// Only this attribute
    #[arg(short = 'n')]
    name: Option<String>,
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

pub fn getfattr(a: GetfattrArgs) -> Result<()> {
    for t in &a.targets {
        let fs = Filesystem::open(&t.image, Options::default())?;
        crate::target::warn_if_in_use(&t.image, &fs);
        let ino = fs.lookup_path(&t.path)?;
        println!("# file: {}", t.shown());
        let mut found = false;
        for (name, value) in fs.xattrs(ino)? {
            if a.name.as_deref().is_some_and(|n| n.as_bytes() != name.as_slice()) {
                continue;
            }
            found = true;
            let shown = if value.iter().all(|&c| (0x20..0x7f).contains(&c)) {
                format!("\"{}\"", String::from_utf8_lossy(&value))
            } else {
                format!("0x{}", value.iter().map(|b| format!("{b:02x}")).collect::<String>())
            };
            println!("{}={shown}", String::from_utf8_lossy(&name));
        }
        if !found && a.name.is_some() {
            return Err(Error::NotFound(format!("{}: no attribute {}", t.shown(), a.name.as_deref().unwrap_or(""))));
        }
    }
    Ok(())
}
