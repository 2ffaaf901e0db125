//! What each block holds, as the I/O model sorts requests.
//!
//! Two sources answer "what is block b": fixed ranges, known from the geometry
//! once the group descriptors and the journal are read (superblock copies and
//! descriptors, bitmaps, inode tables, the journal), and tags, set by the layer
//! that reads or makes a block whose role depends on use (a directory block, an
//! extent node, an xattr block). A tag lives until the block is freed
//! (`BlockClasses::untag`, which the cache's `forget` calls), so a block read
//! again after eviction keeps its class. A block neither range nor tag names is
//! file data: file data is the one kind written behind the cache, with no
//! layer in between to tag it.
//!
//! Invariant: fixed ranges are sorted by start and do not overlap (the volume
//! refuses images whose metadata overlaps before a writable open).

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;

/// What a block holds, for counting requests and pricing them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IoClass {
    /// Superblock copies, group descriptors, reserved descriptor blocks.
    Superblock,
    /// Block and inode bitmaps.
    Bitmap,
    InodeTable,
    /// Directory blocks: linear blocks, htree leaves and index nodes.
    Directory,
    /// Extent tree nodes below the inode (and indirect blocks).
    ExtentNode,
    FileData,
    /// The jbd2 log.
    Journal,
    /// Anything else with a tag: xattr blocks, the orphan file.
    Other,
}

impl IoClass {
    pub const ALL: [IoClass; 8] = [
        IoClass::Superblock,
        IoClass::Bitmap,
        IoClass::InodeTable,
        IoClass::Directory,
        IoClass::ExtentNode,
        IoClass::FileData,
        IoClass::Journal,
        IoClass::Other,
    ];

    /// The name results and reports use.
    pub fn name(self) -> &'static str {
        match self {
            IoClass::Superblock => "superblock",
            IoClass::Bitmap => "bitmap",
            IoClass::InodeTable => "inode_table",
            IoClass::Directory => "directory",
            IoClass::ExtentNode => "extent_node",
            IoClass::FileData => "file_data",
            IoClass::Journal => "journal",
            IoClass::Other => "other",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

const TAG_SHARDS: usize = 16;

/// Block number -> class: fixed ranges plus tags.
#[derive(Default)]
pub struct BlockClasses {
    /// [start, end) and class, sorted by start, not overlapping.
    fixed: RwLock<Vec<(u64, u64, IoClass)>>,
    tags: [Mutex<HashMap<u64, IoClass>>; TAG_SHARDS],
}

impl BlockClasses {
    /// Adds fixed ranges ([start, end), class). Ranges overlapping one already
    /// known are ignored: the first description of a block stands.
    pub fn add_fixed(&self, ranges: impl IntoIterator<Item = (u64, u64, IoClass)>) {
        let mut fixed = self.fixed.write();
        for (start, end, class) in ranges {
            if start >= end {
                continue;
            }
            let at = fixed.partition_point(|r| r.0 < start);
            let clashes_before = at > 0 && fixed[at - 1].1 > start;
            let clashes_after = fixed.get(at).is_some_and(|r| r.0 < end);
            if !clashes_before && !clashes_after {
                fixed.insert(at, (start, end, class));
            }
        }
    }

    /// The fixed ranges, to hand to another model.
    pub fn fixed_ranges(&self) -> Vec<(u64, u64, IoClass)> {
        self.fixed.read().clone()
    }

    fn shard(&self, block: u64) -> &Mutex<HashMap<u64, IoClass>> {
        &self.tags[crate::number_map::shard_of(block, TAG_SHARDS)]
    }

    /// Says what `block` holds until it is freed.
    pub fn tag(&self, block: u64, class: IoClass) {
        self.shard(block).lock().insert(block, class);
    }

    /// `block` was freed: whatever it holds next is not what it held.
    pub fn untag(&self, block: u64) {
        self.shard(block).lock().remove(&block);
    }

    /// What `block` holds.
    pub fn class_of(&self, block: u64) -> IoClass {
        {
            let fixed = self.fixed.read();
            let at = fixed.partition_point(|r| r.0 <= block);
            if let Some(&(_, end, class)) = at.checked_sub(1).and_then(|i| fixed.get(i)) {
                if block < end {
                    return class;
                }
            }
        }
        self.shard(block).lock().get(&block).copied().unwrap_or(IoClass::FileData)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_answer_first_then_tags_then_file_data() {
        let c = BlockClasses::default();
        c.add_fixed([(10, 20, IoClass::InodeTable), (0, 2, IoClass::Superblock), (5, 6, IoClass::Bitmap)]);
        c.add_fixed([(15, 30, IoClass::Journal)]);
        assert_eq!(c.class_of(0), IoClass::Superblock);
        assert_eq!(c.class_of(2), IoClass::FileData);
        assert_eq!(c.class_of(5), IoClass::Bitmap);
        assert_eq!(c.class_of(19), IoClass::InodeTable);
        assert_eq!(c.class_of(25), IoClass::FileData, "an overlapping range is ignored whole");
        c.tag(25, IoClass::Directory);
        c.tag(12, IoClass::Directory);
        assert_eq!(c.class_of(25), IoClass::Directory);
        assert_eq!(c.class_of(12), IoClass::InodeTable, "a fixed range outranks a tag");
        c.untag(25);
        assert_eq!(c.class_of(25), IoClass::FileData);
    }
}
