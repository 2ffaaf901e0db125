//! Where a filesystem lies on a larger device: a byte offset the user gives,
//! or a partition found by number in an MBR or GPT table; and `BoundedDevice`,
//! which keeps every read and write inside that region.
//!
//! Invariants: a region always lies wholly inside its device (checked before
//! any filesystem byte is read), and nothing outside it is ever written, so the
//! partition table and the other partitions stay byte for byte as they were.
//! The tables are read as the kernel's partition parsers read them (MBR entries
//! 1-4, logical partitions 5 onward along the extended partition's chain; GPT
//! header and entry array checked by their CRC32) and a damaged one is a
//! `Corrupt` error, never a guess.

use super::{BlockDevice, HostRange, IoModel, IoStats};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Which part of a device holds the filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Region {
    /// All of it.
    #[default]
    Whole,
    /// From this byte offset to the end (fuse2fs's `-o offset=`).
    Offset(u64),
    /// Partition N (from 1) of the device's MBR or GPT table.
    Partition(u32),
}

impl std::fmt::Display for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Region::Whole => write!(f, "the whole image"),
            Region::Offset(offset) => write!(f, "offset {offset}"),
            Region::Partition(n) => write!(f, "partition {n}"),
        }
    }
}

impl Region {
    /// Byte offset and length of the region on `dev`.
    ///
    /// # Errors
    /// `Invalid` when the offset lies past the end of the device or the
    /// partition does not exist; `Corrupt` when the table is damaged;
    /// `Unsupported` when the device holds no table this reads.
    pub fn locate(self, dev: &dyn BlockDevice) -> Result<(u64, u64)> {
        match self {
            Region::Whole => Ok((0, dev.size())),
            Region::Offset(offset) if offset < dev.size() => Ok((offset, dev.size() - offset)),
            Region::Offset(offset) => {
                Err(Error::Invalid(format!("offset {offset} lies past the end of the device ({} bytes)", dev.size())))
            }
            Region::Partition(n) => find_partition(dev, n),
        }
    }
}

/// A window onto another device: offsets count from `start`, and nothing
/// before `start` or from `start + len` on can be read or written.
pub struct BoundedDevice {
    inner: Arc<dyn BlockDevice>,
    start: u64,
    len: u64,
}

impl BoundedDevice {
    /// The region `region` of `inner`, or `inner` itself for `Region::Whole`.
    ///
    /// # Errors
    /// As `Region::locate`.
    pub fn open(inner: Arc<dyn BlockDevice>, region: Region) -> Result<Arc<dyn BlockDevice>> {
        if region == Region::Whole {
            return Ok(inner);
        }
        let (start, len) = region.locate(inner.as_ref())?;
        Ok(Arc::new(BoundedDevice { inner, start, len }))
    }

    fn outer(&self, offset: u64, len: usize) -> Result<u64> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(self.start + offset),
            _ => Err(Error::corrupt(
                format!("access to bytes {offset}..+{len} lies beyond the end of the partition ({} bytes)", self.len),
                "device",
            )),
        }
    }
}

impl BlockDevice for BoundedDevice {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(self.outer(offset, buf.len())?, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.inner.write_at(self.outer(offset, buf.len())?, buf)
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    fn size(&self) -> u64 {
        self.len
    }

    fn stats(&self) -> IoStats {
        self.inner.stats()
    }

    fn in_use(&self) -> Option<String> {
        self.inner.in_use()
    }

    fn io_model(&self) -> Option<&Arc<IoModel>> {
        self.inner.io_model()
    }

    fn host_range(&self, offset: u64, len: usize) -> Result<Option<HostRange<'_>>> {
        self.inner.host_range(self.outer(offset, len)?, len)
    }
}

const SECTOR: u64 = 512;
const MBR_SIGNATURE: [u8; 2] = [0x55, 0xAA];
const GPT_PROTECTIVE: u8 = 0xEE;
const EXTENDED_TYPES: [u8; 3] = [0x05, 0x0F, 0x85];
/// Largest GPT entry accepted (UEFI allows any multiple of 8 from 128 up).
const MAX_GPT_ENTRY: usize = 4096;
/// Logical partitions followed before the chain is called a loop.
const MAX_LOGICAL: u32 = 256;

fn read(dev: &dyn BlockDevice, offset: u64, len: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    dev.read_at(offset, &mut buf)?;
    Ok(buf)
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | u64::from(le32(b, at + 4)) << 32
}

/// One MBR slot: type, first sector and sector count (relative to `base`).
fn mbr_entry(sector: &[u8], slot: usize) -> (u8, u64, u64) {
    let at = 446 + slot * 16;
    (sector.get(at + 4).copied().unwrap_or(0), u64::from(le32(sector, at + 8)), u64::from(le32(sector, at + 12)))
}

fn find_partition(dev: &dyn BlockDevice, n: u32) -> Result<(u64, u64)> {
    if n == 0 {
        return Err(Error::Invalid("partitions are numbered from 1".into()));
    }
    if dev.size() < SECTOR {
        return Err(Error::unsupported("a partition table (the device is smaller than one sector)"));
    }
    let mbr = read(dev, 0, SECTOR as usize)?;
    if mbr.get(510..512) != Some(&MBR_SIGNATURE[..]) {
        return Err(Error::unsupported("a partition table (no MBR signature 55 AA in sector 0)"));
    }
    let (start, len) = if (0..4).any(|slot| mbr_entry(&mbr, slot).0 == GPT_PROTECTIVE) {
        gpt_partition(dev, n)?
    } else {
        mbr_partition(dev, &mbr, n)?
    };
    // Sector numbers come from the table: hostile ones must not wrap.
    let bytes = |sectors: u64| sectors.saturating_mul(SECTOR);
    let (start, len) = (bytes(start), bytes(len));
    match start.checked_add(len) {
        Some(end) if end <= dev.size() && len > 0 => Ok((start, len)),
        _ => Err(Error::corrupt(
            format!("partition {n} (bytes {start}..+{len}) lies beyond the end of the device ({} bytes)", dev.size()),
            "partition table",
        )),
    }
}

/// Whether `dev` starts with an MBR (or a GPT's protective MBR): sector 0
/// ends in the 55 AA signature. A bare ext4 image has zeros there (its first
/// 1,024 bytes are unused), so this tells a whole disk from a filesystem.
pub fn starts_with_partition_table(dev: &dyn BlockDevice) -> bool {
    dev.size() >= SECTOR && read(dev, 0, SECTOR as usize).is_ok_and(|mbr| mbr.get(510..512) == Some(&MBR_SIGNATURE[..]))
}

/// Primary partitions 1-4 from the MBR; 5 onward along the extended
/// partition's chain of EBRs, each holding one logical partition and a link.
fn mbr_partition(dev: &dyn BlockDevice, mbr: &[u8], n: u32) -> Result<(u64, u64)> {
    let missing = || Error::Invalid(format!("the MBR has no partition {n}"));
    if n <= 4 {
        let (kind, start, len) = mbr_entry(mbr, n as usize - 1);
        if kind == 0 || len == 0 {
            return Err(missing());
        }
        if EXTENDED_TYPES.contains(&kind) {
            return Err(Error::Invalid(format!("partition {n} is the extended partition, which holds no filesystem")));
        }
        return Ok((start, len));
    }
    let extended = (0..4).map(|slot| mbr_entry(mbr, slot)).find(|e| EXTENDED_TYPES.contains(&e.0));
    let Some((_, ext_start, _)) = extended else { return Err(missing()) };
    let mut ebr_at = ext_start;
    for number in 5..5 + MAX_LOGICAL {
        let ebr = read(dev, ebr_at.checked_mul(SECTOR).ok_or_else(missing)?, SECTOR as usize)?;
        if ebr.get(510..512) != Some(&MBR_SIGNATURE[..]) {
            return Err(Error::corrupt(format!("EBR at sector {ebr_at} has no signature"), "partition table"));
        }
        let (kind, start, len) = mbr_entry(&ebr, 0);
        if number == n {
            if kind == 0 || len == 0 {
                return Err(missing());
            }
            return Ok((ebr_at + start, len));
        }
        let (next_kind, next, _) = mbr_entry(&ebr, 1);
        if next_kind == 0 || next == 0 {
            return Err(missing());
        }
        // Links count from the extended partition's start.
        ebr_at = ext_start + next;
    }
    Err(Error::corrupt(format!("the chain of logical partitions is longer than {MAX_LOGICAL}"), "partition table"))
}

/// CRC-32 (IEEE 802.3, reflected), as GPT's header and entry array carry.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn gpt_partition(dev: &dyn BlockDevice, n: u32) -> Result<(u64, u64)> {
    let damaged = |what: String| Error::corrupt(what, "GPT header (LBA 1)");
    let header = read(dev, SECTOR, SECTOR as usize)?;
    if header.get(0..8) != Some(&b"EFI PART"[..]) {
        return Err(damaged("no 'EFI PART' signature behind a protective MBR".into()));
    }
    let header_len = le32(&header, 12) as usize;
    if !(92..=SECTOR as usize).contains(&header_len) {
        return Err(damaged(format!("header size {header_len}")));
    }
    let mut covered = header[..header_len].to_vec();
    covered[16..20].fill(0);
    if crc32(&covered) != le32(&header, 16) {
        return Err(damaged("header CRC32 mismatch".into()));
    }
    let entries_at = le64(&header, 72);
    let count = le32(&header, 80);
    let entry_len = le32(&header, 84) as usize;
    // The array is read whole into memory: bound what a hostile header asks for
    // (real tables hold 128 entries of 128 bytes).
    if entry_len < 128 || !entry_len.is_multiple_of(8) || entry_len > MAX_GPT_ENTRY || count > 1 << 16 {
        return Err(damaged(format!("{count} entries of {entry_len} bytes")));
    }
    if n > count {
        return Err(Error::Invalid(format!("the GPT holds {count} entries; there is no partition {n}")));
    }
    let array_len = count as usize * entry_len;
    let array = read(dev, entries_at.checked_mul(SECTOR).ok_or_else(|| damaged("entry array LBA".into()))?, array_len)?;
    if crc32(&array) != le32(&header, 88) {
        return Err(damaged("partition entry array CRC32 mismatch".into()));
    }
    let entry = &array[(n as usize - 1) * entry_len..n as usize * entry_len];
    if entry[..16].iter().all(|&b| b == 0) {
        return Err(Error::Invalid(format!("GPT entry {n} is unused; there is no partition {n}")));
    }
    let (first, last) = (le64(entry, 32), le64(entry, 40));
    if last < first {
        return Err(damaged(format!("entry {n} ends (LBA {last}) before it starts (LBA {first})")));
    }
    let len = (last - first).checked_add(1).ok_or_else(|| damaged(format!("entry {n} spans every LBA")))?;
    Ok((first, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    #[test]
    fn crc32_is_ieee() {
        // The check value every CRC-32 (IEEE) implementation gives for "123456789".
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn mbr_primary_and_logical_partitions_are_found_and_bounded() {
        let mut disk = vec![0u8; 64 * 512];
        let entry = |d: &mut [u8], sector: usize, slot: usize, kind: u8, start: u32, len: u32| {
            let at = sector * 512 + 446 + slot * 16;
            d[at + 4] = kind;
            d[at + 8..at + 12].copy_from_slice(&start.to_le_bytes());
            d[at + 12..at + 16].copy_from_slice(&len.to_le_bytes());
            d[sector * 512 + 510..sector * 512 + 512].copy_from_slice(&MBR_SIGNATURE);
        };
        entry(&mut disk, 0, 0, 0x83, 2, 10);
        entry(&mut disk, 0, 1, 0x05, 20, 40);
        entry(&mut disk, 20, 0, 0x83, 1, 5); // partition 5: sectors 21..26
        entry(&mut disk, 20, 1, 0x05, 10, 20); // next EBR at 30
        entry(&mut disk, 30, 0, 0x83, 2, 8); // partition 6: sectors 32..40
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(disk));
        assert_eq!(Region::Partition(1).locate(dev.as_ref()).unwrap(), (1024, 5120));
        assert_eq!(Region::Partition(5).locate(dev.as_ref()).unwrap(), (21 * 512, 5 * 512));
        assert_eq!(Region::Partition(6).locate(dev.as_ref()).unwrap(), (32 * 512, 8 * 512));
        assert!(matches!(Region::Partition(2).locate(dev.as_ref()), Err(Error::Invalid(_))));
        assert!(matches!(Region::Partition(3).locate(dev.as_ref()), Err(Error::Invalid(_))));
        assert!(matches!(Region::Partition(7).locate(dev.as_ref()), Err(Error::Invalid(_))));
        let part = BoundedDevice::open(dev.clone(), Region::Partition(1)).unwrap();
        part.write_at(0, &[7u8; 512]).unwrap();
        assert!(part.write_at(5120 - 511, &[7u8; 512]).is_err(), "a write past the partition's end");
        assert!(part.read_at(u64::MAX - 10, &mut [0u8; 16]).is_err());
        let mut sector = [0u8; 512];
        dev.read_at(1024, &mut sector).unwrap();
        assert_eq!(sector, [7u8; 512]);
        assert!(matches!(Region::Offset(1 << 20).locate(dev.as_ref()), Err(Error::Invalid(_))));
    }
}
