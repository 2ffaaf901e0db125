//! The jbd2 journal format (big-endian throughout).
//!
//! The journal is a circular log of blocks between `s_first` and `s_maxlen`. A
//! transaction is one or more descriptor blocks, each followed by the data blocks
//! its tags name, optional revoke blocks, and a commit block. Every journal block
//! starts with a 12-byte header: magic, block type, transaction sequence.
//!
//! Checksums (csum v2/v3) are raw crc32c seeded with crc32c(~0, s_uuid): descriptor
//! and revoke blocks carry one in a 4-byte tail, the commit block in `h_chksum[0]`, each
//! data block in its tag (crc32c over be32 sequence then the block; v2 keeps 16
//! bits). The journal superblock's own checksum is crc32c(~0, its 1024 bytes with
//! s_checksum zeroed).

use super::bytes::*;
use super::csum::crc32c;
use crate::error::{Error, Result};

pub const JBD2_MAGIC: u32 = 0xC03B_3998;
pub const JBD2_DESCRIPTOR_BLOCK: u32 = 1;
pub const JBD2_COMMIT_BLOCK: u32 = 2;
pub const JBD2_SUPERBLOCK_V1: u32 = 3;
pub const JBD2_SUPERBLOCK_V2: u32 = 4;
pub const JBD2_REVOKE_BLOCK: u32 = 5;
pub const JBD2_FC_BLOCK: u32 = 6;

pub const JBD2_FEATURE_COMPAT_CHECKSUM: u32 = 0x1;
pub const JBD2_FEATURE_INCOMPAT_REVOKE: u32 = 0x1;
pub const JBD2_FEATURE_INCOMPAT_64BIT: u32 = 0x2;
pub const JBD2_FEATURE_INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
pub const JBD2_FEATURE_INCOMPAT_CSUM_V2: u32 = 0x8;
pub const JBD2_FEATURE_INCOMPAT_CSUM_V3: u32 = 0x10;
pub const JBD2_FEATURE_INCOMPAT_FAST_COMMIT: u32 = 0x20;
const INCOMPAT_KNOWN: u32 = 0x3F;

pub const JBD2_FLAG_ESCAPE: u32 = 0x1;
pub const JBD2_FLAG_SAME_UUID: u32 = 0x2;
pub const JBD2_FLAG_DELETED: u32 = 0x4;
pub const JBD2_FLAG_LAST_TAG: u32 = 0x8;

pub const JBD2_CRC32C_CHKSUM: u8 = 4;
pub const HEADER_SIZE: usize = 12;
pub const JOURNAL_SUPERBLOCK_SIZE: usize = 1024;
const S_CHECKSUM_OFFSET: usize = 0xFC;
const REVOKE_HEADER_SIZE: usize = 16;
const TAIL_SIZE: usize = 4;

/// The common header of every journal block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub h_magic: u32,
    pub h_blocktype: u32,
    pub h_sequence: u32,
}

impl BlockHeader {
    pub fn parse(b: &[u8]) -> BlockHeader {
        BlockHeader { h_magic: be32(b, 0), h_blocktype: be32(b, 4), h_sequence: be32(b, 8) }
    }

    pub fn write(&self, b: &mut [u8]) {
        put_be32(b, 0, self.h_magic);
        put_be32(b, 4, self.h_blocktype);
        put_be32(b, 8, self.h_sequence);
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalSuperblock {
    pub header: BlockHeader,
    pub s_blocksize: u32,
    pub s_maxlen: u32,
    pub s_first: u32,
    pub s_sequence: u32,
    pub s_start: u32,
    pub s_errno: i32,
    pub s_feature_compat: u32,
    pub s_feature_incompat: u32,
    pub s_feature_ro_compat: u32,
    pub s_uuid: [u8; 16],
    pub s_nr_users: u32,
    pub s_max_transaction: u32,
    pub s_max_trans_data: u32,
    pub s_checksum_type: u8,
    pub s_num_fc_blks: u32,
    pub s_checksum: u32,
    raw: Vec<u8>,
}

impl JournalSuperblock {
    pub fn parse(b: &[u8]) -> Result<JournalSuperblock> {
        let here = "journal superblock";
        if b.len() < JOURNAL_SUPERBLOCK_SIZE {
            return Err(Error::corrupt("journal superblock is truncated", here));
        }
        let header = BlockHeader::parse(b);
        if header.h_magic != JBD2_MAGIC {
            return Err(Error::corrupt(format!("bad journal magic {:#x}", header.h_magic), here));
        }
        if header.h_blocktype != JBD2_SUPERBLOCK_V1 && header.h_blocktype != JBD2_SUPERBLOCK_V2 {
            return Err(Error::corrupt(format!("journal superblock has block type {}", header.h_blocktype), here));
        }
        let v2 = header.h_blocktype == JBD2_SUPERBLOCK_V2;
        let feat = |off: usize| if v2 { be32(b, off) } else { 0 };
        let sb = JournalSuperblock {
            header,
            s_blocksize: be32(b, 0xC),
            s_maxlen: be32(b, 0x10),
            s_first: be32(b, 0x14),
            s_sequence: be32(b, 0x18),
            s_start: be32(b, 0x1C),
            s_errno: be32(b, 0x20) as i32,
            s_feature_compat: feat(0x24),
            s_feature_incompat: feat(0x28),
            s_feature_ro_compat: feat(0x2C),
            s_uuid: b[0x30..0x40].try_into().unwrap(),
            s_nr_users: be32(b, 0x40),
            s_max_transaction: be32(b, 0x48),
            s_max_trans_data: be32(b, 0x4C),
            s_checksum_type: b[0x50],
            s_num_fc_blks: be32(b, 0x54),
            s_checksum: be32(b, S_CHECKSUM_OFFSET),
            raw: b[..JOURNAL_SUPERBLOCK_SIZE].to_vec(),
        };
        let bs = sb.s_blocksize;
        if !(1024..=65536).contains(&bs) || !bs.is_power_of_two() {
            return Err(Error::corrupt(format!("journal block size {bs}"), here));
        }
        if sb.s_first == 0 || sb.s_first >= sb.s_maxlen {
            return Err(Error::corrupt(format!("journal first block {} of {}", sb.s_first, sb.s_maxlen), here));
        }
        if sb.s_start != 0 && (sb.s_start < sb.s_first || sb.s_start >= sb.s_maxlen) {
            return Err(Error::corrupt(
                format!("journal start {} outside {}..{}", sb.s_start, sb.s_first, sb.s_maxlen),
                here,
            ));
        }
        let unknown = sb.s_feature_incompat & !INCOMPAT_KNOWN;
        if unknown != 0 {
            return Err(Error::unsupported(format!("journal incompat feature bits {unknown:#x}")));
        }
        if sb.has_csum_v2_or_v3() {
            let want = sb.compute_checksum();
            if want != sb.s_checksum {
                return Err(Error::corrupt(
                    format!(
                        "journal superblock checksum {:#010x} does not match contents ({want:#010x})",
                        sb.s_checksum
                    ),
                    here,
                ));
            }
        }
        Ok(sb)
    }

    fn compute_checksum(&self) -> u32 {
        let mut b = self.raw.clone();
        put_be32(&mut b, S_CHECKSUM_OFFSET, 0);
        crc32c(!0, &b)
    }

    pub fn has_incompat(&self, f: u32) -> bool {
        self.s_feature_incompat & f != 0
    }

    /// Blocks of the fast-commit area at the journal's end (jbd2's default of
    /// 256 when the superblock says 0), or 0 without the feature.
    pub fn fast_commit_blocks(&self) -> u32 {
        match (self.has_incompat(JBD2_FEATURE_INCOMPAT_FAST_COMMIT), self.s_num_fc_blks) {
            (false, _) => 0,
            (true, 0) => 256,
            (true, n) => n,
        }
    }

    pub fn has_csum_v2_or_v3(&self) -> bool {
        self.has_incompat(JBD2_FEATURE_INCOMPAT_CSUM_V2 | JBD2_FEATURE_INCOMPAT_CSUM_V3)
    }

    /// Seed of every per-block journal checksum.
    pub fn csum_seed(&self) -> u32 {
        crc32c(!0, &self.s_uuid)
    }

    /// Bytes one descriptor tag takes (without the UUID that may follow it).
    pub fn tag_bytes(&self) -> usize {
        if self.has_incompat(JBD2_FEATURE_INCOMPAT_CSUM_V3) {
            return 16;
        }
        let mut size = 12;
        if self.has_incompat(JBD2_FEATURE_INCOMPAT_CSUM_V2) {
            size += 2;
        }
        if self.has_incompat(JBD2_FEATURE_INCOMPAT_64BIT) {
            size
        } else {
            size - 4
        }
    }

    /// Serializes over the original bytes, recomputing the checksum when enabled.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = self.raw.clone();
        self.header.write(&mut b);
        put_be32(&mut b, 0xC, self.s_blocksize);
        put_be32(&mut b, 0x10, self.s_maxlen);
        put_be32(&mut b, 0x14, self.s_first);
        put_be32(&mut b, 0x18, self.s_sequence);
        put_be32(&mut b, 0x1C, self.s_start);
        put_be32(&mut b, 0x20, self.s_errno as u32);
        if self.header.h_blocktype == JBD2_SUPERBLOCK_V2 {
            put_be32(&mut b, 0x24, self.s_feature_compat);
            put_be32(&mut b, 0x28, self.s_feature_incompat);
            put_be32(&mut b, 0x2C, self.s_feature_ro_compat);
        }
        b[0x30..0x40].copy_from_slice(&self.s_uuid);
        put_be32(&mut b, 0x40, self.s_nr_users);
        put_be32(&mut b, 0x48, self.s_max_transaction);
        put_be32(&mut b, 0x4C, self.s_max_trans_data);
        b[0x50] = self.s_checksum_type;
        put_be32(&mut b, 0x54, self.s_num_fc_blks);
        if self.has_csum_v2_or_v3() {
            put_be32(&mut b, S_CHECKSUM_OFFSET, 0);
            let c = crc32c(!0, &b);
            put_be32(&mut b, S_CHECKSUM_OFFSET, c);
        } else {
            put_be32(&mut b, S_CHECKSUM_OFFSET, self.s_checksum);
        }
        b
    }
}

/// One descriptor tag: the filesystem block the next data block belongs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockTag {
    pub blocknr: u64,
    pub flags: u32,
    pub checksum: u32,
}

/// Parses the tags of a descriptor block, stopping at LAST_TAG or the end of the
/// usable area (before the checksum tail when checksums are on).
pub fn parse_tags(jsb: &JournalSuperblock, block: &[u8]) -> Vec<BlockTag> {
    let tag_bytes = jsb.tag_bytes();
    let csum3 = jsb.has_incompat(JBD2_FEATURE_INCOMPAT_CSUM_V3);
    let wide = jsb.has_incompat(JBD2_FEATURE_INCOMPAT_64BIT);
    let end = if jsb.has_csum_v2_or_v3() { block.len() - TAIL_SIZE } else { block.len() };
    let mut tags = Vec::new();
    let mut off = HEADER_SIZE;
    while off + tag_bytes <= end {
        let t = &block[off..off + tag_bytes];
        let (low, flags, high, checksum) = if csum3 {
            (be32(t, 0), be32(t, 4), be32(t, 8), be32(t, 12))
        } else {
            let high = if wide { be32(t, 8) } else { 0 };
            (be32(t, 0), u16::from_be_bytes([t[6], t[7]]) as u32, high, u16::from_be_bytes([t[4], t[5]]) as u32)
        };
        let high = if wide { high } else { 0 };
        tags.push(BlockTag { blocknr: lo_hi(low, high), flags, checksum });
        off += tag_bytes;
        if flags & JBD2_FLAG_SAME_UUID == 0 {
            off += 16;
        }
        if flags & JBD2_FLAG_LAST_TAG != 0 {
            break;
        }
    }
    tags
}

/// Block numbers a revoke block lists (r_count bytes used, 4 or 8 per entry).
pub fn parse_revoke(jsb: &JournalSuperblock, block: &[u8], location: &str) -> Result<Vec<u64>> {
    let count = be32(block, HEADER_SIZE) as usize;
    let limit = if jsb.has_csum_v2_or_v3() { block.len() - TAIL_SIZE } else { block.len() };
    if !(REVOKE_HEADER_SIZE..=limit).contains(&count) {
        return Err(Error::corrupt(format!("revoke block r_count {count} out of range"), location));
    }
    let wide = jsb.has_incompat(JBD2_FEATURE_INCOMPAT_64BIT);
    let step = if wide { 8 } else { 4 };
    Ok((REVOKE_HEADER_SIZE..count)
        .step_by(step)
        .filter(|off| off + step <= count)
        .map(|off| if wide { be64(block, off) } else { be32(block, off) as u64 })
        .collect())
}

/// Checksum of a descriptor or revoke block: over the block with the tail zeroed.
pub fn tail_checksum(seed: u32, block: &[u8]) -> u32 {
    let n = block.len() - TAIL_SIZE;
    crc32c(crc32c(seed, &block[..n]), &[0; TAIL_SIZE])
}

pub fn verify_tail(jsb: &JournalSuperblock, block: &[u8]) -> bool {
    !jsb.has_csum_v2_or_v3() || be32(block, block.len() - TAIL_SIZE) == tail_checksum(jsb.csum_seed(), block)
}

/// Checksum of a commit block: over the block with `h_chksum[0]` zeroed.
pub fn commit_checksum(seed: u32, block: &[u8]) -> u32 {
    let c = crc32c(seed, &block[..0x10]);
    let c = crc32c(c, &[0; 4]);
    crc32c(c, &block[0x14..])
}

pub fn verify_commit(jsb: &JournalSuperblock, block: &[u8]) -> bool {
    !jsb.has_csum_v2_or_v3() || be32(block, 0x10) == commit_checksum(jsb.csum_seed(), block)
}

/// Checksum a data block's tag carries: crc32c over be32 sequence then the block.
pub fn data_checksum(seed: u32, sequence: u32, block: &[u8]) -> u32 {
    crc32c(crc32c(seed, &sequence.to_be_bytes()), block)
}

pub fn verify_data(jsb: &JournalSuperblock, tag: &BlockTag, sequence: u32, block: &[u8]) -> bool {
    if !jsb.has_csum_v2_or_v3() {
        return true;
    }
    let c = data_checksum(jsb.csum_seed(), sequence, block);
    if jsb.has_incompat(JBD2_FEATURE_INCOMPAT_CSUM_V3) {
        tag.checksum == c
    } else {
        tag.checksum == c & 0xffff
    }
}

/// How many tags fit in one descriptor block: the first carries the 16-byte
/// journal UUID after it, the rest say SAME_UUID.
pub fn tags_per_descriptor(jsb: &JournalSuperblock) -> usize {
    let bs = jsb.s_blocksize as usize;
    let tail = if jsb.has_csum_v2_or_v3() { TAIL_SIZE } else { 0 };
    let usable = bs - HEADER_SIZE - tail;
    let tb = jsb.tag_bytes();
    1 + (usable - tb - 16) / tb
}

/// How many block numbers fit in one revoke block.
pub fn revokes_per_block(jsb: &JournalSuperblock) -> usize {
    let tail = if jsb.has_csum_v2_or_v3() { TAIL_SIZE } else { 0 };
    let step = if jsb.has_incompat(JBD2_FEATURE_INCOMPAT_64BIT) { 8 } else { 4 };
    (jsb.s_blocksize as usize - REVOKE_HEADER_SIZE - tail) / step
}

fn seal_tail(jsb: &JournalSuperblock, block: &mut [u8]) {
    if jsb.has_csum_v2_or_v3() {
        let n = block.len() - TAIL_SIZE;
        let c = tail_checksum(jsb.csum_seed(), block);
        put_be32(block, n, c);
    }
}

/// A descriptor block for `tags` (at most `tags_per_descriptor`), in order; the
/// caller has set ESCAPE where the data block began with the journal magic and
/// computed each data checksum (`data_checksum`).
pub fn build_descriptor(jsb: &JournalSuperblock, sequence: u32, tags: &[BlockTag]) -> Vec<u8> {
    let mut b = vec![0u8; jsb.s_blocksize as usize];
    BlockHeader { h_magic: JBD2_MAGIC, h_blocktype: JBD2_DESCRIPTOR_BLOCK, h_sequence: sequence }.write(&mut b);
    let tb = jsb.tag_bytes();
    let csum3 = jsb.has_incompat(JBD2_FEATURE_INCOMPAT_CSUM_V3);
    let csum2 = jsb.has_incompat(JBD2_FEATURE_INCOMPAT_CSUM_V2);
    let wide = jsb.has_incompat(JBD2_FEATURE_INCOMPAT_64BIT);
    let mut off = HEADER_SIZE;
    for (i, tag) in tags.iter().enumerate() {
        let mut flags = tag.flags & JBD2_FLAG_ESCAPE;
        if i > 0 {
            flags |= JBD2_FLAG_SAME_UUID;
        }
        if i + 1 == tags.len() {
            flags |= JBD2_FLAG_LAST_TAG;
        }
        let t = &mut b[off..off + tb];
        put_be32(t, 0, tag.blocknr as u32);
        if csum3 {
            put_be32(t, 4, flags);
            put_be32(t, 8, (tag.blocknr >> 32) as u32);
            put_be32(t, 12, tag.checksum);
        } else {
            let checksum = if csum2 { tag.checksum as u16 } else { 0 };
            t[4..6].copy_from_slice(&checksum.to_be_bytes());
            t[6..8].copy_from_slice(&(flags as u16).to_be_bytes());
            if wide {
                put_be32(t, 8, (tag.blocknr >> 32) as u32);
            }
        }
        off += tb;
        if i == 0 {
            b[off..off + 16].copy_from_slice(&jsb.s_uuid);
            off += 16;
        }
    }
    seal_tail(jsb, &mut b);
    b
}

/// The tag that opens a fast commit (ext4's fast_commit.h): its value holds the
/// fast-commit features (le32) and the id of the transaction the fast commits
/// follow (le32). Fast-commit blocks are ext4's tag-length-value records, not
/// jbd2 blocks: they carry no journal magic.
pub const EXT4_FC_TAG_HEAD: u16 = 0x0009;

/// The transaction id a fast-commit area's first block names, if that block opens
/// with a well-formed head tag. The kernel replays the area only when this id is
/// the one after the last full commit the log holds.
pub fn fast_commit_head_tid(block: &[u8]) -> Option<u32> {
    let tag = u16::from_le_bytes(block.get(0..2)?.try_into().ok()?);
    let len = u16::from_le_bytes(block.get(2..4)?.try_into().ok()?);
    if tag != EXT4_FC_TAG_HEAD || len < 8 {
        return None;
    }
    Some(u32::from_le_bytes(block.get(8..12)?.try_into().ok()?))
}

/// A revoke block listing `blocks` (at most `revokes_per_block`).
pub fn build_revoke(jsb: &JournalSuperblock, sequence: u32, blocks: &[u64]) -> Vec<u8> {
    let mut b = vec![0u8; jsb.s_blocksize as usize];
    BlockHeader { h_magic: JBD2_MAGIC, h_blocktype: JBD2_REVOKE_BLOCK, h_sequence: sequence }.write(&mut b);
    let wide = jsb.has_incompat(JBD2_FEATURE_INCOMPAT_64BIT);
    let mut off = REVOKE_HEADER_SIZE;
    for &blk in blocks {
        if wide {
            put_be64(&mut b, off, blk);
            off += 8;
        } else {
            put_be32(&mut b, off, blk as u32);
            off += 4;
        }
    }
    put_be32(&mut b, HEADER_SIZE, off as u32);
    seal_tail(jsb, &mut b);
    b
}

/// The commit block that makes transaction `sequence` count.
pub fn build_commit(jsb: &JournalSuperblock, sequence: u32, sec: u64, nsec: u32) -> Vec<u8> {
    let mut b = vec![0u8; jsb.s_blocksize as usize];
    BlockHeader { h_magic: JBD2_MAGIC, h_blocktype: JBD2_COMMIT_BLOCK, h_sequence: sequence }.write(&mut b);
    put_be64(&mut b, 0x30, sec);
    put_be32(&mut b, 0x38, nsec);
    if jsb.has_csum_v2_or_v3() {
        let c = commit_checksum(jsb.csum_seed(), &b);
        put_be32(&mut b, 0x10, c);
    }
    b
}

#[cfg(test)]
mod build_tests {
    use super::*;

    fn jsb(incompat: u32, bs: u32) -> JournalSuperblock {
        let mut raw = vec![0u8; JOURNAL_SUPERBLOCK_SIZE];
        BlockHeader { h_magic: JBD2_MAGIC, h_blocktype: JBD2_SUPERBLOCK_V2, h_sequence: 0 }.write(&mut raw);
        put_be32(&mut raw, 0xC, bs);
        put_be32(&mut raw, 0x10, 1024);
        put_be32(&mut raw, 0x14, 1);
        put_be32(&mut raw, 0x28, incompat);
        raw[0x30..0x40].copy_from_slice(&[7; 16]);
        if incompat & (JBD2_FEATURE_INCOMPAT_CSUM_V2 | JBD2_FEATURE_INCOMPAT_CSUM_V3) != 0 {
            raw[0x50] = JBD2_CRC32C_CHKSUM;
            let c = crc32c(!0, &raw);
            put_be32(&mut raw, S_CHECKSUM_OFFSET, c);
        }
        JournalSuperblock::parse(&raw).unwrap()
    }

    /// What we build, the recovery parser reads back, in every tag format.
    #[test]
    fn descriptors_revokes_and_commits_parse_back() {
        let v3 = JBD2_FEATURE_INCOMPAT_CSUM_V3 | JBD2_FEATURE_INCOMPAT_64BIT;
        let v2 = JBD2_FEATURE_INCOMPAT_CSUM_V2;
        for (incompat, bs) in [(v3, 4096), (v3, 1024), (v2, 4096), (0, 1024), (JBD2_FEATURE_INCOMPAT_64BIT, 4096)] {
            let j = jsb(incompat | JBD2_FEATURE_INCOMPAT_REVOKE, bs);
            let n = tags_per_descriptor(&j);
            let wide = incompat & JBD2_FEATURE_INCOMPAT_64BIT != 0;
            let tags: Vec<BlockTag> = (0..n as u64)
                .map(|i| BlockTag {
                    blocknr: if wide { (1 << 33) + i } else { 100 + i },
                    flags: if i % 3 == 0 { JBD2_FLAG_ESCAPE } else { 0 },
                    checksum: 0xabcd_0000 + i as u32,
                })
                .collect();
            let d = build_descriptor(&j, 9, &tags);
            assert!(verify_tail(&j, &d));
            let back = parse_tags(&j, &d);
            assert_eq!(back.len(), n, "all tags fit, incompat {incompat:#x} bs {bs}");
            for (a, b) in tags.iter().zip(&back) {
                assert_eq!(a.blocknr, b.blocknr);
                assert_eq!(a.flags & JBD2_FLAG_ESCAPE, b.flags & JBD2_FLAG_ESCAPE);
                if incompat & JBD2_FEATURE_INCOMPAT_CSUM_V3 != 0 {
                    assert_eq!(a.checksum, b.checksum);
                } else if incompat & JBD2_FEATURE_INCOMPAT_CSUM_V2 != 0 {
                    assert_eq!(a.checksum & 0xffff, b.checksum);
                }
            }
            let blocks: Vec<u64> = (0..revokes_per_block(&j) as u64).map(|i| 5000 + i).collect();
            let r = build_revoke(&j, 9, &blocks);
            assert!(verify_tail(&j, &r));
            assert_eq!(parse_revoke(&j, &r, "test").unwrap(), blocks);
            let c = build_commit(&j, 9, 1_700_000_000, 5);
            assert!(verify_commit(&j, &c));
            assert_eq!(BlockHeader::parse(&c).h_sequence, 9);
        }
    }
}
