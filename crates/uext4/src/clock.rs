//! Wall-clock seconds for superblock stamps, read as the kernel reads them.
//!
//! The kernel stamps s_wtime from its coarse clock (ktime_get_real_seconds), and
//! glibc's time(), which e2fsck compares s_wtime with, reads that same coarse
//! clock. The precise clock runs up to a scheduler tick ahead of it, so a stamp
//! taken from the precise clock just after a second turns over would be a second
//! ahead of an e2fsck started a moment later ("last write time is in the future").

/// Seconds since the epoch from CLOCK_REALTIME_COARSE (0 if the clock cannot be read).
pub fn coarse_seconds() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0)
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
