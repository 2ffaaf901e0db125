//! Block and inode bitmap checksums (metadata_csum): crc32c(fs seed, the bitmap's
//! meaningful bytes) — clusters_per_group / 8 or inodes_per_group / 8 bytes. The
//! group descriptor stores the low 16 bits, and the high 16 when it is 64 bytes.

use super::csum::crc32c;

pub fn checksum(bitmap: &[u8], bits: u32, fs_seed: u32) -> u32 {
    crc32c(fs_seed, &bitmap[..(bits as usize / 8).min(bitmap.len())])
}

/// Compares with a descriptor's stored value, only the low half for 32-byte descriptors.
pub fn matches(stored: u32, computed: u32, desc_size: usize) -> bool {
    if desc_size >= 64 {
        stored == computed
    } else {
        stored & 0xffff == computed & 0xffff
    }
}

#[inline]
pub fn test_bit(bitmap: &[u8], bit: usize) -> bool {
    bitmap[bit / 8] & (1 << (bit % 8)) != 0
}

#[inline]
pub fn set_bit(bitmap: &mut [u8], bit: usize) {
    bitmap[bit / 8] |= 1 << (bit % 8);
}

#[inline]
pub fn clear_bit(bitmap: &mut [u8], bit: usize) {
    bitmap[bit / 8] &= !(1 << (bit % 8));
}
