//! The /dev/fuse transport: a request is one read() of the device, its reply
//! one writev(), or for a READ one splice() from a pipe holding the image's
//! pages (`SplicedReplies`). Each worker thread reads its own clone of the
//! session's descriptor (FUSE_DEV_IOC_CLONE), so the kernel hands requests to
//! whichever worker is waiting and no lock is shared between them.

use super::abi::{put_out_header, OUT_HEADER_LEN};
use super::server::ReadReplier;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use uext4::{ReadPiece, ReadPlan};

/// `_IOR(229, 0, uint32_t)`: attach a new /dev/fuse descriptor to a session.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

pub struct Device {
    fd: OwnedFd,
}

/// What a read of the device brought.
pub enum Received {
    /// A request of this many bytes is in the buffer.
    Request(usize),
    /// The session is over (unmounted or aborted).
    Ended,
}

impl Device {
    pub fn new(fd: OwnedFd) -> Device {
        Device { fd }
    }

    pub fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Another descriptor of the same open device (dup), for notifications.
    pub fn duplicate(&self) -> io::Result<Device> {
        Ok(Device { fd: self.fd.try_clone()? })
    }

    /// A second descriptor on the same session, for another worker thread.
    pub fn clone_session(&self) -> io::Result<Device> {
        // SAFETY: opening a path with flags; the result is checked.
        let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just opened and is owned here alone.
        let clone = unsafe { OwnedFd::from_raw_fd(fd) };
        let session = self.raw() as u32;
        // SAFETY: the ioctl reads one u32 (the session's descriptor) from the pointer.
        if unsafe { libc::ioctl(clone.as_raw_fd(), FUSE_DEV_IOC_CLONE, &session) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Device { fd: clone })
    }

    /// Waits for the next request.
    pub fn receive(&self, buf: &mut [u8]) -> io::Result<Received> {
        loop {
            // SAFETY: reads into a buffer we own, bounded by its length.
            let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(if n == 0 { Received::Ended } else { Received::Request(n as usize) });
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Interrupted, or the request was withdrawn before we read it.
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                Some(libc::ENODEV) | Some(libc::ECONNABORTED) => return Ok(Received::Ended),
                _ => return Err(e),
            }
        }
    }

    /// Writes one reply. A reply to a request the kernel has meanwhile
    /// withdrawn (interrupted) is refused with ENOENT, which is not an error here.
    pub fn send(&self, parts: &[IoSlice]) -> io::Result<()> {
        // SAFETY: IoSlice is ABI-compatible with struct iovec; the slices outlive the call.
        let n = unsafe { libc::writev(self.raw(), parts.as_ptr().cast(), parts.len() as i32) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENODEV) => Ok(()),
            _ => Err(e),
        }
    }
}

/// READ replies by splice: the reply's header is written into a pipe, the
/// file's bytes are spliced into it from the image (references to the host's
/// page cache, not copies), and the pipe is spliced into /dev/fuse, where the
/// kernel copies the bytes into the reader's pages. One copy of the data where
/// pread and writev make two.
///
/// The pipe never blocks (O_NONBLOCK both ends): a read that needs more pipe
/// slots than it has goes by copy instead, and a pipe left holding anything
/// after a failure is emptied before the next reply.
pub struct SplicedReplies {
    device: Device,
    read_end: OwnedFd,
    write_end: OwnedFd,
    /// Page-sized buffers the pipe holds.
    slots: usize,
}

/// The pipe sizes tried, largest first: 2 MiB holds a 1 MiB read and its
/// header; 1 MiB is /proc/sys/fs/pipe-max-size's default, the most a process
/// without CAP_SYS_RESOURCE may have (reads are then capped to fit, with the
/// mount's max_read).
const PIPE_BYTES: [i32; 2] = [2 << 20, 1 << 20];
const PAGE: usize = 4096;
static ZERO_PAGE: [u8; PAGE] = [0; PAGE];

/// A non-blocking pipe as large as this process may make it, and how many
/// page-sized buffers it holds.
fn reply_pipe() -> io::Result<(OwnedFd, OwnedFd, usize)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, owned below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are owned here alone.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    for bytes in PIPE_BYTES {
        // SAFETY: fcntl on a descriptor we own; a failure leaves the size as it was.
        if unsafe { libc::fcntl(write_end.as_raw_fd(), libc::F_SETPIPE_SZ, bytes) } >= 0 {
            break;
        }
    }
    // SAFETY: as above.
    let bytes = unsafe { libc::fcntl(write_end.as_raw_fd(), libc::F_GETPIPE_SZ) };
    if bytes < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((read_end, write_end, bytes as usize / PAGE))
}

/// The largest read a spliced reply carries whole (all but one of the pipe's
/// buffers, which holds the header), at most `limit`; `None` when this
/// process's pipes are too small for splicing to pay (under 256 KiB).
pub fn spliced_read_max(limit: u32) -> Option<u32> {
    let (_, _, slots) = reply_pipe().ok()?;
    let bytes = (slots.saturating_sub(1) * PAGE).min(limit as usize);
    (bytes >= 256 << 10).then_some(bytes as u32)
}

impl SplicedReplies {
    /// A pipe for `device`'s replies.
    ///
    /// # Errors
    /// The pipe cannot be made.
    pub fn new(device: &Device) -> io::Result<SplicedReplies> {
        let (read_end, write_end, slots) = reply_pipe()?;
        Ok(SplicedReplies { device: device.duplicate()?, read_end, write_end, slots })
    }

    /// Pipe slots the reply takes at most: one for the header, and each piece
    /// the pages it spans (a spliced piece keeps the file's page boundaries; a
    /// write fills fresh slots a page at a time, or tops up the last one).
    fn slots_needed(plan: &ReadPlan) -> usize {
        1 + plan
            .pieces()
            .iter()
            .map(|piece| match piece {
                ReadPiece::Host(range, n) => (range.offset as usize % PAGE + n).div_ceil(PAGE),
                ReadPiece::Zeros(n) => n.div_ceil(PAGE),
                ReadPiece::Bytes(bytes) => bytes.len().div_ceil(PAGE),
            })
            .sum::<usize>()
    }

    fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            // SAFETY: writes from a slice we hold, bounded by its length.
            let n = unsafe { libc::write(self.write_end.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            bytes = &bytes[n as usize..];
        }
        Ok(())
    }

    /// Moves `len` bytes at `offset` of `file` into the pipe, by reference.
    fn splice_in(&self, file: i32, offset: u64, len: usize) -> io::Result<()> {
        let mut at = offset as libc::loff_t;
        let mut left = len;
        while left > 0 {
            // SAFETY: splice between a file we borrow and our pipe; `at` is ours.
            let n = unsafe {
                libc::splice(
                    file,
                    &mut at,
                    self.write_end.as_raw_fd(),
                    std::ptr::null_mut(),
                    left,
                    libc::SPLICE_F_NONBLOCK,
                )
            };
            match n {
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the image ended inside a read")),
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                n => left -= n as usize,
            }
        }
        Ok(())
    }

    fn fill(&self, header: &[u8], plan: &ReadPlan) -> io::Result<()> {
        self.write_all(header)?;
        for piece in plan.pieces() {
            match piece {
                ReadPiece::Host(range, n) => self.splice_in(range.file.as_raw_fd(), range.offset, *n)?,
                ReadPiece::Bytes(bytes) => self.write_all(bytes)?,
                ReadPiece::Zeros(n) => {
                    let mut left = *n;
                    while left > 0 {
                        let chunk = left.min(PAGE);
                        self.write_all(&ZERO_PAGE[..chunk])?;
                        left -= chunk;
                    }
                }
            }
        }
        Ok(())
    }

    /// Empties the pipe after a reply that did not leave it empty.
    fn drain(&self) {
        let mut scratch = [0u8; PAGE];
        loop {
            // SAFETY: reads into a buffer we own, bounded by its length.
            let n = unsafe { libc::read(self.read_end.as_raw_fd(), scratch.as_mut_ptr().cast(), scratch.len()) };
            // Until it reads empty (EAGAIN: the pipe never blocks).
            let interrupted = n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted;
            if n <= 0 && !interrupted {
                return;
            }
        }
    }

    fn pipe_is_empty(&self) -> bool {
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int.
        let r = unsafe { libc::ioctl(self.read_end.as_raw_fd(), libc::FIONREAD, &mut queued) };
        r == 0 && queued == 0
    }
}

impl ReadReplier for SplicedReplies {
    fn reply_from_plan(&mut self, unique: u64, plan: &ReadPlan) -> io::Result<bool> {
        if Self::slots_needed(plan) > self.slots {
            return Ok(false);
        }
        let total = OUT_HEADER_LEN + plan.len();
        let mut header = [0u8; OUT_HEADER_LEN];
        put_out_header(&mut header, total as u32, 0, unique);
        if let Err(e) = self.fill(&header, plan) {
            self.drain();
            return Err(e);
        }
        // SAFETY: splice from our pipe into the device; no offsets.
        let n = unsafe {
            libc::splice(
                self.read_end.as_raw_fd(),
                std::ptr::null_mut(),
                self.device.raw(),
                std::ptr::null_mut(),
                total,
                0,
            )
        };
        let sent = if n >= 0 {
            Ok(true)
        } else {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Withdrawn (interrupted) or the session is over: as `send`.
                Some(libc::ENOENT) | Some(libc::ENODEV) => Ok(true),
                _ => Err(e),
            }
        };
        if !self.pipe_is_empty() {
            self.drain();
        }
        sent
    }
}
