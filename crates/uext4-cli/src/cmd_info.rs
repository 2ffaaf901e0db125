//! `uext4 info IMAGE`: the superblock summary, in dumpe2fs -h's words.

use crate::target::{open_ro, OpenArgs};
use std::path::PathBuf;
use uext4::format::superblock::*;
use uext4::Result;

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

pub fn run(a: InfoArgs) -> Result<()> {
    let fs = open_ro(&a.image, &a.open)?;
    let sb = fs.superblock();
    let g = fs.geometry();
    let hash = match sb.s_def_hash_version {
        0 => "legacy",
        1 => "half_md4",
        2 => "tea",
        _ => "unknown",
    };
    let mut lines: Vec<(&str, String)> = vec![
        ("Filesystem volume name", if sb.volume_name().is_empty() { "<none>".into() } else { sb.volume_name() }),
        ("Filesystem UUID", uuid(&sb.s_uuid)),
        ("Filesystem magic number", format!("{:#06X}", sb.s_magic)),
        ("Filesystem features", sb.feature_names().join(" ")),
        (
            "Filesystem flags",
            match (sb.s_flags & EXT2_FLAGS_SIGNED_HASH != 0, sb.s_flags & EXT2_FLAGS_UNSIGNED_HASH != 0) {
                (true, _) => "signed_directory_hash".into(),
                (_, true) => "unsigned_directory_hash".into(),
                _ => "(none)".into(),
            },
        ),
        ("Filesystem state", if sb.s_state & EXT4_VALID_FS != 0 { "clean".into() } else { "not clean".into() }),
        ("Inode count", sb.s_inodes_count.to_string()),
        ("Block count", sb.s_blocks_count.to_string()),
        ("Reserved block count", sb.s_r_blocks_count.to_string()),
        ("Free blocks", sb.s_free_blocks_count.to_string()),
        ("Free inodes", sb.s_free_inodes_count.to_string()),
        ("First block", sb.s_first_data_block.to_string()),
        ("Block size", sb.block_size().to_string()),
        ("Group descriptor size", g.desc_size.to_string()),
        ("Block groups", g.group_count.to_string()),
        ("Reserved GDT blocks", sb.s_reserved_gdt_blocks.to_string()),
        ("Blocks per group", sb.s_blocks_per_group.to_string()),
        ("Inodes per group", sb.s_inodes_per_group.to_string()),
        (
            "Flex block group size",
            if sb.s_log_groups_per_flex > 0 { (1u64 << sb.s_log_groups_per_flex).to_string() } else { "-".into() },
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
    if sb.has_metadata_csum() {
        lines.push(("Checksum", format!("{:#010x}", sb.s_checksum)));
    }
    if fs.replayed_journal_blocks() > 0 {
        lines.push(("Journal", format!("needs recovery; {} blocks replayed in memory", fs.replayed_journal_blocks())));
    }
    for (k, v) in lines {
        println!("{:<26}{v}", format!("{k}:"));
    }
    Ok(())
}

fn hash_seed_bytes(seed: &[u32; 4]) -> [u8; 16] {
    let mut b = [0u8; 16];
    for (i, w) in seed.iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    b
}
