//! Seed 001: writing into preallocated (unwritten) space, and the zero-out that
//! trades a little I/O for fewer extents (the kernel's
//! `ext4_ext_convert_to_initialized` with Zheng Liu's tunable chunk).
//!
//! Blocks written inside an unwritten extent become written in place, in the
//! leaf that holds the extent: the extent splits into at most three (unwritten
//! before, written, unwritten after), or hands the written blocks to a written
//! neighbour that continues them, and the pieces merge with the neighbours they
//! continue. Splitting is avoided by writing zeros instead, with the rules of the
//! seed's patch, `zeroout` (extent_zeroout_len, in blocks) read once per
//! operation by the caller as Zach Brown asked:
//!   - an extent of at most 2 × zeroout blocks is zeroed whole and becomes written;
//!   - else, when what follows the write inside the extent is at most zeroout
//!     blocks, it is zeroed and joins the written piece (the kernel's case 3);
//!   - and when what precedes the write plus the written piece is under zeroout
//!     blocks, it is zeroed and joins it too (case 2).
//!
//! Invariant (the kernel's EXT4_EXT_MAY_ZEROOUT): zeros are only written, and
//! blocks only marked written, when the whole extent ends at or before the end of
//! file (the larger of the size before the write and the written range's end).
//! Marking blocks written past i_size would put data e2fsck calls beyond the
//! end of the file, and a failed write would leave them so.

use crate::error::{Error, Result};
use crate::format::extent::{Extent, EXT_INIT_MAX_LEN, EXT_UNWRITTEN_MAX_LEN};
use crate::format::inode::Inode;
use crate::fs::Filesystem;
use crate::journal::handle::Handle;

use super::write::{Item, Node};

/// What converting a range of one unwritten extent does: the physical ranges to
/// overwrite with zeros, and the extents that replace the extent together with
/// the neighbours passed in (in order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conversion {
    pub zero: Vec<(u64, u64)>,
    pub replace: Vec<Extent>,
}

/// A conversion planned against the tree as read (`plan_unwritten_conversion`):
/// the path to the extent's leaf, the window of leaf items it replaces (the
/// extent and the neighbours `plan` was given), and the plan.
pub(crate) struct PlannedConversion {
    path: Vec<Node>,
    leaf: usize,
    first: usize,
    window: usize,
    pub plan: Conversion,
}

/// Whether `b` continues `a` on disk and in the file, so the two can be one extent.
fn continues(a: &Extent, b: &Extent) -> bool {
    let limit = if a.unwritten { EXT_UNWRITTEN_MAX_LEN } else { EXT_INIT_MAX_LEN };
    a.unwritten == b.unwritten
        && a.end() == b.ee_block as u64
        && a.start + a.len as u64 == b.start
        && a.len + b.len <= limit
}

/// Plans the conversion of logical blocks [lblk, lblk + len), all inside the
/// unwritten extent `ex`, to written. `left` and `right` are the extents beside
/// `ex` in its leaf, if any; they come back in `replace` (changed or not).
/// `eof_block` is the first block past the end of file (at least lblk + len).
pub(crate) fn plan(
    ex: Extent,
    left: Option<Extent>,
    right: Option<Extent>,
    lblk: u64,
    len: u64,
    eof_block: u64,
    zeroout: u32,
) -> Conversion {
    let ee_block = ex.ee_block as u64;
    let end = lblk + len;
    let at = |l: u64| ex.start + (l - ee_block);
    let piece = |from: u64, to: u64, unwritten: bool| Extent {
        ee_block: from as u32,
        len: (to - from) as u32,
        unwritten,
        start: at(from),
    };
    // The cheapest change first, as the kernel does: a write at an edge of the
    // extent hands its blocks to a written neighbour that continues it (no zeros).
    if (len as u32) < ex.len {
        if let Some(prev) = left.filter(|p| lblk == ee_block && !p.unwritten) {
            let grown = Extent { len: prev.len + len as u32, ..prev };
            if prev.end() == ee_block && prev.start + prev.len as u64 == ex.start && grown.len < EXT_INIT_MAX_LEN {
                let mut replace = vec![grown, piece(end, ex.end(), true)];
                replace.extend(right);
                return Conversion { zero: Vec::new(), replace };
            }
        }
        if let Some(next) = right.filter(|n| end == ex.end() && !n.unwritten) {
            if next.ee_block as u64 == end && at(end) == next.start && next.len + (len as u32) < EXT_INIT_MAX_LEN {
                let grown =
                    Extent { ee_block: lblk as u32, len: next.len + len as u32, unwritten: false, start: at(lblk) };
                let mut replace: Vec<Extent> = left.into_iter().collect();
                replace.extend([piece(ee_block, lblk, true), grown]);
                return Conversion { zero: Vec::new(), replace };
            }
        }
    }
    // Zeros only inside the file: the kernel's EXT4_EXT_MAY_ZEROOUT.
    let max_zero = if ex.end() <= eof_block.max(end) { zeroout as u64 } else { 0 };
    let (mut from, mut to) = (lblk, end);
    let mut zero = Vec::new();
    if max_zero > 0 && ex.len as u64 <= 2 * max_zero {
        (from, to) = (ee_block, ex.end());
    } else if max_zero > 0 && ex.end() - lblk > len {
        if ex.end() - lblk <= max_zero {
            to = ex.end(); // case 3: the tail is zeroed
        }
        if lblk - ee_block + (to - lblk) < max_zero {
            from = ee_block; // case 2: the head is zeroed
        }
    }
    if from < lblk {
        zero.push((at(from), lblk - from));
    }
    if to > end {
        zero.push((at(end), to - end));
    }
    let mut pieces: Vec<Extent> = left.into_iter().collect();
    if from > ee_block {
        pieces.push(piece(ee_block, from, true));
    }
    pieces.push(piece(from, to, false));
    if to < ex.end() {
        pieces.push(piece(to, ex.end(), true));
    }
    pieces.extend(right);
    // The pieces join the neighbours they continue (the kernel's try_to_merge).
    let mut replace: Vec<Extent> = Vec::with_capacity(pieces.len());
    for e in pieces {
        match replace.last_mut() {
            Some(last) if continues(last, &e) => last.len += e.len,
            _ => replace.push(e),
        }
    }
    Conversion { zero, replace }
}

impl Filesystem {
    /// Marking logical blocks [lblk, lblk + len) of `inode` written, in two
    /// halves; they lie inside one unwritten extent (the caller mapped them so).
    /// This half finds the extent and plans the change, reading only; the caller
    /// then writes its data and the plan's zeros, and only then
    /// `apply_unwritten_conversion` edits the extent's leaf in place (see the
    /// module comment for the rules), splitting it only when it overflows. So a
    /// failed data write changes nothing. `zeroout` is extent_zeroout_len as read
    /// at the start of the caller's operation; the end of file is `inode.i_size`
    /// as it was before it.
    ///
    /// # Errors
    /// `Corrupt` if the range is not inside one unwritten extent; `Io`.
    pub(crate) fn plan_unwritten_conversion(
        &self,
        ino: u32,
        inode: &Inode,
        lblk: u64,
        len: u64,
        zeroout: u32,
    ) -> Result<PlannedConversion> {
        let bs = self.vol.geo.block_size as u64;
        let eof_block = inode.i_size.div_ceil(bs).max(lblk + len);
        let path = self.extent_path(ino, inode, lblk as u32)?;
        let leaf = path.len() - 1;
        let items = &path[leaf].items;
        let extent_at = |i: usize| match items.get(i) {
            Some(Item::Ext(e)) => Some(*e),
            _ => None,
        };
        let pos = items.partition_point(|i| i.key() as u64 <= lblk);
        let ex = pos
            .checked_sub(1)
            .and_then(extent_at)
            .filter(|e| e.unwritten && e.ee_block as u64 <= lblk && lblk + len <= e.end());
        let Some(ex) = ex else {
            return Err(Error::corrupt(
                format!("blocks {lblk}..{} are not inside one unwritten extent", lblk + len),
                format!("extent tree of inode {ino}"),
            ));
        };
        let pos = pos - 1;
        let left = pos.checked_sub(1).and_then(extent_at);
        let right = extent_at(pos + 1);
        let plan = plan(ex, left, right, lblk, len, eof_block, zeroout);
        let first = if left.is_some() { pos - 1 } else { pos };
        let window = 1 + left.is_some() as usize + right.is_some() as usize;
        Ok(PlannedConversion { path, leaf, first, window, plan })
    }

    /// The second half of a conversion: puts the planned extents in the leaf.
    /// The caller has written the data and the plan's zeros.
    ///
    /// # Errors
    /// `NoSpace` when the leaf must split and no block is left (the tree is then
    /// as it was, the zeros written harmlessly into still-unwritten blocks); `Io`.
    pub(crate) fn apply_unwritten_conversion(
        &self,
        tx: &mut Handle,
        ino: u32,
        inode: &mut Inode,
        planned: PlannedConversion,
    ) -> Result<()> {
        let PlannedConversion { mut path, leaf, first, window, plan } = planned;
        let items = plan.replace.into_iter().map(Item::Ext).collect();
        self.splice_items(tx, ino, inode, &mut path, leaf, first, window, items)
    }

    /// Writes zeros over `count` blocks from `pblk` (file data, straight to the
    /// device, in requests of up to 1 MiB).
    pub(crate) fn zero_blocks(&self, pblk: u64, count: u64) -> Result<()> {
        const CHUNK_BYTES: u64 = 1 << 20;
        let bs = self.vol.geo.block_size as u64;
        let chunk_blocks = (CHUNK_BYTES / bs).max(1);
        let zeros = vec![0u8; (chunk_blocks.min(count) * bs) as usize];
        let mut done = 0;
        while done < count {
            let n = chunk_blocks.min(count - done);
            self.vol.cache.write_data_at((pblk + done) * bs, &zeros[..(n * bs) as usize])?;
            done += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(ee_block: u32, len: u32, unwritten: bool, start: u64) -> Extent {
        Extent { ee_block, len, unwritten, start }
    }
    fn shape(c: &Conversion) -> Vec<(u32, u32, bool)> {
        c.replace.iter().map(|e| (e.ee_block, e.len, e.unwritten)).collect()
    }

    /// The first recipe: block 0 written, 1..256 preallocated past an EOF
    /// of one block, a write at 2: split in three, nothing zeroed.
    #[test]
    fn past_eof_splits_without_zeroing() {
        let left = ext(0, 1, false, 1000);
        let c = plan(ext(1, 255, true, 1001), Some(left), None, 2, 1, 3, 256);
        assert!(c.zero.is_empty());
        assert_eq!(shape(&c), vec![(0, 1, false), (1, 1, true), (2, 1, false), (3, 253, true)]);
    }

    #[test]
    fn inside_eof_small_extent_is_zeroed_whole() {
        let c = plan(ext(10, 14, true, 500), None, None, 15, 1, 100, 7);
        assert_eq!(c.zero, vec![(500, 5), (506, 8)]);
        assert_eq!(shape(&c), vec![(10, 14, false)]);
    }

    #[test]
    fn case_3_zeroes_a_short_tail() {
        // 100 blocks, zeroout 7: the write at 95 leaves a tail of 4.
        let c = plan(ext(0, 100, true, 500), None, None, 95, 1, 200, 7);
        assert_eq!(c.zero, vec![(596, 4)]);
        assert_eq!(shape(&c), vec![(0, 95, true), (95, 5, false)]);
    }

    #[test]
    fn case_2_zeroes_a_short_head() {
        let c = plan(ext(0, 100, true, 500), None, None, 3, 1, 200, 7);
        assert_eq!(c.zero, vec![(500, 3)]);
        assert_eq!(shape(&c), vec![(0, 4, false), (4, 96, true)]);
    }

    #[test]
    fn middle_write_splits_in_three_and_zeroout_0_never_zeroes() {
        for zeroout in [0, 7] {
            let c = plan(ext(0, 100, true, 500), None, None, 50, 2, 200, zeroout);
            assert!(c.zero.is_empty());
            assert_eq!(shape(&c), vec![(0, 50, true), (50, 2, false), (52, 48, true)]);
        }
    }

    #[test]
    fn edge_writes_move_blocks_to_a_written_neighbour() {
        let left = ext(0, 10, false, 490);
        let c = plan(ext(10, 100, true, 500), Some(left), None, 10, 3, 200, 256);
        assert!(c.zero.is_empty(), "the transfer comes before any zero-out");
        assert_eq!(shape(&c), vec![(0, 13, false), (13, 97, true)]);
        let right = ext(110, 10, false, 600);
        let c = plan(ext(10, 100, true, 500), None, Some(right), 105, 5, 200, 256);
        assert_eq!(shape(&c), vec![(10, 95, true), (105, 15, false)]);
        assert_eq!(c.replace[1].start, 595);
    }

    #[test]
    fn the_written_piece_merges_with_both_neighbours() {
        let left = ext(0, 10, false, 490);
        let right = ext(12, 5, false, 502);
        let c = plan(ext(10, 2, true, 500), Some(left), Some(right), 10, 2, 200, 0);
        assert_eq!(shape(&c), vec![(0, 17, false)]);
    }
}
