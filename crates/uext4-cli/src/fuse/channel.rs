//! The /dev/fuse transport: a request is one read() of the device, its reply
//! one writev(). Each worker thread reads its own clone of the session's
//! descriptor (FUSE_DEV_IOC_CLONE), so the kernel hands requests to whichever
//! worker is waiting and no lock is shared between them.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
