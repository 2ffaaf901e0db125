//! `uext4 ls`, `uext4 cat` and `uext4 stat`: looking at what is inside an image.
//! Names and symlink targets from the image are printed escaped (`show::escape`).

use crate::show::{CliResult, Context, Failure};
use crate::target::{follow, open_ro, parse_target, resolve, OpenArgs, Target};
use std::io::Write;
use uext4::extent::MapKind;
use uext4::format::inode::{Timestamp, EXT4_EXTENTS_FL, EXT4_INLINE_DATA_FL};
use uext4::{Error, FileType, Filesystem, Result};

#[derive(clap::Args)]
pub struct LsArgs {
    /// Long listing: type, mode, links, owner, size, mtime, name (and symlink target)
    #[arg(short = 'l')]
    long: bool,
    /// Include "." and ".."
    #[arg(short = 'a')]
    all: bool,
    /// IMAGE:/path (a directory or a file)
    #[arg(value_parser = parse_target)]
    target: Target,
    #[command(flatten)]
    open: OpenArgs,
}

#[derive(clap::Args)]
pub struct CatArgs {
    /// IMAGE:/path of a file
    #[arg(value_parser = parse_target)]
    target: Target,
    #[command(flatten)]
    open: OpenArgs,
}

#[derive(clap::Args)]
pub struct StatArgs {
    /// IMAGE:/path
    #[arg(value_parser = parse_target)]
    target: Target,
    #[command(flatten)]
    open: OpenArgs,
}

pub fn mode_string(ft: FileType, perm: u16) -> String {
    let mut s = String::with_capacity(10);
    s.push(ft.letter());
    let bits = [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o40, 'r'),
        (0o20, 'w'),
        (0o10, 'x'),
        (0o4, 'r'),
        (0o2, 'w'),
        (0o1, 'x'),
    ];
    for (i, (bit, c)) in bits.iter().enumerate() {
        let set = perm & bit != 0;
        let special = match i {
            2 => Some((0o4000, 's', 'S')),
            5 => Some((0o2000, 's', 'S')),
            8 => Some((0o1000, 't', 'T')),
            _ => None,
        };
        match special {
            Some((sbit, lower, upper)) if perm & sbit != 0 => s.push(if set { lower } else { upper }),
            _ => s.push(if set { *c } else { '-' }),
        }
    }
    s
}

pub fn format_time(t: Timestamp) -> String {
    // Civil date from days since the epoch (Howard Hinnant's algorithm, written out).
    let days = t.sec.div_euclid(86400);
    let secs = t.sec.rem_euclid(86400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:09}", secs / 3600, secs / 60 % 60, secs % 60, t.nsec)
}

fn show_name(name: &[u8]) -> String {
    crate::show::escape(name)
}

/// Opens the image read-only and finds the inode `t` names (a final symlink not
/// followed unless `follow_last`).
fn open_at(command: &str, t: &Target, open: &OpenArgs, follow_last: bool) -> CliResult<(Filesystem, u32)> {
    let fs = open_ro(&t.image, open).map_err(|e| Failure::refused(format!("{command}: {e}")))?;
    let cannot = || format!("{command}: cannot access {}", t.quoted());
    let r = resolve(&fs, t).context(cannot)?;
    let ino = if follow_last { follow(&fs, t, &r) } else { r.existing(t) }.context(cannot)?;
    Ok((fs, ino))
}

pub fn run_ls(a: LsArgs) -> CliResult<()> {
    let (fs, ino) = open_at("ls", &a.target, &a.open, false)?;
    let st = fs.stat(ino)?;
    let entries: Vec<(Vec<u8>, u32)> = if st.file_type == FileType::Directory {
        let mut v: Vec<_> = fs
            .read_dir(ino)?
            .into_iter()
            .filter(|e| a.all || (e.name != b"." && e.name != b".."))
            .map(|e| (e.name, e.ino))
            .collect();
        v.sort();
        v
    } else {
        vec![(a.target.path.rsplit(|&c| c == b'/').next().unwrap_or(b"").to_vec(), ino)]
    };
    let out = std::io::stdout();
    let mut out = out.lock();
    // As GNU ls: an entry that cannot be read is reported and the rest listed.
    let mut unreadable = Vec::new();
    for (name, ino) in entries {
        if a.long {
            let st = match fs.stat(ino) {
                Ok(st) => st,
                Err(e) => {
                    unreadable.push(Failure::about(&format!("ls: cannot access {}", show_name(&name)), &e));
                    continue;
                }
            };
            let mut line = format!(
                "{} {:>3} {:>5} {:>5} {:>10} {} {}",
                mode_string(st.file_type, st.perm),
                st.nlink,
                st.uid,
                st.gid,
                match st.file_type {
                    FileType::CharDevice | FileType::BlockDevice => format!("{}, {}", st.rdev.0, st.rdev.1),
                    _ => st.size.to_string(),
                },
                &format_time(st.mtime)[..16],
                show_name(&name)
            );
            if st.file_type == FileType::Symlink {
                line.push_str(" -> ");
                match fs.read_link(ino) {
                    Ok(target) => line.push_str(&show_name(&target)),
                    Err(e) => {
                        unreadable.push(Failure::about(&format!("ls: cannot read link {}", show_name(&name)), &e))
                    }
                }
            }
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "{}", show_name(&name))?;
        }
    }
    match unreadable.is_empty() {
        true => Ok(()),
        false => Err(Failure::all(unreadable)),
    }
}

pub fn run_cat(a: CatArgs) -> CliResult<()> {
    let (fs, ino) = open_at("cat", &a.target, &a.open, true)?;
    let st = fs.stat(ino)?;
    match st.file_type {
        FileType::Regular => {}
        FileType::Directory => {
            return Err(Failure::about(&format!("cat: {}", a.target.quoted()), &Error::IsADirectory(String::new())))
        }
        _ => {
            return Err(Failure::about(
                &format!("cat: {}", a.target.quoted()),
                &Error::Invalid("not a regular file".into()),
            ))
        }
    }
    let out = std::io::stdout();
    let mut out = out.lock();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = fs.read(ino, off, &mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        off += n as u64;
    }
    Ok(())
}

fn print_mapping(fs: &Filesystem, ino: u32) -> Result<()> {
    let inode = fs.inode(ino)?;
    if inode.has_flag(EXT4_INLINE_DATA_FL) {
        let data = fs.inline_data(ino, &inode)?;
        let size = data.len().min(inode.i_size as usize);
        println!(
            "Inline data: {size} bytes in the inode ({} in i_block, system.data value of {} bytes); inline size {}, capacity {}",
            size.min(60),
            data.len() - 60,
            data.len(),
            fs.max_inline_size(ino, &inode)?
        );
        // As FIEMAP reports an inline file: one extent, inline and not aligned.
        if !inode.is_dir() && size > 0 {
            println!("Extents: [0, {size}) FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_NOT_ALIGNED | FIEMAP_EXTENT_LAST");
        }
        return Ok(());
    }
    if inode.is_symlink() && fs.is_fast_symlink(&inode) {
        println!("Fast symlink: target stored in i_block");
        return Ok(());
    }
    if matches!(
        FileType::from_mode(inode.i_mode),
        Some(FileType::CharDevice | FileType::BlockDevice | FileType::Fifo | FileType::Socket)
    ) {
        return Ok(());
    }
    let kind = if inode.has_flag(EXT4_EXTENTS_FL) { "Extents" } else { "Block map" };
    let maps = fs.file_mappings(ino, &inode)?;
    println!("{kind}:");
    for m in maps {
        match m.kind {
            MapKind::Hole => println!("  logical {}..{}: hole", m.lblk, m.lblk + m.len - 1),
            MapKind::Mapped(p) => {
                println!("  logical {}..{} -> physical {}..{}", m.lblk, m.lblk + m.len - 1, p, p + m.len - 1)
            }
            MapKind::Unwritten(p) => {
                println!(
                    "  logical {}..{} -> physical {}..{} (unwritten)",
                    m.lblk,
                    m.lblk + m.len - 1,
                    p,
                    p + m.len - 1
                )
            }
        }
    }
    Ok(())
}

pub fn run_stat(a: StatArgs) -> CliResult<()> {
    let (fs, ino) = open_at("stat", &a.target, &a.open, false)?;
    let st = fs.stat(ino)?;
    println!("  File: {}", show_name(a.target.shown().as_bytes()));
    println!(
        "Inode: {ino}   Type: {:?}   Mode: {:04o} ({})",
        st.file_type,
        st.perm,
        mode_string(st.file_type, st.perm)
    );
    println!(
        "Links: {}   Uid: {}   Gid: {}   Size: {}   Blocks (512 B): {}",
        st.nlink, st.uid, st.gid, st.size, st.blocks
    );
    println!("Flags: {:#x}   Generation: {}", st.flags, st.generation);
    if matches!(st.file_type, FileType::CharDevice | FileType::BlockDevice) {
        println!("Device: {}, {}", st.rdev.0, st.rdev.1);
    }
    println!("Access: {}", format_time(st.atime));
    println!("Modify: {}", format_time(st.mtime));
    println!("Change: {}", format_time(st.ctime));
    if let Some(c) = st.crtime {
        println!(" Birth: {}", format_time(c));
    }
    if st.file_type == FileType::Symlink {
        println!("Target: {}", show_name(&fs.read_link(ino)?));
    }
    print_mapping(&fs, ino)?;
    let attrs = fs.xattrs(ino)?;
    if !attrs.is_empty() {
        println!("Extended attributes:");
        for (name, value) in attrs {
            println!("  {} ({} bytes) = {}", show_name(&name), value.len(), show_value(&value));
        }
    }
    Ok(())
}

fn show_value(v: &[u8]) -> String {
    if !v.is_empty() && v.iter().all(|&c| (0x20..0x7f).contains(&c)) {
        format!("\"{}\"", String::from_utf8_lossy(v))
    } else {
        let hex: Vec<String> = v.iter().take(64).map(|b| format!("{b:02x}")).collect();
        format!("0x{}{}", hex.concat(), if v.len() > 64 { "..." } else { "" })
    }
}
