//! A minimal io_uring: just what FUSE's ring needs, 128-byte submission
//! entries carrying IORING_OP_URING_CMD and 16-byte completions.
//!
//! The kernel shares three regions with us (include/uapi/linux/io_uring.h):
//! the submission ring (head, tail, mask and an index array), the submission
//! entries themselves, and the completion ring (head, tail, mask, entries).
//! We own the submission tail and the completion head; the kernel owns the
//! other two. Tails are published with release stores and heads read with
//! acquire loads, so an entry is whole before the other side sees it. One
//! thread owns a ring; nothing here is shared.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const IORING_SETUP_SQE128: u32 = 1 << 10;
const IORING_FEAT_SINGLE_MMAP: u32 = 1 << 0;
const IORING_FEAT_EXT_ARG: u32 = 1 << 8;
const IORING_OFF_SQ_RING: i64 = 0;
const IORING_OFF_CQ_RING: i64 = 0x800_0000;
const IORING_OFF_SQES: i64 = 0x1000_0000;
const IORING_ENTER_GETEVENTS: u32 = 1 << 0;
const IORING_ENTER_EXT_ARG: u32 = 1 << 3;
pub const IORING_OP_URING_CMD: u8 = 46;
pub const IORING_OP_READ: u8 = 22;
pub const SQE_LEN: usize = 128;

/// `struct io_uring_params` (120 bytes); the offsets the kernel fills in are
/// read from it by position.
#[repr(C)]
#[derive(Default)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    /// io_sqring_offsets: head, tail, ring_mask, ring_entries, flags, dropped, array, resv1, user_addr (u64).
    sq_off: [u32; 10],
    /// io_cqring_offsets: head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1, user_addr (u64).
    cq_off: [u32; 10],
}

/// `struct io_uring_getevents_arg`: a timeout for the wait.
#[repr(C)]
struct GeteventsArg {
    sigmask: u64,
    sigmask_sz: u32,
    min_wait_usec: u32,
    ts: u64,
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

/// One mmap'd region, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(fd: i32, len: usize, offset: i64) -> io::Result<Mapping> {
        // SAFETY: a shared mapping of the ring fd at an offset the kernel defines.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: NonNull::new(ptr.cast()).expect("mmap returned null"), len })
    }

    /// A field of the region: a u32 the two sides update concurrently.
    fn atomic(&self, offset: u32) -> &AtomicU32 {
        assert!(offset as usize + 4 <= self.len);
        // SAFETY: in bounds (checked), 4-byte aligned by the kernel's layout, and
        // alive as long as self.
        unsafe { &*(self.ptr.as_ptr().add(offset as usize) as *const AtomicU32) }
    }

    fn at(&self, offset: usize) -> *mut u8 {
        assert!(offset <= self.len);
        // SAFETY: in bounds (checked).
        unsafe { self.ptr.as_ptr().add(offset) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the region was mapped with this length and is no longer used.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A completion: the submission's user data and its result (negative errno).
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    pub user_data: u64,
    pub res: i32,
}

pub struct Ring {
    fd: OwnedFd,
    sq_ring: Mapping,
    cq_ring: Option<Mapping>,
    sqes: Mapping,
    sq_entries: u32,
    sq: [u32; 10],
    cq: [u32; 10],
    /// Entries written since the last enter.
    pending: u32,
    has_ext_arg: bool,
}

impl Ring {
    /// A ring of `entries` 128-byte submission slots.
    pub fn new(entries: u32) -> io::Result<Ring> {
        let mut p = Params { flags: IORING_SETUP_SQE128, ..Params::default() };
        // SAFETY: io_uring_setup fills the params struct we pass.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, entries, &mut p as *mut Params) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor owned here alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let sq_len = p.sq_off[6] as usize + p.sq_entries as usize * 4;
        let cq_len = p.cq_off[5] as usize + p.cq_entries as usize * 16;
        let single = p.features & IORING_FEAT_SINGLE_MMAP != 0;
        let sq_ring =
            Mapping::new(fd.as_raw_fd(), if single { sq_len.max(cq_len) } else { sq_len }, IORING_OFF_SQ_RING)?;
        let cq_ring = if single { None } else { Some(Mapping::new(fd.as_raw_fd(), cq_len, IORING_OFF_CQ_RING)?) };
        let sqes = Mapping::new(fd.as_raw_fd(), p.sq_entries as usize * SQE_LEN, IORING_OFF_SQES)?;
        Ok(Ring {
            fd,
            sq_ring,
            cq_ring,
            sqes,
            sq_entries: p.sq_entries,
            sq: p.sq_off,
            cq: p.cq_off,
            pending: 0,
            has_ext_arg: p.features & IORING_FEAT_EXT_ARG != 0,
        })
    }

    fn cq_region(&self) -> &Mapping {
        self.cq_ring.as_ref().unwrap_or(&self.sq_ring)
    }

    /// Queues one submission entry (128 bytes, as built by the caller); it
    /// reaches the kernel at the next `submit_and_wait`.
    pub fn push(&mut self, sqe: &[u8; SQE_LEN]) -> io::Result<()> {
        let head = self.sq_ring.atomic(self.sq[0]).load(Ordering::Acquire);
        let tail = self.sq_ring.atomic(self.sq[1]).load(Ordering::Relaxed);
        if tail.wrapping_sub(head) >= self.sq_entries {
            // Full: hand what we have to the kernel first.
            self.enter(0, None)?;
        }
        let mask = self.sq_ring.atomic(self.sq[2]).load(Ordering::Relaxed);
        let slot = tail & mask;
        // SAFETY: slot < sq_entries, so the entry and the index lie inside their
        // regions; the kernel does not read them until the tail moves past them.
        unsafe {
            std::ptr::copy_nonoverlapping(sqe.as_ptr(), self.sqes.at(slot as usize * SQE_LEN), SQE_LEN);
            (self.sq_ring.at(self.sq[6] as usize + slot as usize * 4) as *mut u32).write(slot);
        }
        self.sq_ring.atomic(self.sq[1]).store(tail.wrapping_add(1), Ordering::Release);
        self.pending += 1;
        Ok(())
    }

    fn enter(&mut self, min_complete: u32, timeout: Option<Duration>) -> io::Result<()> {
        let mut flags = if min_complete > 0 { IORING_ENTER_GETEVENTS } else { 0 };
        let ts = timeout.map(|t| Timespec { tv_sec: t.as_secs() as i64, tv_nsec: t.subsec_nanos() as i64 });
        let arg = ts.as_ref().filter(|_| self.has_ext_arg).map(|ts| GeteventsArg {
            sigmask: 0,
            sigmask_sz: 0,
            min_wait_usec: 0,
            ts: ts as *const Timespec as u64,
        });
        let (argp, argsz) = match &arg {
            Some(a) => {
                flags |= IORING_ENTER_EXT_ARG;
                (a as *const GeteventsArg as usize, std::mem::size_of::<GeteventsArg>())
            }
            None => (0, 0),
        };
        // SAFETY: io_uring_enter on our ring; the optional argument struct and
        // the timespec it points to outlive the call.
        let r = unsafe {
            libc::syscall(libc::SYS_io_uring_enter, self.fd.as_raw_fd(), self.pending, min_complete, flags, argp, argsz)
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                // Woken by a signal, or the wait ran out: the caller looks again.
                Some(libc::EINTR) | Some(libc::ETIME) => Ok(()),
                _ => Err(e),
            };
        }
        self.pending = self.pending.saturating_sub(r as u32);
        Ok(())
    }

    /// Hands what was pushed to the kernel without waiting.
    pub fn submit(&mut self) -> io::Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        self.enter(0, None)
    }

    /// Submits what was pushed and waits until at least one completion is
    /// there or `timeout` has passed.
    pub fn submit_and_wait(&mut self, timeout: Duration) -> io::Result<()> {
        if self.peek().is_some() {
            return if self.pending > 0 { self.enter(0, None) } else { Ok(()) };
        }
        self.enter(1, Some(timeout))
    }

    fn peek(&self) -> Option<Completion> {
        let cq = self.cq_region();
        let head = cq.atomic(self.cq[0]).load(Ordering::Relaxed);
        let tail = cq.atomic(self.cq[1]).load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let mask = cq.atomic(self.cq[2]).load(Ordering::Relaxed);
        let at = self.cq[5] as usize + (head & mask) as usize * 16;
        // SAFETY: the entry at head is complete (the tail was read with acquire)
        // and lies inside the completion region.
        unsafe {
            let p = cq.at(at);
            Some(Completion {
                user_data: (p as *const u64).read_unaligned(),
                res: (p.add(8) as *const i32).read_unaligned(),
            })
        }
    }

    /// The next completion, if one is there.
    pub fn next_completion(&mut self) -> Option<Completion> {
        let c = self.peek()?;
        let cq = self.cq_region();
        let head = cq.atomic(self.cq[0]).load(Ordering::Relaxed);
        cq.atomic(self.cq[0]).store(head.wrapping_add(1), Ordering::Release);
        Some(c)
    }
}

/// A 128-byte IORING_OP_URING_CMD entry on `fd`: `cmd_op`, an address and
/// length the command defines, the caller's tag, and up to 80 bytes of command.
pub fn uring_cmd(fd: i32, cmd_op: u32, addr: u64, len: u32, user_data: u64, cmd: &[u8]) -> [u8; SQE_LEN] {
    let mut sqe = [0u8; SQE_LEN];
    sqe[0] = IORING_OP_URING_CMD;
    sqe[4..8].copy_from_slice(&fd.to_ne_bytes());
    sqe[8..12].copy_from_slice(&cmd_op.to_ne_bytes());
    sqe[16..24].copy_from_slice(&addr.to_ne_bytes());
    sqe[24..28].copy_from_slice(&len.to_ne_bytes());
    sqe[32..40].copy_from_slice(&user_data.to_ne_bytes());
    sqe[48..48 + cmd.len()].copy_from_slice(cmd);
    sqe
}

/// A 128-byte IORING_OP_READ entry: `len` bytes from `fd` at its current
/// position (offset -1: eventfds and pipes have none) into `addr`.
pub fn read(fd: i32, addr: u64, len: u32, user_data: u64) -> [u8; SQE_LEN] {
    let mut sqe = [0u8; SQE_LEN];
    sqe[0] = IORING_OP_READ;
    sqe[4..8].copy_from_slice(&fd.to_ne_bytes());
    sqe[8..16].copy_from_slice(&u64::MAX.to_ne_bytes());
    sqe[16..24].copy_from_slice(&addr.to_ne_bytes());
    sqe[24..28].copy_from_slice(&len.to_ne_bytes());
    sqe[32..40].copy_from_slice(&user_data.to_ne_bytes());
    sqe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_struct_has_the_kernels_size() {
        assert_eq!(std::mem::size_of::<Params>(), 120);
        assert_eq!(std::mem::size_of::<GeteventsArg>(), 24);
    }

    /// A NOP through a real ring: submission reaches the kernel and its
    /// completion comes back with our tag.
    #[test]
    fn a_nop_completes_with_its_tag() {
        let mut ring = match Ring::new(4) {
            Ok(ring) => ring,
            Err(e) => {
                let required = std::env::var("UEXT4_REQUIRE_ORACLES").as_deref() == Ok("1");
                assert!(!required, "UEXT4_REQUIRE_ORACLES=1 but io_uring is not available: {e}");
                eprintln!("SKIPPED: io_uring is not available here: {e}");
                return;
            }
        };
        let mut sqe = [0u8; SQE_LEN];
        sqe[0] = 0; // IORING_OP_NOP
        sqe[32..40].copy_from_slice(&0xfeedu64.to_ne_bytes());
        for _ in 0..10 {
            ring.push(&sqe).unwrap();
            ring.submit_and_wait(Duration::from_secs(1)).unwrap();
            let c = ring.next_completion().expect("a completion");
            assert_eq!((c.user_data, c.res), (0xfeed, 0));
            assert!(ring.next_completion().is_none());
        }
    }

    /// A read of an eventfd completes when another thread writes it: how a
    /// queue thread learns that the fsync pool posted a reply.
    #[test]
    fn an_eventfd_read_completes_when_written() {
        let Ok(mut ring) = Ring::new(4) else {
            assert!(std::env::var("UEXT4_REQUIRE_ORACLES").as_deref() != Ok("1"), "io_uring is not available");
            eprintln!("SKIPPED: io_uring is not available here");
            return;
        };
        // SAFETY: eventfd takes no pointers; checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        let mut buf = [0u8; 8];
        ring.push(&read(fd, buf.as_mut_ptr() as u64, 8, 7)).unwrap();
        ring.submit_and_wait(Duration::from_millis(50)).unwrap();
        assert!(ring.next_completion().is_none(), "nothing written yet");
        let writer = std::thread::spawn(move || {
            let three = 3u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a local array to the eventfd.
            unsafe { libc::write(fd, three.as_ptr().cast(), 8) };
        });
        let mut got = None;
        for _ in 0..100 {
            ring.submit_and_wait(Duration::from_millis(100)).unwrap();
            got = ring.next_completion();
            if got.is_some() {
                break;
            }
        }
        writer.join().unwrap();
        let c = got.expect("the read completed");
        assert_eq!((c.user_data, c.res, u64::from_ne_bytes(buf)), (7, 8, 3));
        // SAFETY: fd is ours and no longer used.
        unsafe { libc::close(fd) };
    }
}
