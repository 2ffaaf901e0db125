//! `uext4 info IMAGE`: the superblock summary, in dumpe2fs -h's words.
//!
//! Inspection is most needed on images uext4 will not open (an unsupported
//! incompat feature, a journal it cannot replay, damaged descriptors), so when the
//! open fails the superblock is read on its own and printed all the same, with a
//! last line naming what the open refused; its checksum is checked but a mismatch
//! only reported. The exit status is 0 whenever a superblock could be shown, and 1
//! only when there is none to show (a short file, no ext2/3/4 magic, an I/O error).
//! Every value is computed with checked arithmetic: the superblock may be hostile.
//! The journal's lines (its features, size, sequence and start) are shown when the
//! image opens, read from the journal inode's first block.

use crate::show::{escape, CliResult, Failure};
use crate::target::{open_ro, OpenArgs};
use std::path::{Path, PathBuf};
use uext4::format::superblock::*;

#[derive(clap::Args)]
pub struct InfoArgs {
    /// The image file or block device
    image: PathBuf,
    #[command(flatten)]
    open: OpenArgs,
}

fn uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    let h = h.concat();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

fn time(t: u64) -> String {
    if t == 0 {
        "n/a".into()
    } else {
        format!("{t} (seconds since the epoch)")
    }
}

pub fn run(a: InfoArgs) -> CliResult<()> {
    let (sb, notes) = match open_ro(&a.image, &a.open) {
        Ok(fs) => {
            let mut notes = Vec::new();
            if fs.replayed_journal_blocks() > 0 {
                notes.push((
                    "Journal",
                    format!("needs recovery; {} blocks replayed in memory", fs.replayed_journal_blocks()),
                ));
            }
            if fs.read_only_reason() != "opened read-only" {
                notes.push(("Read-only", fs.read_only_reason().to_string()));
            }
            let sb = fs.superblock();
            notes.extend(journal_fields(&fs, &sb));
            (sb, notes)
        }
        Err(refused) => {
            let (sb, problem) = match read_superblock(&a.image) {
                Ok(found) => found,
                // The library's refusal says more (a partition table where a
                // superblock should be, the region asked for) than the bare magic.
                Err(uext4::Error::Corrupt { .. }) if matches!(refused, uext4::Error::Corrupt { .. }) => {
                    return Err(Failure::refused(format!("info: {refused}")))
                }
                Err(e) => return Err(Failure::refused(format!("info: {e}"))),
            };
            let mut notes = Vec::new();
            let refused = refused.to_string();
            if let Some(p) = problem.filter(|p| *p != refused) {
                notes.push(("Superblock problem", p));
            }
            notes.push(("uext4 cannot open it", refused));
            (sb, notes)
        }
    };
    for (k, v) in fields(&sb).into_iter().chain(notes) {
        println!("{:<26}{}", format!("{k}:"), escape(v.as_bytes()));
    }
    Ok(())
}

/// dumpe2fs -h's journal lines, from the journal inode's superblock (nothing when
/// the journal is external or its first block does not parse).
fn journal_fields(fs: &uext4::Filesystem, sb: &Superblock) -> Vec<(&'static str, String)> {
    use uext4::format::journal::JournalSuperblock;
    if sb.s_feature_compat & COMPAT_HAS_JOURNAL == 0 || sb.s_journal_inum == 0 {
        return Vec::new();
    }
    let mut raw = vec![0u8; fs.geometry().block_size];
    let Ok(jsb) = fs.read(sb.s_journal_inum, 0, &mut raw).and_then(|_| JournalSuperblock::parse(&raw)) else {
        return Vec::new();
    };
    let mut features = journal_feature_names(jsb.s_feature_compat, &[(0x1, "journal_checksum")], 'C');
    features.extend(journal_feature_names(
        jsb.s_feature_incompat,
        &[
            (0x1, "journal_incompat_revoke"),
            (0x2, "journal_64bit"),
            (0x4, "journal_async_commit"),
            (0x8, "journal_checksum_v2"),
            (0x10, "journal_checksum_v3"),
        ],
        'I',
    ));
    let features = if features.is_empty() { "(none)".to_string() } else { features.join(" ") };
    vec![
        ("Journal features", features),
        ("Total journal blocks", jsb.s_maxlen.to_string()),
        ("Journal sequence", format!("{:#010x}", jsb.s_sequence)),
        ("Journal start", jsb.s_start.to_string()),
    ]
}

/// The names of the bits set in a journal feature word: e2p's, and a bit it does
/// not know as it shows one (FEATURE_I5).
fn journal_feature_names(word: u32, known: &[(u32, &str)], letter: char) -> Vec<String> {
    (0..32)
        .filter(|b| word & (1u32 << b) != 0)
        .map(|b| {
            known
                .iter()
                .find(|&&(m, _)| m == 1u32 << b)
                .map_or_else(|| format!("FEATURE_{letter}{b}"), |&(_, n)| n.into())
        })
        .collect()
}

/// The primary superblock straight from the image, and what is wrong with it if
/// it does not validate but still has the ext2/3/4 magic.
fn read_superblock(image: &Path) -> uext4::Result<(Superblock, Option<String>)> {
    // The filesystem `--offset` or `--partition` names, as the open would read it.
    let file = uext4::FileDevice::open(image, false)?;
    let dev = uext4::BoundedDevice::open(std::sync::Arc::new(file), crate::target::region())?;
    let mut raw = [0u8; SUPERBLOCK_SIZE];
    if dev.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
        return Err(uext4::Error::corrupt(
            format!("{} bytes is too small to hold a superblock", dev.size()),
            image.display().to_string(),
        ));
    }
    dev.read_at(SUPERBLOCK_OFFSET, &mut raw)?;
    match Superblock::parse(&raw, true) {
        Ok(sb) => Ok((sb, None)),
        Err(e) => {
            let sb = Superblock::from_bytes(&raw);
            if sb.s_magic != EXT4_SUPER_MAGIC {
                return Err(e);
            }
            Ok((sb, Some(e.to_string())))
        }
    }
}

/// The feature names in dumpe2fs's order: compat, incompat, ro_compat words, each
/// by bit, an unknown bit shown as e2p shows it (FEATURE_I31).
fn features(sb: &Superblock) -> String {
    let words = [sb.s_feature_compat, sb.s_feature_incompat, sb.s_feature_ro_compat];
    let mut names = Vec::new();
    for (word, (bits, letter)) in words.iter().zip(['C', 'I', 'R']).enumerate() {
        for bit in (0..32).filter(|b| bits & (1u32 << b) != 0) {
            let known = FEATURE_NAMES.iter().find(|&&(w, m, _)| w as usize == word && m == 1u32 << bit);
            names.push(known.map_or_else(|| format!("FEATURE_{letter}{bit}"), |&(_, _, name)| name.to_string()));
        }
    }
    if names.is_empty() {
        "(none)".into()
    } else {
        names.join(" ")
    }
}

/// dumpe2fs -h's lines, from the superblock alone.
fn fields(sb: &Superblock) -> Vec<(&'static str, String)> {
    let hash = match sb.s_def_hash_version {
        0 => "legacy",
        1 => "half_md4",
        2 => "tea",
        _ => "unknown",
    };
    let block_size = 1024u64.checked_shl(sb.s_log_block_size).filter(|_| sb.s_log_block_size <= 6);
    let groups = sb
        .s_blocks_count
        .checked_sub(sb.s_first_data_block as u64)
        .filter(|_| sb.s_blocks_per_group != 0)
        .map(|b| b.div_ceil(sb.s_blocks_per_group as u64));
    let invalid = |what: &str, raw: u64| format!("invalid ({what} {raw})");
    let name_end = sb.s_volume_name.iter().position(|&c| c == 0).unwrap_or(sb.s_volume_name.len());
    let volume = &sb.s_volume_name[..name_end];
    let mut lines: Vec<(&str, String)> = vec![
        (
            "Filesystem volume name",
            if volume.is_empty() { "<none>".into() } else { String::from_utf8_lossy(volume).into_owned() },
        ),
        ("Filesystem UUID", uuid(&sb.s_uuid)),
        ("Filesystem magic number", format!("{:#06X}", sb.s_magic)),
        ("Filesystem features", features(sb)),
        (
            "Filesystem flags",
            match (sb.s_flags & EXT2_FLAGS_SIGNED_HASH != 0, sb.s_flags & EXT2_FLAGS_UNSIGNED_HASH != 0) {
                (true, _) => "signed_directory_hash".into(),
                (_, true) => "unsigned_directory_hash".into(),
                _ => "(none)".into(),
            },
        ),
        ("Filesystem state", state(sb.s_state)),
        (
            "Errors behavior",
            match sb.s_errors {
                EXT4_ERRORS_CONTINUE => "Continue".into(),
                EXT4_ERRORS_RO => "Remount read-only".into(),
                EXT4_ERRORS_PANIC => "Panic".into(),
                other => format!("Unknown (continue) ({other})"),
            },
        ),
        ("Inode count", sb.s_inodes_count.to_string()),
        ("Block count", sb.s_blocks_count.to_string()),
        ("Reserved block count", sb.s_r_blocks_count.to_string()),
        ("Free blocks", sb.s_free_blocks_count.to_string()),
        ("Free inodes", sb.s_free_inodes_count.to_string()),
        ("First block", sb.s_first_data_block.to_string()),
        (
            "Block size",
            block_size.map_or_else(|| invalid("s_log_block_size", sb.s_log_block_size.into()), |b| b.to_string()),
        ),
        ("Group descriptor size", sb.desc_size().to_string()),
        (
            "Block groups",
            groups.map_or_else(|| invalid("s_blocks_per_group", sb.s_blocks_per_group.into()), |g| g.to_string()),
        ),
        ("Reserved GDT blocks", sb.s_reserved_gdt_blocks.to_string()),
        ("Blocks per group", sb.s_blocks_per_group.to_string()),
        ("Inodes per group", sb.s_inodes_per_group.to_string()),
        (
            "Flex block group size",
            match sb.s_log_groups_per_flex {
                0 => "-".into(),
                log @ 1..=31 => (1u64 << log).to_string(),
                log => invalid("s_log_groups_per_flex", log.into()),
            },
        ),
        ("Filesystem created", time(sb.s_mkfs_time)),
        ("Last mount time", time(sb.s_mtime)),
        ("Last write time", time(sb.s_wtime)),
        ("Mount count", sb.s_mnt_count.to_string()),
        ("First inode", sb.first_ino().to_string()),
        ("Inode size", sb.inode_size().to_string()),
        ("Required extra isize", sb.s_min_extra_isize.to_string()),
        ("Desired extra isize", sb.s_want_extra_isize.to_string()),
        ("Journal inode", sb.s_journal_inum.to_string()),
        ("Default directory hash", hash.into()),
        ("Directory Hash Seed", uuid(&hash_seed_bytes(&sb.s_hash_seed))),
        ("Checksum type", if sb.has_metadata_csum() { "crc32c".into() } else { "none".into() }),
    ];
    if sb.s_error_count() != 0 {
        lines.push(("FS Error count", sb.s_error_count().to_string()));
    }
    const FIRST: [&str; 6] = [
        "First error time",
        "First error function",
        "First error line #",
        "First error inode #",
        "First error block #",
        "First error err",
    ];
    const LAST: [&str; 6] = [
        "Last error time",
        "Last error function",
        "Last error line #",
        "Last error inode #",
        "Last error block #",
        "Last error err",
    ];
    for (labels, record) in [(FIRST, sb.first_error()), (LAST, sb.last_error())] {
        // dumpe2fs shows a record only once it has a time, and its inode, block
        // and code only when they are set.
        let Some(e) = record.filter(|e| e.time != 0) else { continue };
        let unless_zero = |n: u64| if n == 0 { String::new() } else { n.to_string() };
        let err = error_code_name(e.errcode);
        let values = [time(e.time), e.func, e.line.to_string(), unless_zero(e.ino.into()), unless_zero(e.block), err];
        lines.extend(labels.into_iter().zip(values).filter(|(_, v)| !v.is_empty()));
    }
    if sb.has_metadata_csum() {
        lines.push(("Checksum", format!("{:#010x}", sb.s_checksum)));
    }
    lines
}

/// The name of a superblock error code, as dumpe2fs prints it (empty: none).
fn error_code_name(code: u8) -> String {
    const NAMES: [&str; 18] = [
        "",
        "UNKNOWN",
        "EIO",
        "ENOMEM",
        "EFSBADCRC",
        "EFSCORRUPTED",
        "ENOSPC",
        "ENOKEY",
        "EROFS",
        "EFBIG",
        "EEXIST",
        "ERANGE",
        "EOVERFLOW",
        "EBUSY",
        "ENOTDIR",
        "ENOTEMPTY",
        "ESHUTDOWN",
        "EFAULT",
    ];
    NAMES.get(code as usize).map_or_else(|| code.to_string(), |n| n.to_string())
}

/// dumpe2fs's words for s_state: clean or not, and "with errors" when an
/// error was recorded (the kernel's EXT4_ERROR_FS).
fn state(s_state: u16) -> String {
    let clean = if s_state & EXT4_VALID_FS != 0 { "clean" } else { "not clean" };
    match s_state & EXT4_ERROR_FS != 0 {
        true => format!("{clean} with errors"),
        false => clean.into(),
    }
}

fn hash_seed_bytes(seed: &[u32; 4]) -> [u8; 16] {
    let mut b = [0u8; 16];
    for (i, w) in seed.iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    b
}
