//! The two checksums ext4 uses: crc32c (metadata_csum) and crc16 (old group descriptors).
//!
//! ext4's crc32c is the raw Castagnoli CRC state: the caller passes a seed, and the
//! result is not inverted at the end (e2fsprogs' `ext2fs_crc32c_le`). A full, standard
//! crc32c is therefore `!crc32c(!0, data)`. crc16 is the ANSI polynomial (0x8005,
//! reflected as 0xA001), seeded with ~0, as `ext2fs_crc16` computes it.

/// Raw crc32c state update: no pre- or post-inversion (ext4's convention).
///
/// Computed by the `crc32c` crate (SSE4.2 or ARMv8 CRC instructions when the CPU
/// has them, chosen at run time; a table fallback otherwise). That crate keeps
/// the standard convention (invert in, invert out): inverting its input and its
/// result gives the raw state, `raw(seed) = !append(!seed)`.
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

static CRC16_TABLE: [u16; 256] = build_crc16_table();

const fn build_crc16_table() -> [u16; 256] {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u16;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xA001 } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

/// crc16 (ANSI, reflected) state update, as used by uninit_bg group descriptor checksums.
pub fn crc16(seed: u16, data: &[u8]) -> u16 {
    let mut crc = seed;
    for &b in data {
        crc = (crc >> 8) ^ CRC16_TABLE[((crc ^ b as u16) & 0xff) as usize];
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The published check value of CRC-32C over "123456789" is 0xE3069283;
        // the standard form inverts in and out, the raw form does neither.
        assert_eq!(!crc32c(!0, b"123456789"), 0xE306_9283);
        // Continuing from a raw state must equal one pass, at every split (the
        // raw convention chains where the standard one would not).
        let data: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37)).collect();
        for split in 0..data.len() {
            let a = crc32c(crc32c(!0, &data[..split]), &data[split..]);
            assert_eq!(a, crc32c(!0, &data));
        }
        // A raw state from a seed other than ~0, as ext4 chains its seeds: the
        // bit-at-a-time definition decides.
        let bitwise = |seed: u32, data: &[u8]| {
            let mut crc = seed;
            for &b in data {
                crc ^= b as u32;
                for _ in 0..8 {
                    crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
                }
            }
            crc
        };
        for seed in [0, 1, 0xdead_beef, !0] {
            for len in [0, 1, 7, 8, 9, 63, 64, 65, 4096] {
                let d: Vec<u8> = (0..len).map(|i| (i * 131 + 7) as u8).collect();
                assert_eq!(crc32c(seed, &d), bitwise(seed, &d), "seed {seed:#x}, {len} bytes");
            }
        }
    }

    #[test]
    fn crc16_matches_the_standard_arc_check_value() {
        // CRC-16/ARC (poly 0x8005 reflected, init 0) of "123456789" is 0xBB3D.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
    }
}
