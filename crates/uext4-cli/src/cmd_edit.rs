//! Small changes inside an image: mkdir, rm, mv, ln, truncate, chmod, chown,
//! setfattr and getfattr. Operands are resolved with `target::resolve`.
//!
//! Every operand is checked before anything changes: one the command cannot act on
//! (`rm IMG:/.`, `mkdir IMG:/`, a missing file for chmod, a name longer than 255
//! bytes...) fails the whole command with the image untouched, byte for byte. As a
//! writable open is itself a change (it may replay the journal and it updates the
//! journal superblock), each command runs twice (`check_then_apply`): on a
//! read-only open it checks and stops short of any change, then on a writable open
//! it checks again and acts. Only mkdir, whose later operands may live in
//! directories its earlier ones create, checks the rest as it goes. Messages are
//! GNU coreutils' (`rm: cannot remove 'IMG:/x': ...`).

use crate::show::{escape, CliResult, Context, Failure};
use crate::target::{check_then_apply, dir_behind, follow, parse_target, resolve, Last, Pass, Target};
use std::path::Path;
use uext4::{Error, FileType, Filesystem, Owner, SetAttr};

/// New inodes belong to whoever runs the command, as with the host's tools.
fn me() -> Owner {
    // SAFETY: geteuid and getegid have no preconditions.
    unsafe { Owner { uid: libc::geteuid(), gid: libc::getegid() } }
}

/// Fails with every refusal found (saying the image was left alone), or passes if
/// there were none.
fn refuse_any(command: &str, mut refused: Vec<Failure>) -> CliResult<()> {
    if refused.is_empty() {
        return Ok(());
    }
    refused.push(Failure::refused(format!("{command}: nothing was changed")));
    Err(Failure::all(refused))
}

/// Resolves every operand to the inode it acts on (a final symlink followed), or
/// fails with all that cannot be found, before a command changes anything.
fn resolve_all(
    command: &str,
    fs: &Filesystem,
    targets: &[Target],
    context: impl Fn(&Target) -> String,
) -> CliResult<Vec<u32>> {
    let mut inos = Vec::new();
    let mut refused = Vec::new();
    for t in targets {
        match resolve(fs, t).and_then(|r| follow(fs, t, &r)) {
            Ok(ino) => inos.push(ino),
            Err(e) => refused.push(Failure::about(&context(t), &e)),
        }
    }
    refuse_any(command, refused)?;
    Ok(inos)
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

pub fn mkdir(a: MkdirArgs) -> CliResult<()> {
    check_then_apply("mkdir", &a.targets.iter().collect::<Vec<_>>(), |fs, pass| {
        let cannot = |t: &Target| format!("mkdir: cannot create directory {}", t.quoted());
        // '.', '..' and the root always exist: without -p that is EEXIST (or whatever
        // keeps the path from resolving), reported before anything is made. A
        // missing parent is no refusal: an earlier operand may make it.
        let mut refused = Vec::new();
        for t in &a.targets {
            let named = matches!(t.last(), Last::Name(_));
            match resolve(fs, t) {
                Err(Error::NotFound(_)) if named => {}
                Err(e) => refused.push(Failure::about(&cannot(t), &e)),
                Ok(r) if (!named || r.ino.is_some()) && !a.parents => {
                    refused.push(Failure::about(&cannot(t), &Error::Exists(t.shown())))
                }
                Ok(_) => {}
            }
        }
        refuse_any("mkdir", refused)?;
        if pass == Pass::Check {
            return Ok(());
        }
        for (i, t) in a.targets.iter().enumerate() {
            if a.parents {
                make_parents(fs, t, a.mode).context(|| cannot(t))?;
            } else {
                let r = resolve(fs, t).change(i > 0, || cannot(t))?;
                let (parent, name) = r.entry().expect("operands without a name were refused above");
                fs.mkdir(parent, name, a.mode, me()).change(i > 0, || cannot(t))?;
            }
        }
        Ok(())
    })
}

/// mkdir -p: each prefix of the path in turn, made if missing; an existing one must
/// be a directory or a symlink to one.
fn make_parents(fs: &Filesystem, t: &Target, mode: u16) -> uext4::Result<()> {
    let mut prefix = Target { image: t.image.clone(), path: Vec::new() };
    for comp in t.path.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
        prefix.path.push(b'/');
        prefix.path.extend_from_slice(comp);
        let r = resolve(fs, &prefix)?;
        match (r.ino, r.entry()) {
            (None, Some((parent, name))) => {
                fs.mkdir(parent, name, mode, me())?;
            }
            (Some(_), _) => {
                if dir_behind(fs, &prefix, &r)?.is_none() {
                    return Err(Error::Exists(format!("{} exists and is not a directory", prefix.shown())));
                }
            }
            (None, None) => unreachable!("'.', '..' and the root always resolve to an inode"),
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct RmArgs {
    /// Remove directories and their contents
    #[arg(short = 'r', short_alias = 'R')]
    recursive: bool,
    /// Ignore paths that do not exist
    #[arg(short = 'f')]
    force: bool,
    /// IMAGE:/path... (or paths inside a uext4 mount)
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

/// Trees with more names than this show progress on a terminal.
const PROGRESS_NAMES: u64 = 2_000;

/// Removes `name` and everything below it through the library's
/// `remove_tree` (in inode order; see ns/remove_tree.rs), with a count of
/// names removed on stderr when it is a terminal and the tree is big.
fn remove_tree(fs: &Filesystem, parent: u32, name: &[u8]) -> uext4::Result<()> {
    use std::io::{IsTerminal, Write};
    use std::time::{Duration, Instant};
    let mut last = std::io::stderr().is_terminal().then(Instant::now);
    let mut shown = false;
    let removed = fs.remove_tree_with_progress(parent, name, &mut |r| {
        if let Some(last) = last.as_mut() {
            if r.names > PROGRESS_NAMES && last.elapsed() > Duration::from_millis(100) {
                eprint!("\r{} names removed ({} directories)", r.names, r.directories);
                let _ = std::io::stderr().flush();
                *last = Instant::now();
                shown = true;
            }
        }
        std::ops::ControlFlow::Continue(())
    })?;
    if shown {
        eprintln!("\r{} names removed ({} directories)", removed.names, removed.directories);
    }
    Ok(())
}

/// `rm` of a host path inside a uext4 mount (an operand without `IMAGE:`):
/// the mount's daemon removes it with remove_tree. GNU rm's refusals and
/// messages; the root of the mount is refused as --preserve-root does.
fn rm_in_mount(path: &Path, mountpoint: &Path, a: &RmArgs) -> CliResult<()> {
    use std::os::unix::ffi::OsStrExt;
    let shown = format!("'{}'", path.display());
    let cannot = format!("rm: cannot remove {shown}");
    // The last component as written (Path would read "d/." as "d").
    let bytes = path.as_os_str().as_bytes();
    let trimmed = &bytes[..bytes.iter().rposition(|&c| c != b'/').map_or(0, |i| i + 1)];
    let (parent, name) = match trimmed.iter().rposition(|&c| c == b'/') {
        Some(i) => (&trimmed[..i.max(1)], &trimmed[i + 1..]),
        None => (&b"."[..], trimmed),
    };
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Failure::refused(format!("rm: refusing to remove '.' or '..' directory: {shown}")));
    }
    let md = match std::fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(e) if a.force && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Failure::about(&cannot, &Error::Io(e))),
    };
    if md.is_dir() && std::fs::canonicalize(path).ok().as_deref() == Some(mountpoint) {
        return Err(Failure::refused(format!(
            "rm: it is dangerous to operate on {shown}, the mount's root: refusing, as --preserve-root does"
        )));
    }
    if md.is_dir() && !a.recursive {
        return Err(Failure::about(&cannot, &Error::IsADirectory(String::new())));
    }
    let parent = Path::new(std::ffi::OsStr::from_bytes(parent));
    crate::cmd_mount::remove_tree_in_mount(parent, name).map_err(|e| Failure::about(&cannot, &Error::Io(e)))
}

pub fn rm(a: RmArgs) -> CliResult<()> {
    // Operands naming a path inside a uext4 mount (no IMAGE: part) go to its daemon.
    let mut in_mounts = Vec::new();
    let mut on_images = Vec::new();
    for t in &a.targets {
        match (t.path == b"/").then(|| crate::cmd_mount::uext4_mount_holding(&t.image)).flatten() {
            Some(mountpoint) => in_mounts.push((t, mountpoint)),
            None => on_images.push(t.clone()),
        }
    }
    for (t, mountpoint) in &in_mounts {
        rm_in_mount(&t.image, mountpoint, &a)?;
    }
    if on_images.is_empty() {
        return Ok(());
    }
    let a = RmArgs { targets: on_images, ..a };
    check_then_apply("rm", &a.targets.iter().collect::<Vec<_>>(), |fs, pass| {
        let cannot = |t: &Target| format!("rm: cannot remove {}", t.quoted());
        // Every operand is judged first: a refusal leaves the image as it was.
        let mut refused = Vec::new();
        let mut doomed = Vec::new();
        for t in &a.targets {
            match t.last() {
                Last::Dot | Last::DotDot => {
                    refused.push(Failure::refused(format!(
                        "rm: refusing to remove '.' or '..' directory: {}",
                        t.quoted()
                    )));
                    continue;
                }
                Last::Root => {
                    refused.push(Failure::refused(format!(
                        "rm: it is dangerous to operate on {}, the image's root: refusing, as --preserve-root does",
                        t.quoted()
                    )));
                    continue;
                }
                Last::Name(_) => {}
            }
            let found = resolve(fs, t).and_then(|r| {
                // rm -r through a symlink's slash would leave GNU rm emptying the
                // directory it leads to and then failing on the link: refused whole.
                if a.recursive {
                    r.refuse_through_symlink(t)?;
                }
                r.existing(t)
            });
            match found {
                Ok(ino) => {
                    if fs.stat(ino).context(|| cannot(t))?.file_type == FileType::Directory && !a.recursive {
                        refused.push(Failure::about(&cannot(t), &Error::IsADirectory(String::new())));
                    } else {
                        doomed.push(t);
                    }
                }
                // rm -f ignores what is not there, as GNU's does (ENOENT and ENOTDIR).
                Err(Error::NotFound(_) | Error::NotADirectory(_)) if a.force => {}
                Err(e) => refused.push(Failure::about(&cannot(t), &e)),
            }
        }
        refuse_any("rm", refused)?;
        if pass == Pass::Check {
            return Ok(());
        }
        // Found by the check, so one gone now was inside an earlier operand's
        // tree (or named twice): GNU rm says ENOENT for it and ends with 1.
        let mut gone = Vec::new();
        for t in doomed {
            let r = match resolve(fs, t) {
                Ok(r) if r.ino.is_some() => r,
                Ok(_) | Err(Error::NotFound(_)) if a.force => continue,
                Ok(_) => {
                    gone.push(Failure::about(&cannot(t), &Error::NotFound(String::new())));
                    continue;
                }
                Err(e @ Error::NotFound(_)) => {
                    gone.push(Failure::about(&cannot(t), &e));
                    continue;
                }
                Err(e) => return Err(Failure::about(&cannot(t), &e)),
            };
            let (parent, name) = r.entry().expect("only named entries are doomed");
            remove_tree(fs, parent, name).context(|| cannot(t))?;
        }
        match gone.is_empty() {
            true => Ok(()),
            false => Err(Failure::all(gone)),
        }
    })
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

pub fn mv(a: MvArgs) -> CliResult<()> {
    let cannot = || format!("mv: cannot move {} to {}", a.from.quoted(), a.to.quoted());
    check_then_apply("mv", &[&a.from, &a.to], |fs, pass| {
        let from = resolve(fs, &a.from).context(cannot)?;
        let Some((src_dir, src_name)) = from.entry() else {
            // The kernel's rename refuses '.', '..' and the root with EBUSY.
            return Err(Failure::about(&cannot(), &Error::Busy("'.', '..' and the root cannot be moved".into())));
        };
        from.refuse_through_symlink(&a.from).context(cannot)?;
        let src = from.existing(&a.from).context(cannot)?;
        let to = resolve(fs, &a.to).context(cannot)?;
        let (dst_dir, dst_name) = match dir_behind(fs, &a.to, &to).context(cannot)? {
            Some(dir) => (dir, src_name),
            None => {
                let Some(entry) = to.entry() else { unreachable!("'.', '..' and the root are directories") };
                if to.ino.is_none()
                    && to.trailing_slash
                    && fs.stat(src).context(cannot)?.file_type != FileType::Directory
                {
                    return Err(Failure::about(&cannot(), &Error::NotADirectory(String::new())));
                }
                entry
            }
        };
        // What the kernel's rename refuses, found before the writable open.
        match refuse_rename(fs, src, dst_dir, dst_name) {
            Err(Error::Invalid(_)) => {
                return Err(Failure::refused(format!(
                    "mv: cannot move {} to a subdirectory of itself, {}",
                    a.from.quoted(),
                    a.to.quoted()
                )))
            }
            r => r.context(cannot)?,
        }
        if pass == Pass::Check {
            return Ok(());
        }
        fs.rename(src_dir, src_name, dst_dir, dst_name, 0).change(false, cannot)?;
        Ok(())
    })
}

/// rename(2)'s refusals: a directory moved under itself (EINVAL), a directory over
/// a non-directory (ENOTDIR) or the reverse (EISDIR), over a non-empty directory
/// (ENOTEMPTY).
fn refuse_rename(fs: &Filesystem, src: u32, dst_dir: u32, dst_name: &[u8]) -> uext4::Result<()> {
    let src_is_dir = fs.stat(src)?.file_type == FileType::Directory;
    if src_is_dir {
        // Up the '..' chain from the new parent; a damaged chain ends the walk.
        let mut dir = dst_dir;
        for _ in 0..65536 {
            if dir == src {
                return Err(Error::Invalid("a directory cannot move into itself".into()));
            }
            match fs.lookup(dir, b"..")? {
                Some(up) if up != dir => dir = up,
                _ => break,
            }
        }
    }
    let Some(dst) = fs.lookup(dst_dir, dst_name)? else { return Ok(()) };
    if dst == src {
        return Ok(());
    }
    let dst_is_dir = fs.stat(dst)?.file_type == FileType::Directory;
    match (src_is_dir, dst_is_dir) {
        (true, false) => Err(Error::NotADirectory(String::new())),
        (false, true) => Err(Error::IsADirectory(String::new())),
        (true, true) if fs.read_dir(dst)?.len() > 2 => Err(Error::NotEmpty(String::new())),
        _ => Ok(()),
    }
}

#[derive(clap::Args)]
pub struct LnArgs {
    /// Make a symbolic link holding TARGET as given
    #[arg(short = 's')]
    symbolic: bool,
    /// What to link to: a path in the same image (IMAGE:/x or /x), or a symlink's text
    target: String,
    /// IMAGE:/path of the new link (or a directory to make it in)
    #[arg(value_parser = parse_target)]
    link: Target,
}

pub fn ln(a: LnArgs) -> CliResult<()> {
    let kind = if a.symbolic { "symbolic" } else { "hard" };
    let cannot = || format!("ln: failed to create {kind} link {}", a.link.quoted());
    // The text as a path: IMAGE:/x names a file of that image, a bare path one of the link's.
    let mut source = if a.target.contains(":/") {
        Target::parse(&a.target).map_err(Failure::refused)?
    } else {
        Target { image: a.link.image.clone(), path: a.target.as_bytes().to_vec() }
    };
    let images = if a.symbolic {
        vec![&a.link]
    } else {
        if !source.path.starts_with(b"/") {
            source.path.insert(0, b'/');
        }
        vec![&source, &a.link]
    };
    check_then_apply("ln", &images, |fs, pass| {
        let link = resolve(fs, &a.link).context(cannot)?;
        // Into an existing directory under the target's own name, as ln does.
        let (parent, name) = match dir_behind(fs, &a.link, &link).context(cannot)? {
            Some(dir) => match source.last() {
                Last::Name(n) => (dir, n),
                _ => return Err(Failure::about(&cannot(), &Error::Exists(a.link.shown()))),
            },
            None => match link.entry() {
                Some(_) if link.ino.is_some() => return Err(Failure::about(&cannot(), &Error::Exists(String::new()))),
                // A name ending in '/' can only be made as a directory (the
                // kernel's link and symlink answer ENOENT).
                Some(_) if link.trailing_slash => {
                    return Err(Failure::about(&cannot(), &Error::NotFound(a.link.shown())))
                }
                Some((dir, n)) => (dir, n.to_vec()),
                None => unreachable!("'.', '..' and the root are directories"),
            },
        };
        // The same for a link made inside a directory.
        if link.ino.is_some() && fs.lookup(parent, &name).context(cannot)?.is_some() {
            return Err(Failure::about(&cannot(), &Error::Exists(String::from_utf8_lossy(&name).into_owned())));
        }
        let hard_link_to = if a.symbolic {
            None
        } else {
            let from = resolve(fs, &source)
                .and_then(|r| r.existing(&source))
                .context(|| format!("ln: failed to access {}", source.quoted()))?;
            if fs.stat(from).context(cannot)?.file_type == FileType::Directory {
                return Err(Failure::refused(format!("ln: {}: hard link not allowed for directory", source.quoted())));
            }
            Some(from)
        };
        if pass == Pass::Check {
            return Ok(());
        }
        match hard_link_to {
            Some(from) => fs.link(from, parent, &name).map(|_| ()),
            None => fs.symlink(parent, &name, a.target.as_bytes(), me()).map(|_| ()),
        }
        .change(false, cannot)?;
        Ok(())
    })
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

pub fn truncate(a: TruncateArgs) -> CliResult<()> {
    check_then_apply("truncate", &a.targets.iter().collect::<Vec<_>>(), |fs, pass| {
        let cannot = |t: &Target| format!("truncate: cannot open {} for writing", t.quoted());
        let inos = resolve_all("truncate", fs, &a.targets, cannot)?;
        let mut refused = Vec::new();
        for (t, &ino) in a.targets.iter().zip(&inos) {
            match fs.stat(ino).context(|| cannot(t))?.file_type {
                FileType::Regular => {}
                FileType::Directory => refused.push(Failure::about(&cannot(t), &Error::IsADirectory(String::new()))),
                _ => refused.push(Failure::about(&cannot(t), &Error::Invalid("not a regular file".into()))),
            }
        }
        refuse_any("truncate", refused)?;
        if pass == Pass::Check {
            return Ok(());
        }
        for (i, (t, &ino)) in a.targets.iter().zip(&inos).enumerate() {
            fs.setattr(ino, &SetAttr { size: Some(a.size), ..Default::default() })
                .change(i > 0, || format!("truncate: failed to truncate {} at {} bytes", t.quoted(), a.size))?;
        }
        Ok(())
    })
}

#[derive(clap::Args)]
pub struct ChmodArgs {
    /// Octal mode
    #[arg(value_parser = parse_mode)]
    mode: u16,
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

pub fn chmod(a: ChmodArgs) -> CliResult<()> {
    check_then_apply("chmod", &a.targets.iter().collect::<Vec<_>>(), |fs, pass| {
        let inos = resolve_all("chmod", fs, &a.targets, |t| format!("chmod: cannot access {}", t.quoted()))?;
        if pass == Pass::Check {
            return Ok(());
        }
        for (i, (t, &ino)) in a.targets.iter().zip(&inos).enumerate() {
            fs.setattr(ino, &SetAttr { perm: Some(a.mode), ..Default::default() })
                .change(i > 0, || format!("chmod: changing permissions of {}", t.quoted()))?;
        }
        Ok(())
    })
}

#[derive(clap::Args)]
pub struct ChownArgs {
    /// UID[:GID], numeric
    owner: String,
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

pub fn chown(a: ChownArgs) -> CliResult<()> {
    let bad = || Failure::refused(format!("chown: invalid owner '{}' (expected numeric UID[:GID])", a.owner));
    // An empty part leaves that id alone (`:GID`, `UID:`). 4294967295 is
    // (uid_t)-1, which chown(2) reads as "no change": GNU chown refuses it.
    let id = |text: &str| -> Result<Option<u32>, Failure> {
        match text {
            "" => Ok(None),
            _ => text.parse::<u32>().ok().filter(|&v| v != u32::MAX).map(Some).ok_or_else(bad),
        }
    };
    let (uid, gid) = match a.owner.split_once(':') {
        Some((u, g)) => (id(u)?, id(g)?),
        None => (id(&a.owner)?, None),
    };
    if uid.is_none() && gid.is_none() && a.owner != ":" {
        return Err(bad());
    }
    check_then_apply("chown", &a.targets.iter().collect::<Vec<_>>(), |fs, pass| {
        let inos = resolve_all("chown", fs, &a.targets, |t| format!("chown: cannot access {}", t.quoted()))?;
        if pass == Pass::Check {
            return Ok(());
        }
        for (i, (t, &ino)) in a.targets.iter().zip(&inos).enumerate() {
            fs.setattr(ino, &SetAttr { uid, gid, ..Default::default() })
                .change(i > 0, || format!("chown: changing ownership of {}", t.quoted()))?;
        }
        Ok(())
    })
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

pub fn setfattr(a: SetfattrArgs) -> CliResult<()> {
    if a.name.is_some() == a.remove.is_some() {
        return Err(Failure::refused("setfattr: give exactly one of -n NAME or -x NAME"));
    }
    check_then_apply("setfattr", &a.targets.iter().collect::<Vec<_>>(), |fs, pass| {
        let inos = resolve_all("setfattr", fs, &a.targets, |t| format!("setfattr: {}", t.quoted()))?;
        if pass == Pass::Check {
            return Ok(());
        }
        for (i, (t, &ino)) in a.targets.iter().zip(&inos).enumerate() {
            let done = match (&a.name, &a.remove) {
                (Some(n), _) => fs.set_xattr(ino, n.as_bytes(), a.value.as_bytes(), 0),
                (_, Some(n)) => fs.remove_xattr(ino, n.as_bytes()),
                (None, None) => unreachable!("checked above"),
            };
            done.change(i > 0, || format!("setfattr: {}", t.quoted()))?;
        }
        Ok(())
    })
}

#[derive(clap::Args)]
pub struct GetfattrArgs {
    /// Only this attribute
    #[arg(short = 'n')]
    name: Option<String>,
    #[arg(required = true, value_parser = parse_target)]
    targets: Vec<Target>,
}

pub fn getfattr(a: GetfattrArgs) -> CliResult<()> {
    for t in &a.targets {
        let context = || format!("getfattr: {}", t.quoted());
        let fs = Filesystem::open(&t.image, crate::target::options(true))
            .map_err(|e| Failure::refused(format!("getfattr: {e}")))?;
        crate::target::warn_if_in_use(&t.image, &fs);
        let ino = resolve(&fs, t).and_then(|r| follow(&fs, t, &r)).context(context)?;
        println!("# file: {}", escape(t.shown().as_bytes()));
        let mut found = false;
        for (name, value) in fs.xattrs(ino).context(context)? {
            if a.name.as_deref().is_some_and(|n| n.as_bytes() != name.as_slice()) {
                continue;
            }
            found = true;
            let shown = if value.iter().all(|&c| (0x20..0x7f).contains(&c)) {
                format!("\"{}\"", String::from_utf8_lossy(&value))
            } else {
                format!("0x{}", value.iter().map(|b| format!("{b:02x}")).collect::<String>())
            };
            println!("{}={shown}", escape(&name));
        }
        if !found && a.name.is_some() {
            return Err(Failure::refused(format!(
                "{}: {}: No such attribute",
                context(),
                a.name.as_deref().unwrap_or("")
            )));
        }
    }
    Ok(())
}
