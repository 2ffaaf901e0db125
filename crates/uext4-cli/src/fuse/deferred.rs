//! Requests that wait on the journal, served off the transports' threads.
//!
//! An fsync waits for a commit: two device flushes, tens of milliseconds on a
//! disk. Served in place it would hold a /dev/fuse worker, or worse, the one
//! io_uring queue thread of a CPU, and every other caller's request would queue
//! behind it — four fsyncing processes stalled a whole mount. So the transports
//! hand such requests here: a small pool of threads, grown on demand up to
//! `MAX_THREADS`, serves them with `Uext4Fuse::serve` (panics contained as for
//! any request) and sends each reply the way its request came. A /dev/fuse
//! reply is one write on the session; an io_uring reply must go through the
//! ring of the queue that holds the request's entry, so it is posted to that
//! queue (`RingMailbox`) and the queue's thread, woken through an eventfd it
//! keeps a read pending on, commits it.
//!
//! Invariant: each deferred request gets exactly one reply, and the transports
//! never touch a request's entry between handing it here and its reply coming
//! back.

use super::abi::{self, InHeader, Op, Payload};
use super::channel::Device;
use super::server::Uext4Fuse;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

/// Threads the pool grows to; beyond that, deferred requests queue (they all
/// wait for commits, which serve many of them at once).
const MAX_THREADS: usize = 32;
/// An idle pool thread ends after this long.
const IDLE_EXIT: Duration = Duration::from_secs(5);

/// Whether a request may wait long on the journal and is served by the pool.
pub fn defers(opcode: u32) -> bool {
    matches!(opcode, abi::FUSE_FSYNC | abi::FUSE_FSYNCDIR)
}

/// Where a deferred request's reply goes.
pub enum ReplyTo {
    /// A write on the descriptor the request was read from (the /dev/fuse
    /// transport): each cloned descriptor keeps its own list of requests in
    /// progress, and a reply written to another one is refused (ENOENT).
    Device(Arc<Device>),
    /// Back to the io_uring queue holding the request's entry `tag`.
    Ring { mailbox: Arc<RingMailbox>, tag: usize },
}

struct Job {
    header: InHeader,
    reply: ReplyTo,
}

struct Queue {
    jobs: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

pub struct Deferred {
    server: Arc<Uext4Fuse>,
    queue: Mutex<Queue>,
    more: Condvar,
}

impl Deferred {
    pub fn new(server: Arc<Uext4Fuse>) -> Arc<Deferred> {
        Arc::new(Deferred {
            server,
            queue: Mutex::new(Queue { jobs: VecDeque::new(), threads: 0, idle: 0 }),
            more: Condvar::new(),
        })
    }

    /// Takes `header`'s request (one `defers` accepts); its reply goes to `reply`.
    pub fn submit(self: &Arc<Self>, header: InHeader, reply: ReplyTo) {
        let mut q = self.queue.lock();
        q.jobs.push_back(Job { header, reply });
        if q.idle > 0 {
            self.more.notify_one();
            return;
        }
        if q.threads < MAX_THREADS {
            let pool = self.clone();
            let spawned = std::thread::Builder::new().name("uext4-fsync".into()).spawn(move || pool.work());
            match spawned {
                Ok(_) => q.threads += 1,
                Err(e) if q.threads == 0 => {
                    // No thread to serve it: serve it here rather than never.
                    let job = q.jobs.pop_back().expect("just pushed");
                    drop(q);
                    self.server.log(&format!("starting an fsync thread: {e}; serving in place"));
                    self.serve(job);
                }
                Err(_) => {}
            }
        }
    }

    fn work(self: Arc<Self>) {
        let mut q = self.queue.lock();
        loop {
            if let Some(job) = q.jobs.pop_front() {
                drop(q);
                self.serve(job);
                q = self.queue.lock();
                continue;
            }
            q.idle += 1;
            let timed_out = self.more.wait_for(&mut q, IDLE_EXIT).timed_out();
            q.idle -= 1;
            if timed_out && q.jobs.is_empty() {
                q.threads -= 1;
                return;
            }
        }
    }

    fn serve(&self, job: Job) {
        let h = job.header;
        let mut none = [0u8; 0];
        let mut payload = Payload::new(&mut none);
        let error = match Op::parse(h.opcode, &[0u8; 16], &[]) {
            Ok(op) => self.server.serve(&h, op, &mut payload, None).unwrap_or(0),
            Err(_) => libc::EINVAL,
        };
        match job.reply {
            ReplyTo::Device(device) => {
                let mut header = [0u8; abi::OUT_HEADER_LEN];
                abi::put_out_header(&mut header, abi::OUT_HEADER_LEN as u32, -error, h.unique);
                if let Err(e) = device.send(&[IoSlice::new(&header)]) {
                    self.server.log(&format!("replying to fsync request {}: {e}", h.unique));
                }
            }
            ReplyTo::Ring { mailbox, tag } => mailbox.post(tag, h, error),
        }
    }
}

/// Replies the pool made for one io_uring queue, and the eventfd that wakes it.
pub struct RingMailbox {
    done: Mutex<Vec<(usize, InHeader, i32)>>,
    event: OwnedFd,
}

impl RingMailbox {
    pub fn new() -> io::Result<RingMailbox> {
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned here alone.
        Ok(RingMailbox { done: Mutex::new(Vec::new()), event: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// The eventfd the queue keeps a read pending on.
    pub fn event_fd(&self) -> i32 {
        self.event.as_raw_fd()
    }

    fn post(&self, tag: usize, header: InHeader, error: i32) {
        self.done.lock().push((tag, header, error));
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a local array to our eventfd. It cannot
        // fail short of the counter overflowing, which 2^64 posts never reach.
        unsafe { libc::write(self.event.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// The replies posted since the last call: (entry tag, request header, errno).
    pub fn take(&self) -> Vec<(usize, InHeader, i32)> {
        std::mem::take(&mut *self.done.lock())
    }
}
