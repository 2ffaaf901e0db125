//! Tunables (DESIGN.md, "Tunables"): the options an open or a mount takes, and
//! the ones marked runtime that change while the filesystem is in use. An
//! operation reads each tunable once, at its start, so a change cannot mix
//! values within one operation.
//!
//! dir_ireserve (seed 000) and hash_goal (seed 003) are open-time options that
//! choose the inode placement policy (`alloc::policy_for`); pdirops (seed 002,
//! `ns::pdirops`) chooses how changes in one indexed directory lock;
//! inline_data (seed 004, `inline`) whether new inodes are kept inline on images
//! with the feature. A mechanism not built yet would be listed in NOT_YET: its
//! option parses, accepts the value that describes what uext4 does, and refuses
//! the others by name rather than pretend.

use crate::error::{Error, Result};
use crate::fs::{Filesystem, Options};
use std::sync::atomic::Ordering;

/// One tunable as `tune` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tunable {
    /// Its option name.
    pub name: &'static str,
    /// Its value now.
    pub value: String,
    /// Changeable while open.
    pub runtime: bool,
}

/// Mechanisms named in DESIGN.md that are not implemented yet, with the only
/// value that describes uext4 today.
const NOT_YET: [(&str, &str); 0] = [];

fn on_off(key: &str, value: &str) -> Result<bool> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(Error::Invalid(format!("{key}={value}: expected on or off"))),
    }
}

fn number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
    value.parse().map_err(|_| Error::Invalid(format!("{key}={value}: not a number")))
}

/// A byte count with an optional K, M, G or T suffix (powers of 1024), as
/// `--size`, `--offset` and `-o offset=` take it.
///
/// # Errors
/// A message naming the text when it is not a count, has another suffix, or
/// overflows 64 bits.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let unit = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix '{c}' (use K, M, G or T)")),
            };
            (&s[..i], unit)
        }
        _ => (s, 1),
    };
    let n: u64 = digits.parse().map_err(|_| format!("'{s}' is not a size"))?;
    n.checked_mul(unit).ok_or_else(|| format!("size '{s}' is too large"))
}

/// extent_zeroout_len in blocks, or its alias extent_max_zeroout_kb in KiB.
fn zeroout_blocks(key: &str, value: &str, block_size: u32) -> Result<u32> {
    let n: u32 = number(key, value)?;
    Ok(if key == "extent_max_zeroout_kb" { n / (block_size / 1024).max(1) } else { n })
}

impl Options {
    /// Applies `key=value` (a mount option) to these open options. The zero-out
    /// alias in KiB assumes 4 KiB blocks here; on a mounted filesystem
    /// `Filesystem::set_tunable` converts with the real block size.
    ///
    /// # Errors
    /// `Invalid` for an unknown key or a bad value; `Unsupported` for a mechanism not built (only its
    /// `off` value is taken).
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "cache_mb" => self.cache_mb = number(key, value)?,
            "commit" => {
                self.commit_interval_secs = number(key, value)?;
                if self.commit_interval_secs == 0 {
                    self.commit_interval_secs = 5; // The kernel's commit=0 means the default.
                }
            }
            "extent_zeroout_len" | "extent_max_zeroout_kb" => {
                self.extent_zeroout_len = zeroout_blocks(key, value, 4096)?
            }
            "errors" => self.errors = Some(value.parse()?),
            "dir_ireserve" => self.dir_ireserve = crate::alloc::DirReserve::parse(value)?,
            "hash_goal" => self.hash_goal = on_off(key, value)?,
            "pdirops" => self.pdirops = on_off(key, value)?,
            "inline_data" => self.inline_data = on_off(key, value)?,
            "offset" | "partition" => self.set_region(key, value)?,
            _ => return not_yet(key, value),
        }
        Ok(())
    }
}

impl Options {
    /// `offset=` or `partition=`: where the filesystem lies. A second place
    /// different from one already given (`--partition 2` and `-o
    /// partition=1`, or an offset and a partition) is refused, not a silent
    /// choice of the last.
    fn set_region(&mut self, key: &str, value: &str) -> Result<()> {
        use crate::dev::Region;
        let region = match key {
            "offset" => Region::Offset(parse_size(value).map_err(|e| Error::Invalid(format!("offset={value}: {e}")))?),
            _ => Region::Partition(number(key, value)?),
        };
        if self.region != Region::Whole && self.region != region {
            return Err(Error::Invalid(format!(
                "{key}={value} names a different place than {} given before: give one",
                self.region
            )));
        }
        self.region = region;
        Ok(())
    }
}

fn not_yet(key: &str, value: &str) -> Result<()> {
    match NOT_YET.iter().find(|(name, _)| *name == key) {
        Some((_, today)) if value == *today => Ok(()),
        Some((_, today)) => Err(Error::unsupported(format!(
            "{key}={value} (not implemented yet; only {key}={today} is what uext4 does)"
        ))),
        None => Err(Error::Invalid(format!("unknown option {key}"))),
    }
}

impl Filesystem {
    /// The current zero-out length in blocks (see `Options::extent_zeroout_len`).
    pub fn extent_zeroout_len(&self) -> u32 {
        self.extent_zeroout_len.load(Ordering::Relaxed)
    }

    /// Every tunable with its current value.
    pub fn tunables(&self) -> Vec<Tunable> {
        let mut out = vec![
            Tunable { name: "extent_zeroout_len", value: self.extent_zeroout_len().to_string(), runtime: true },
            Tunable { name: "cache_mb", value: self.cache_mb.to_string(), runtime: false },
            Tunable { name: "commit", value: self.commit_interval_secs.to_string(), runtime: false },
            Tunable { name: "errors", value: self.errors_behaviour().to_string(), runtime: false },
            Tunable { name: "dir_ireserve", value: self.dir_ireserve.to_string(), runtime: false },
            Tunable { name: "hash_goal", value: if self.hash_goal { "on" } else { "off" }.into(), runtime: false },
            Tunable { name: "pdirops", value: if self.pdirops { "on" } else { "off" }.into(), runtime: false },
            Tunable { name: "inline_data", value: if self.inline_data { "on" } else { "off" }.into(), runtime: false },
        ];
        out.extend(NOT_YET.iter().map(|(name, today)| Tunable { name, value: today.to_string(), runtime: false }));
        out
    }

    /// Changes a runtime tunable now; the next operation sees the new value.
    ///
    /// # Errors
    /// `Invalid` for an unknown tunable, a bad value, or one set only when opening.
    pub fn set_tunable(&self, key: &str, value: &str) -> Result<()> {
        match key {
            "extent_zeroout_len" | "extent_max_zeroout_kb" => {
                let blocks = zeroout_blocks(key, value, self.vol.geo.block_size as u32)?;
                self.extent_zeroout_len.store(blocks, Ordering::Relaxed);
                Ok(())
            }
            _ if self.tunables().iter().any(|t| t.name == key) => {
                Err(Error::Invalid(format!("{key} is set when mounting, not while mounted")))
            }
            _ => Err(Error::Invalid(format!("unknown tunable {key}"))),
        }
    }
}
