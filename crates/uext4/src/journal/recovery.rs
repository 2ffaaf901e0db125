//! Journal recovery as the kernel does it (fs/jbd2/recovery.c), producing the
//! replayed blocks in memory rather than writing them home.
//!
//! Three passes over the log from `s_start`: SCAN finds where the last complete
//! transaction ends (the first block with the wrong magic or sequence, or a commit
//! whose checksum fails); REVOKE collects revoked block numbers with the sequence
//! that revoked them; REPLAY takes every tagged data block of a complete transaction
//! unless a transaction at or after it revoked that block, later copies replacing
//! earlier ones. Every walk is bounded by the log's length, so a hostile journal
//! cannot make it loop.

use crate::error::{Error, Result};
use crate::format::journal::*;
use std::collections::{BTreeMap, HashMap};

pub struct Replay {
    /// Final content of every filesystem block the journal writes home.
    pub blocks: BTreeMap<u64, Vec<u8>>,
    /// Complete transactions found.
    pub transactions: u32,
    /// The sequence the next transaction would get.
    pub next_sequence: u32,
    /// Data blocks whose tag checksum failed, and the first of them (filesystem
    /// block, transaction). Any makes `recover` refuse the journal.
    pub bad_data_blocks: u32,
    first_bad: Option<(u64, u32)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    Scan,
    Revoke,
    Replay,
}

struct Log<'a> {
    jsb: JournalSuperblock,
    read: &'a mut dyn FnMut(u32) -> Result<Vec<u8>>,
    /// One past the last block of the circular area.
    last: u32,
}

impl Log<'_> {
    fn wrap(&self, block: u32) -> u32 {
        if block >= self.last {
            block - (self.last - self.jsb.s_first)
        } else {
            block
        }
    }

    fn block(&mut self, n: u32) -> Result<Vec<u8>> {
        let b = (self.read)(n)?;
        if b.len() != self.jsb.s_blocksize as usize {
            return Err(Error::corrupt(format!("journal block {n} has {} bytes", b.len()), "journal"));
        }
        Ok(b)
    }
}

/// `read_jblock(n)` returns journal block n (0 is the journal superblock).
pub fn recover(read_jblock: &mut dyn FnMut(u32) -> Result<Vec<u8>>) -> Result<Replay> {
    let jsb = JournalSuperblock::parse(&read_jblock(0)?)?;
    let mut replay = Replay {
        blocks: BTreeMap::new(),
        transactions: 0,
        next_sequence: jsb.s_sequence,
        bad_data_blocks: 0,
        first_bad: None,
    };
    if jsb.s_start == 0 {
        return Ok(replay);
    }
    let fc = jsb.fast_commit_blocks();
    let last = jsb.s_maxlen.checked_sub(fc).filter(|&l| l > jsb.s_first).ok_or_else(|| {
        Error::corrupt(
            format!("a journal of {} blocks, {fc} of them fast-commit area, leaves no log", jsb.s_maxlen),
            "journal superblock",
        )
    })?;
    let mut log = Log { jsb, read: read_jblock, last };
    let mut revoked: HashMap<u64, u32> = HashMap::new();
    let end = one_pass(&mut log, Pass::Scan, None, &mut revoked, &mut replay)?;
    // With async commits a commit block may reach the disk before its
    // transaction's blocks. Per-block tag checksums (v2, v3) show a block that
    // did not (and the replay below then refuses the journal); a v1 journal keeps
    // one crc32 over the transaction in its commit block instead, which uext4
    // does not check.
    if log.jsb.has_incompat(JBD2_FEATURE_INCOMPAT_ASYNC_COMMIT)
        && !log.jsb.has_csum_v2_or_v3()
        && end != log.jsb.s_sequence
    {
        return Err(Error::unsupported(
            "replaying a journal written with journal_async_commit and v1 checksums; let the kernel recover \
             the image (mount it once) or run e2fsck -fy, then retry",
        ));
    }
    one_pass(&mut log, Pass::Revoke, Some(end), &mut revoked, &mut replay)?;
    one_pass(&mut log, Pass::Replay, Some(end), &mut revoked, &mut replay)?;
    // A committed transaction holding a block that fails its checksum was torn
    // (with async commits its commit block may land before its blocks) or
    // damaged since. The kernel's jbd2 then fails the recovery (block_error:
    // the mount is refused); replaying the rest would apply half a transaction.
    if let Some((block, sequence)) = replay.first_bad {
        return Err(Error::corrupt(
            format!(
                "{} journalled block(s) fail their checksum (the first: filesystem block {block} in \
                 transaction {sequence}); the kernel refuses to recover such a journal too, run e2fsck -fy",
                replay.bad_data_blocks
            ),
            "journal",
        ));
    }
    replay.transactions = end.wrapping_sub(log.jsb.s_sequence);
    replay.next_sequence = end;
    // Fast commits made after the last full commit hold changes fsync made
    // durable; replaying them is ext4's work (fs/ext4/fast_commit.c), which uext4
    // does not do. Dropping them would lose those changes without a word, so the
    // open is refused, whether or not full transactions precede them.
    // The area starts one block past the log's end (jbd2's j_fc_first = j_last + 1).
    if log.jsb.has_incompat(JBD2_FEATURE_INCOMPAT_FAST_COMMIT)
        && last + 1 < log.jsb.s_maxlen
        && fast_commit_head_tid(&log.block(last + 1)?) == Some(end)
    {
        return Err(Error::unsupported(
            "the journal holds fast commits (changes fsync made durable after the last full commit), which \
             uext4 cannot replay; let the kernel recover the image (mount it once) or run e2fsck -fy, then retry",
        ));
    }
    Ok(replay)
}

/// Walks the log once; returns the sequence one past the last complete transaction.
fn one_pass(
    log: &mut Log,
    pass: Pass,
    end: Option<u32>,
    revoked: &mut HashMap<u64, u32>,
    replay: &mut Replay,
) -> Result<u32> {
    let mut sequence = log.jsb.s_sequence;
    let mut next = log.jsb.s_start;
    let log_len = (log.last - log.jsb.s_first) as u64;
    let mut walked: u64 = 0;
    let bs = log.jsb.s_blocksize as usize;
    loop {
        if end.is_some_and(|e| sequence == e) {
            break;
        }
        // A log longer than the journal itself means blocks are being revisited.
        if walked > log_len {
            return Err(Error::corrupt("journal log does not end within the journal", "journal"));
        }
        let here = next;
        let block = log.block(here)?;
        next = log.wrap(next + 1);
        walked += 1;
        let h = BlockHeader::parse(&block);
        if h.h_magic != JBD2_MAGIC || h.h_sequence != sequence {
            break;
        }
        let location = format!("journal block {here} (transaction {sequence})");
        match h.h_blocktype {
            JBD2_DESCRIPTOR_BLOCK => {
                if pass != Pass::Scan && !verify_tail(&log.jsb, &block) {
                    return Err(Error::corrupt("descriptor block checksum does not match", location));
                }
                let tags = parse_tags(&log.jsb, &block);
                if pass != Pass::Replay {
                    next = log.wrap(next + tags.len() as u32);
                    walked += tags.len() as u64;
                    continue;
                }
                for tag in tags {
                    let data_at = next;
                    next = log.wrap(next + 1);
                    walked += 1;
                    if revoked.get(&tag.blocknr).is_some_and(|&r| r.wrapping_sub(sequence) as i32 >= 0) {
                        continue;
                    }
                    let mut data = log.block(data_at)?;
                    if !verify_data(&log.jsb, &tag, sequence, &data) {
                        replay.bad_data_blocks += 1;
                        replay.first_bad.get_or_insert((tag.blocknr, sequence));
                        continue;
                    }
                    if tag.flags & JBD2_FLAG_ESCAPE != 0 {
                        data[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
                    }
                    debug_assert_eq!(data.len(), bs);
                    replay.blocks.insert(tag.blocknr, data);
                }
            }
            JBD2_COMMIT_BLOCK => {
                if pass == Pass::Scan && !verify_commit(&log.jsb, &block) {
                    // A torn commit ends the log: that transaction is not replayed.
                    break;
                }
                sequence = sequence.wrapping_add(1);
            }
            JBD2_REVOKE_BLOCK => {
                if pass == Pass::Revoke {
                    if !verify_tail(&log.jsb, &block) {
                        return Err(Error::corrupt("revoke block checksum does not match", location));
                    }
                    for blocknr in parse_revoke(&log.jsb, &block, &location)? {
                        let e = revoked.entry(blocknr).or_insert(sequence);
                        if sequence.wrapping_sub(*e) as i32 > 0 {
                            *e = sequence;
                        }
                    }
                }
            }
            _ => break,
        }
    }
    Ok(sequence)
}
