//! uext4's FUSE session: the wire format (`abi`), the filesystem that answers
//! requests (`server`), and two ways requests travel: read and written through
//! /dev/fuse by a pool of worker threads (`channel`), or through an io_uring
//! queue per CPU (`uring`, over the minimal ring of `ring`).
//!
//! A session starts with the INIT handshake on /dev/fuse, where the server and
//! the kernel agree on a protocol version, on what each will do, and on
//! whether requests go through the ring. It ends when the kernel says the
//! mount is gone (the device reads ENODEV); then the server lets go of every
//! inode the kernel held and writes everything back.

pub mod abi;
pub mod channel;
pub mod deferred;
pub mod ring;
pub mod server;
pub mod uring;

use abi::{InHeader, Op, Payload};
use channel::{Device, Received, SplicedReplies};
use deferred::{Deferred, ReplyTo};
use server::{ReadReplier, Uext4Fuse};
use std::io::{self, IoSlice};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use server::{REMOVE_TREE_XATTR, TUNABLES_XATTR, TUNE_XATTR};

/// The largest write (and read) the kernel sends in one request: 256 pages.
pub const MAX_WRITE: u32 = 1 << 20;
/// Background requests (readahead, releases) the kernel keeps in flight.
const MAX_BACKGROUND: u16 = 64;
/// A request buffer: the largest write plus its header and arguments.
const REQUEST_BUFFER: usize = MAX_WRITE as usize + 4096;

/// Whether requests should travel through io_uring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UringMode {
    /// Never.
    Off,
    /// When the kernel offers it (the fuse module's enable_uring is on).
    Auto,
    /// Always: the mount fails if the kernel cannot.
    On,
}

pub struct SessionConfig {
    /// /dev/fuse worker threads.
    pub threads: usize,
    pub uring: UringMode,
    /// Ask for the kernel's write-back cache (FUSE_WRITEBACK_CACHE): writes
    /// land in the kernel's page cache and reach the server in page runs from
    /// its write-back, and the kernel keeps a regular file's size and mtime,
    /// sending them back with a SETATTR when it writes the inode.
    pub writeback_cache: bool,
    /// Send READ replies through /dev/fuse by splice from the image (one copy
    /// of the data instead of two); io_uring replies are always copied.
    pub splice_reads: bool,
    /// Ends the session from outside (aborts the connection), for failures
    /// that would otherwise leave requests waiting forever.
    pub abort: Arc<dyn Fn() + Send + Sync>,
}

/// The capabilities asked of the kernel (each only if the kernel offers it):
/// reads in parallel and readdirplus; lookups and creates in one directory at
/// once (the library's locks order them); POSIX ACLs checked by the kernel,
/// with the umask left to us (a default ACL replaces it);
/// 1 MiB requests; suid/sgid clearing left to us (HANDLE_KILLPRIV_V2),
/// which spares a getxattr before every write; and the write-back cache
/// when the mount asked for it.
fn wanted_flags(writeback_cache: bool) -> u64 {
    const FUSE_HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    let writeback = if writeback_cache { abi::FUSE_WRITEBACK_CACHE } else { 0 };
    writeback
        | abi::FUSE_ASYNC_READ
        | abi::FUSE_BIG_WRITES
        | abi::FUSE_DO_READDIRPLUS
        | abi::FUSE_READDIRPLUS_AUTO
        | abi::FUSE_PARALLEL_DIROPS
        | abi::FUSE_POSIX_ACL
        | abi::FUSE_DONT_MASK
        | abi::FUSE_MAX_PAGES
        | FUSE_HANDLE_KILLPRIV_V2
        | abi::FUSE_INIT_EXT
}

/// Answers the kernel's INIT on `dev`: agrees on the protocol and capabilities.
/// Returns the capabilities granted (FUSE_OVER_IO_URING among them when
/// requests will travel through io_uring).
fn handshake(dev: &Device, config: &SessionConfig) -> io::Result<u64> {
    let uring = config.uring;
    let mut buf = vec![0u8; REQUEST_BUFFER];
    loop {
        let n = match dev.receive(&mut buf)? {
            Received::Request(n) => n,
            Received::Ended => return Err(io::Error::other("the kernel ended the session before it started")),
        };
        let Some(h) = InHeader::parse(&buf[..n]) else { continue };
        let body = &buf[abi::IN_HEADER_LEN..n];
        let op = Op::parse(h.opcode, body, &[]);
        let Ok(Op::Init { major, minor, max_readahead, flags }) = op else {
            // Nothing but INIT is answered before INIT.
            reply(dev, &h, libc::EIO, &[])?;
            continue;
        };
        if major != abi::FUSE_KERNEL_VERSION || minor < abi::FUSE_MIN_MINOR_VERSION {
            reply(dev, &h, libc::EPROTO, &[])?;
            return Err(io::Error::other(format!(
                "the kernel speaks FUSE {major}.{minor}; uext4 needs 7.{} or newer",
                abi::FUSE_MIN_MINOR_VERSION
            )));
        }
        let mut granted = wanted_flags(config.writeback_cache) & flags;
        let use_uring = uring != UringMode::Off && flags & abi::FUSE_OVER_IO_URING != 0;
        if uring == UringMode::On && !use_uring {
            reply(dev, &h, libc::EPROTO, &[])?;
            return Err(io::Error::other(
                "io_uring=on, but the kernel does not offer FUSE over io_uring (Linux 6.14+ with \
                 /sys/module/fuse/parameters/enable_uring set to Y)",
            ));
        }
        if use_uring {
            granted |= abi::FUSE_OVER_IO_URING;
        }
        let minor = minor.min(abi::FUSE_KERNEL_MINOR_VERSION);
        let mut out = [0u8; abi::INIT_OUT_LEN];
        let mut p = Payload::new(&mut out);
        p.init_out(minor, max_readahead, granted, MAX_BACKGROUND, MAX_WRITE);
        reply(dev, &h, 0, &out)?;
        return Ok(granted);
    }
}

fn reply(dev: &Device, h: &InHeader, error: i32, payload: &[u8]) -> io::Result<()> {
    let mut header = [0u8; abi::OUT_HEADER_LEN];
    let payload = if error == 0 { payload } else { &[] };
    abi::put_out_header(&mut header, (abi::OUT_HEADER_LEN + payload.len()) as u32, -error, h.unique);
    dev.send(&[IoSlice::new(&header), IoSlice::new(payload)])
}

/// Serves requests read from `dev` until the session ends; those that wait on
/// the journal go to `deferred`, which replies in their place.
fn serve_device(server: &Uext4Fuse, dev: &Device, deferred: &Arc<Deferred>, splice_reads: bool) -> io::Result<()> {
    let mut request = vec![0u8; REQUEST_BUFFER];
    let mut out = vec![0u8; REQUEST_BUFFER];
    // Deferred replies must be written where their request was read.
    let replies = Arc::new(dev.duplicate()?);
    let mut spliced = match splice_reads {
        true => SplicedReplies::new(dev)
            .map_err(|e| server.log(&format!("no pipe for spliced reads ({e}); reads are copied")))
            .ok(),
        false => None,
    };
    loop {
        let n = match dev.receive(&mut request)? {
            Received::Request(n) => n,
            Received::Ended => return Ok(()),
        };
        let Some(h) = InHeader::parse(&request[..n]) else { continue };
        server.count(false);
        if deferred::defers(h.opcode) {
            deferred.submit(h, ReplyTo::Device(replies.clone()));
            continue;
        }
        let body = &request[abi::IN_HEADER_LEN..n.min(h.len as usize).max(abi::IN_HEADER_LEN)];
        let split = abi::fixed_args_len(h.opcode).min(body.len());
        let (fixed, rest) = body.split_at(split);
        let mut payload = Payload::new(&mut out[abi::OUT_HEADER_LEN..]);
        let answer = match Op::parse(h.opcode, fixed, rest) {
            Ok(op) => server.serve(&h, op, &mut payload, spliced.as_mut().map(|s| s as &mut dyn ReadReplier)),
            Err(e) => {
                server.log(&format!("malformed request (opcode {}): {}", h.opcode, e.0));
                Some(libc::EINVAL)
            }
        };
        let Some(error) = answer else { continue };
        let len = if error == 0 { payload.len() } else { 0 };
        abi::put_out_header(&mut out, (abi::OUT_HEADER_LEN + len) as u32, -error, h.unique);
        dev.send(&[IoSlice::new(&out[..abi::OUT_HEADER_LEN + len])])?;
    }
}

/// Runs the session on `dev` (a /dev/fuse descriptor mounted by the caller):
/// `ready` is called once the handshake is done. Returns when unmounted, after
/// everything is written back: an error if the session or the write-back failed.
pub fn run(server: Arc<Uext4Fuse>, dev: OwnedFd, config: &SessionConfig, ready: impl FnOnce()) -> io::Result<()> {
    let dev = Device::new(dev);
    let granted = handshake(&dev, config)?;
    let use_uring = granted & abi::FUSE_OVER_IO_URING != 0;
    server.set_writeback_cache(granted & abi::FUSE_WRITEBACK_CACHE != 0);
    server.set_notifier(dev.duplicate()?);
    let deferred = Deferred::new(server.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let rings = if use_uring {
        let payload_len = MAX_WRITE as usize;
        uring::start(server.clone(), dev.raw(), payload_len, stop.clone(), config.abort.clone(), deferred.clone())?
    } else {
        Vec::new()
    };
    ready();
    let mut devices = Vec::with_capacity(config.threads);
    for _ in 1..config.threads.max(1) {
        devices.push(dev.clone_session()?);
    }
    // Requests are contained one by one (`Uext4Fuse::serve`); a panic in a
    // worker's own code ends that worker, and the others serve on until the
    // unmount, after which everything is written back all the same.
    let guarded = |server: &Uext4Fuse, d: &Device| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serve_device(server, d, &deferred, config.splice_reads)
        }))
        .unwrap_or_else(|_| Err(io::Error::other("a FUSE worker panicked")))
    };
    let result = std::thread::scope(|s| {
        let workers: Vec<_> = devices
            .iter()
            .map(|d| {
                let server = &*server;
                s.spawn(move || guarded(server, d))
            })
            .collect();
        let mut result = guarded(&server, &dev);
        for w in workers {
            let r = w.join().unwrap_or_else(|_| Err(io::Error::other("a FUSE worker panicked")));
            result = result.and(r);
        }
        result
    });
    stop.store(true, Ordering::Relaxed);
    for r in rings {
        let _ = r.join();
    }
    let written = server.destroy();
    result?;
    written.map_err(|e| io::Error::other(format!("writing back at unmount failed: {e}")))
}
