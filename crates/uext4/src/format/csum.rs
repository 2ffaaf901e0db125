//! The two checksums ext4 uses: crc32c (metadata_csum) and crc16 (old group descriptors).
//!
//! ext4's crc32c is the raw Castagnoli CRC state: the caller passes a seed, and the
//! result is not inverted at the end (e2fsprogs' `ext2fs_crc32c_le`). A full, standard
//! crc32c is therefore `!crc32c(!0, data)`. crc16 is the ANSI polynomial (0x8005,
//! reflected as 0xA001), seeded with ~0, as `ext2fs_crc16` computes it.

const CRC32C_POLY_REFLECTED: u32 = 0x82F6_3B78;

/// Eight tables for slicing-by-8: table[k][b] is the CRC of byte b followed by k zero bytes.
static CRC32C_TABLES: [[u32; 256]; 8] = build_crc32c_tables();

const fn build_crc32c_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ CRC32C_POLY_REFLECTED } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut i = 0;
    while i < 256 {
        let mut k = 1;
        while k < 8 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            k += 1;
        }
        i += 1;
    }
    t
}

/// Raw crc32c state update: no pre- or post-inversion (ext4's convention).
pub fn crc32c(seed: u32, data: &[u8]) -> u32 {
    let t = &CRC32C_TABLES;
    let mut crc = seed;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][c[4] as usize]
            ^ t[2][c[5] as usize]
            ^ t[1][c[6] as usize]
            ^ t[0][c[7] as usize];
    }
    for &b in chunks.remainder() {
        crc = (crc >> 8) ^ t[0][((crc ^ b as u32) & 0xff) as usize];
    }
    crc
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
        // Slicing-by-8 and the byte loop must agree at every split.
        let data: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37)).collect();
        for split in 0..data.len() {
            let a = crc32c(crc32c(!0, &data[..split]), &data[split..]);
            assert_eq!(a, crc32c(!0, &data));
        }
    }

    #[test]
    fn crc16_matches_the_standard_arc_check_value() {
        // CRC-16/ARC (poly 0x8005 reflected, init 0) of "123456789" is 0xBB3D.
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
    }
}
