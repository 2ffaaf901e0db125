//! Inode goals from the name hash, `hash_goal` (seed 003, Daniel Phillips'
//! option 6; HAMMER numbers its inodes from the name hash the same way).
//!
//! An indexed directory lists its names in hash order (the kernel's readdir of
//! an htree walks its leaves by hash), so when inode numbers follow the hash
//! too, a readdir-order walk (rm -rf, a backup, stat of every entry) visits the
//! inode table in order instead of at random, and each inode-table block is
//! read and written once.
//!
//! Each indexed directory gets a span of inode numbers, [start, start + len),
//! beginning just after the directory's own inode and reaching `SPAN_GROUPS`
//! groups on (a flex group's worth with mkfs's default of 16 groups per flex
//! group) or the end of the filesystem. A name whose hash is h (of 2^32) aims
//! at the fraction h / 2^32 of the span. Of the span the directory uses only
//! every `stride`-th slot at first, the stride chosen so those slots number
//! about twice the entries it has; when the slots around a goal are all taken,
//! the stride halves: the directory's window of slots doubles (Daniel's "a new
//! region twice the size") without moving any inode it already has, and the new
//! slots fall between the old ones, so hash order and inode order still agree.
//!
//! Only when the span is full (a name with a hash was placed outside it: by the
//! ordinary pass, or by a `dir_ireserve` window when both options are on,
//! which may come a little early) does the directory move on to a new span
//! twice as long, starting where the old one ends. Names arrive in random hash
//! order, so each span holds the whole hash range again: a hash-order walk is
//! one ascending run of inode numbers per span, interleaved, which the inode
//! table's read-ahead follows as separate walks (inodes.rs, `TableWalks`), and
//! which costs the rank correlation of hash and inode order what the later
//! spans hold. A span that would start past the last inode is not made: the
//! directory's later names go where the ordinary pass puts them.
//!
//! The span is a goal, not a reservation: other directories may take slots in
//! it, and a slot taken pushes the goal to the next free one. Spreading a
//! directory over a span costs locality while it is small (its inodes sit up
//! to `stride` slots apart, one per inode-table block at first); that is the
//! price Daniel named. After a remount the span is derived again from the leaf
//! block the name goes into: a straight line fitted through its entries'
//! (hash, inode) pairs, with stride 1. A directory that had outgrown its first
//! span has leaves mixing names of several spans, through which no line fits
//! well (or at all: then it gets a fresh span, which the doubling moves on from
//! as before); its new names keep only the order within each leaf.
//!
//! The state mutex is a leaf lock, taken under a group lock or alone.

use super::inode::{InodePolicy, InodeRequest};
use crate::format::bitmap;
use crate::volume::Volume;
use parking_lot::Mutex;
use std::collections::HashMap;

/// How many groups a span reaches.
const SPAN_GROUPS: u64 = 16;

/// Slots on the grid tried from the goal before the stride halves.
const PROBE: u64 = 4;

/// Directories remembered at most (as `dir_ireserve`).
const MAX_DIRS: usize = 1 << 20;

/// A directory's span: inode numbers [start, start + len), every `stride`-th in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub len: u32,
    pub stride: u32,
}

impl Span {
    /// The grid position (inode number) hash `h` aims at.
    fn goal(self, h: u32) -> u64 {
        let slots = (self.len / self.stride).max(1) as u64;
        self.start as u64 + ((h as u64 * slots) >> 32) * self.stride as u64
    }

    fn end(self) -> u64 {
        self.start as u64 + self.len as u64
    }
}

/// The `hash_goal` placement policy (see the module comment).
#[derive(Default)]
pub struct HashGoal {
    /// By directory; None once the directory has outgrown the last span the
    /// filesystem has room for.
    spans: Mutex<HashMap<u32, Option<DirSpans>>>,
}

/// A directory's current span, and where its first one began: its earlier
/// spans lie in [origin, span.start), one after the other.
#[derive(Clone, Copy, Debug)]
struct DirSpans {
    span: Span,
    origin: u32,
}

impl DirSpans {
    fn new(span: Span) -> DirSpans {
        DirSpans { span, origin: span.start }
    }
}

impl HashGoal {
    pub fn new() -> HashGoal {
        HashGoal::default()
    }

    /// A new span for `req`'s parent: fitted to its leaf after a remount, else
    /// fresh.
    fn new_span(&self, vol: &Volume, req: &InodeRequest) -> Span {
        let last = vol.geo.inodes_count as u64;
        let fresh = || {
            let start = req.parent as u64 + 1;
            let len = (SPAN_GROUPS * vol.geo.inodes_per_group as u64).min(last + 1 - start.min(last)).max(1);
            let entries = req.parent_blocks.max(1) * (req.leaf.len() as u64).max(1);
            let stride = prev_power_of_two(len / (2 * entries)).max(1);
            Span { start: start as u32, len: len as u32, stride: stride.min(len) as u32 }
        };
        match fit(&req.leaf) {
            Some((start, len)) if start >= 1.0 && len >= req.leaf.len() as f64 && start + len <= last as f64 + 1.0 => {
                Span { start: start as u32, len: len as u32, stride: 1 }
            }
            _ => fresh(),
        }
    }
}

fn prev_power_of_two(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        1 << (63 - n.leading_zeros())
    }
}

/// A straight line ino = start + len * hash / 2^32 through (hash, inode) pairs,
/// by least squares; None with fewer than four pairs or a line that falls.
fn fit(pairs: &[(u32, u32)]) -> Option<(f64, f64)> {
    if pairs.len() < 4 {
        return None;
    }
    let n = pairs.len() as f64;
    let xs = pairs.iter().map(|&(h, _)| h as f64 / 4_294_967_296.0);
    let mean_x = xs.clone().sum::<f64>() / n;
    let mean_y = pairs.iter().map(|&(_, i)| i as f64).sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (x, &(_, i)) in xs.zip(pairs) {
        sxy += (x - mean_x) * (i as f64 - mean_y);
        sxx += (x - mean_x) * (x - mean_x);
    }
    if sxx <= 0.0 || sxy <= 0.0 {
        return None;
    }
    let len = sxy / sxx;
    Some((mean_y - len * mean_x, len))
}

impl InodePolicy for HashGoal {
    fn group_order(&self, vol: &Volume, req: &InodeRequest) -> Vec<u32> {
        super::inode::MainlinePolicy.group_order(vol, req)
    }

    /// The groups of the span, from the goal's onward, then from the span's start.
    fn preferred(&self, vol: &Volume, req: &InodeRequest) -> Vec<u32> {
        let Some(h) = req.name_hash else { return Vec::new() };
        let span = {
            let mut spans = self.spans.lock();
            if spans.len() >= MAX_DIRS {
                spans.clear();
            }
            match *spans.entry(req.parent).or_insert_with(|| Some(DirSpans::new(self.new_span(vol, req)))) {
                Some(d) => d.span,
                None => return Vec::new(),
            }
        };
        let ipg = vol.geo.inodes_per_group as u64;
        let group = |ino: u64| ((ino - 1) / ipg) as u32;
        let (first, goal, last) = (group(span.start as u64), group(span.goal(h)), group(span.end() - 1));
        (goal..=last).chain(first..goal).collect()
    }

    fn pick(&self, vol: &Volume, g: u32, bits: &[u8], req: &InodeRequest, usable: &dyn Fn(u32) -> bool) -> Option<u32> {
        let h = req.name_hash?;
        let ipg = vol.geo.inodes_per_group as u64;
        let group_lo = g as u64 * ipg + 1;
        let group_hi = group_lo + ipg;
        let free = |ino: u64| {
            let i = (ino - group_lo) as u32;
            (group_lo..group_hi).contains(&ino) && usable(i) && !bitmap::test_bit(bits, i as usize)
        };
        let mut spans = self.spans.lock();
        let span = &mut spans.get_mut(&req.parent)?.as_mut()?.span;
        // On the grid near the goal; where the grid there is full (and all in
        // this group), halve the stride and look again.
        loop {
            let goal = span.goal(h);
            let probes: Vec<u64> =
                (0..PROBE).map(|k| goal + k * span.stride as u64).filter(|&i| i < span.end()).collect();
            if let Some(&ino) = probes.iter().find(|&&ino| free(ino)) {
                return Some((ino - group_lo) as u32);
            }
            let all_here = !probes.is_empty() && probes.iter().all(|i| (group_lo..group_hi).contains(i));
            if span.stride == 1 || !all_here {
                break;
            }
            span.stride /= 2;
        }
        // Off the grid: the first free slot of the span in this group, from the
        // goal if it lies here.
        let goal = span.goal(h);
        let from = if (group_lo..group_hi).contains(&goal) { goal } else { group_lo.max(span.start as u64) };
        let to = group_hi.min(span.end());
        (from..to).find(|&ino| free(ino)).map(|ino| (ino - group_lo) as u32)
    }

    /// A hashed name placed outside every span its directory has had (see the
    /// module comment): the directory's next names go to a span twice as long,
    /// just past the current one. One placed in an earlier span is no sign
    /// that the current one is full: under pdirops several creates run at once,
    /// and one that picked its slot before another moved the span on reports
    /// after it.
    fn allocated(&self, vol: &Volume, req: &InodeRequest, ino: u32) {
        if req.name_hash.is_none() {
            return;
        }
        let mut spans = self.spans.lock();
        let Some(slot) = spans.get_mut(&req.parent) else { return };
        let Some(DirSpans { span, origin }) = *slot else { return };
        if (origin as u64..span.end()).contains(&(ino as u64)) {
            return;
        }
        let last = vol.geo.inodes_count as u64;
        let start = span.end();
        *slot = (start <= last).then(|| {
            let len = (2 * span.len as u64).min(last + 1 - start);
            DirSpans { span: Span { start: start as u32, len: len as u32, stride: 1 }, origin }
        });
    }

    fn freed(&self, _vol: &Volume, ino: u32, was_dir: bool) {
        if was_dir {
            self.spans.lock().remove(&ino);
        }
    }

    fn wants_neighbours(&self, parent: u32, indexed: bool, _is_dir: bool) -> bool {
        indexed && !self.spans.lock().contains_key(&parent)
    }

    fn wants_name_hash(&self, indexed: bool) -> bool {
        indexed
    }

    fn hash_span(&self, dir: u32) -> Option<Span> {
        self.spans.lock().get(&dir).copied().flatten().map(|d| d.span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_follow_the_hash_and_halving_the_stride_keeps_old_goals() {
        let span = Span { start: 1000, len: 1 << 16, stride: 64 };
        assert_eq!(span.goal(0), 1000);
        assert!(span.goal(1 << 31) > span.goal(1 << 30));
        let half = Span { stride: 32, ..span };
        for h in [0u32, 12345678, 1 << 31, u32::MAX] {
            assert_eq!(span.goal(h) - 1000, (half.goal(h) - 1000) / 64 * 64, "the old grid is part of the new");
        }
        let line: Vec<(u32, u32)> = (0..10u32).map(|k| (k * 400_000_000, 5000 + k * 400_000_000 / 65536)).collect();
        let (start, len) = fit(&line).unwrap();
        assert!((start - 5000.0).abs() < 2.0 && (len - 65536.0).abs() < 20.0, "{start} {len}");
        assert!(fit(&line[..3]).is_none());
    }
}
