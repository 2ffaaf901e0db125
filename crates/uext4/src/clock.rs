//! Wall-clock seconds for superblock stamps, read as the kernel reads them.
//!
//! The kernel stamps s_wtime from its coarse clock (ktime_get_real_seconds), and
//! glibc's time(), which e2fsck compares s_wtime with, reads that same coarse
//! clock. The precise clock runs up to a scheduler tick ahead of it, so a stamp
//! taken from the precise clock just after a second turns over would be a second
//! ahead of an e2fsck started a moment later ("last write time is in the future").

//!
//! A fixed time (`set_fixed_time`, what the CLI sets from SOURCE_DATE_EPOCH)
//! replaces both clocks for the whole process, as libext2fs's reading of
//! SOURCE_DATE_EPOCH does for e2fsprogs: every time the library stamps (inode
//! times, superblock and journal times, mkfs's) is then that second, so two
//! runs of the same work write the same bytes.

use std::sync::atomic::{AtomicI64, Ordering};

/// The fixed time in seconds, or `NOT_FIXED`.
static FIXED: AtomicI64 = AtomicI64::new(NOT_FIXED);
const NOT_FIXED: i64 = i64::MIN;

/// Makes every time the library stamps from now on `seconds` (None: the wall
/// clock again). Process-wide: every open filesystem sees it.
///
/// ```
/// uext4::clock::set_fixed_time(Some(1_700_000_000));
/// assert_eq!(uext4::clock::precise(), (1_700_000_000, 0));
/// uext4::clock::set_fixed_time(None);
/// ```
pub fn set_fixed_time(seconds: Option<i64>) {
    FIXED.store(seconds.filter(|&s| s != NOT_FIXED).unwrap_or(NOT_FIXED), Ordering::Relaxed);
}

/// The time `set_fixed_time` fixed, if any.
pub fn fixed_time() -> Option<i64> {
    Some(FIXED.load(Ordering::Relaxed)).filter(|&s| s != NOT_FIXED)
}

/// Seconds and nanoseconds since the epoch from the precise clock, or the
/// fixed time.
pub fn precise() -> (i64, u32) {
    if let Some(fixed) = fixed_time() {
        return (fixed, 0);
    }
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

/// Seconds and nanoseconds from CLOCK_REALTIME_COARSE, which moves once per
/// scheduler tick (the precise clock if it cannot be read), or the fixed time:
/// what the kernel's `current_time` stamps a directory with when names in it
/// change.
pub fn coarse() -> (i64, u32) {
    if let Some(fixed) = fixed_time() {
        return (fixed, 0);
    }
    match read_coarse() {
        Some(ts) => (ts.tv_sec, ts.tv_nsec as u32),
        None => precise(),
    }
}

/// Seconds since the epoch from CLOCK_REALTIME_COARSE (0 if the clock cannot be
/// read), or the fixed time (0 if it is before the epoch).
pub fn coarse_seconds() -> u64 {
    if let Some(fixed) = fixed_time() {
        return u64::try_from(fixed).unwrap_or(0);
    }
    read_coarse().map_or(0, |ts| u64::try_from(ts.tv_sec).unwrap_or(0))
}

/// CLOCK_REALTIME_COARSE, if it can be read.
fn read_coarse() -> Option<libc::timespec> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    (unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0).then_some(ts)
}

#[cfg(test)]
mod tests {
    #[test]
    fn coarse_seconds_never_run_ahead_of_time() {
        for _ in 0..10_000 {
            let ours = super::coarse_seconds();
            // SAFETY: time(NULL) has no preconditions.
            let theirs = unsafe { libc::time(std::ptr::null_mut()) } as u64;
            assert!(ours <= theirs, "coarse {ours} is ahead of time() {theirs}");
        }
    }
}
